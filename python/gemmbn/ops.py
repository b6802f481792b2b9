"""The gemmbn custom operators (torch.library.custom_op), their fake implementations and autograd.

- ``gemmbn::linear_scale_bn_train``: forward with batch statistics (training, or eval without running
  statistics); updates running_mean/running_var/num_batches_tracked in place.
- ``gemmbn::linear_scale_bn_eval``: forward with the running statistics.
- ``gemmbn::linear_scale_bn_backward``: the gradients of either (backward.py), one operator per backward.

Each implementation decides once: the fused kernels where the device and build allow them and the native
operator accepts the arguments (it checks the layout itself and refuses before anything runs), else the
PyTorch reference, with a GemmBnFallbackWarning naming the reason (once per reason).

How calls reach them (``forward_train`` and ``forward_eval`` below):
- in eager mode, straight into the implementation functions: the dispatcher's Python layers around a custom op
  cost tens of microseconds per call, a sizable part of a fused forward;
- under torch.compile, where plan.static_reason (everything but data pointers) allows the fused path, the graph
  calls the native operators themselves (gemmbn::train_forward, ::split_weight, ::batch_norm_backward...), and a
  refusal at run time (a running buffer at an unaligned address) is an error; elsewhere these Python operators,
  opaque nodes with fakes, run the reference route.
Autograd: PyTorch refuses ``register_autograd`` on an operator that mutates its inputs ("Cannot
register autograd formula for non-functional operator"), so the gradients are attached by the
autograd.Functions below, which torch.compile traces (fullgraph included). The eval operator, which
mutates nothing, also registers its formula directly, so it is differentiable on its own. Both formulas
call the backward operator (compiled graphs) or its implementation (eager), which gives first-order
gradients only: a backward with create_graph=True raises.
"""

# No `from __future__ import annotations` here: custom_op infers the schema from real annotations.
from typing import Optional

import torch
from torch import Tensor

from . import backward, fused, plan, reference
from . import precision as precision_mod
from ._native import Refused, fused_unavailable_reason
from .fallback import warn_once


def _output_dtype(x: Tensor, scale: Tensor) -> torch.dtype:
    # y = linear(x) * scale promotes like PyTorch; batch_norm keeps its input's dtype.
    return torch.promote_types(x.dtype, scale.dtype)


def _requires_grad(*tensors: Optional[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _apply_eager(function, run, *args):
    """function.apply(run, *args) for a call in eager mode (never traced; args[0] is x): straight into autograd's C++
    apply where no functorch transform is active and x is no functorch wrapper. Function.apply's Python wrapper
    around it (a check for setup_context and a pass over the arguments unwrapping functorch's dead wrappers, which
    only a tensor made under a transform can be) costs ~3 us a training forward on a fast host, ~3x that on the
    H200's (perf/NOTES.md v29); the module's own parameters are never such wrappers, so x is the one argument checked."""
    if torch._C._are_functorch_transforms_active() or torch._C._functorch.is_functorch_wrapped_tensor(args[0]):
        return function.apply(run, *args)
    return _CPP_APPLY[function](run, *args)


# --- training (batch statistics) --------------------------------------------------------------


def _train_impl(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    scale: Tensor,
    gamma: Optional[Tensor],
    beta: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    num_batches_tracked: Optional[Tensor],
    momentum: Optional[float],
    eps: float,
    precision: str,
    keep_pre_norm: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, pre_norm, save_mean, save_invstd): out = (y - mean_m y)/sqrt(var_m y + eps) gamma + beta, y = (xW^T + b)s.

    Updates running_mean/var (if given) with ``momentum`` (None: 1/num_batches_tracked) and
    increments num_batches_tracked (if given). ``scale`` is a [N] vector. pre_norm is y when
    ``keep_pre_norm``, else empty; save_mean/save_invstd are float32 [N] (float64 for float64 data).
    ``precision``: "highest", "high", "medium" or "default" (torch.get_float32_matmul_precision()).
    """
    precision = precision_mod.normalize(precision)
    reference.check_batch_size(x.shape[0], weight.shape[0])
    if x.shape[0] == 0:
        return _empty_batch_train(x, weight, scale, num_batches_tracked, keep_pre_norm)
    try:
        return _train_native(
            x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, momentum, eps,
            precision, keep_pre_norm,
        )  # fmt: skip
    except Refused as refusal:
        warn_once(refusal.reason)
    with precision_mod.float32_matmul_precision(precision):
        return reference.linear_scale_batch_norm(
            x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked,
            True, momentum, eps, keep_pre_norm=keep_pre_norm,
        )  # fmt: skip


def _empty_batch_train(x, weight, scale, num_batches_tracked, keep_pre_norm):
    """nn.BatchNorm1d on a batch of no rows: an empty output, the running statistics as they were, the batch
    counted. (The statistics returned for the backward are never read: its gradients are 0 or empty.)"""
    N = weight.shape[0]
    out = x.new_empty((0, N), dtype=_output_dtype(x, scale))
    if num_batches_tracked is not None:
        num_batches_tracked.add_(1)
    stats_dtype = reference.statistics_dtype(out.dtype)
    pre_norm = x.new_empty((0, N) if keep_pre_norm else (0,), dtype=out.dtype)
    return out, pre_norm, x.new_zeros(N, dtype=stats_dtype), x.new_ones(N, dtype=stats_dtype)


linear_scale_bn_train = torch.library.custom_op(
    "gemmbn::linear_scale_bn_train", _train_impl, mutates_args=("running_mean", "running_var", "num_batches_tracked")
)


@linear_scale_bn_train.register_fake
def _(x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked,
      momentum, eps, precision, keep_pre_norm):  # fmt: skip
    M, N = x.shape[0], weight.shape[0]
    dtype = _output_dtype(x, scale)
    stats_dtype = reference.statistics_dtype(dtype)
    out = x.new_empty((M, N), dtype=dtype)
    pre_norm = x.new_empty((M, N) if keep_pre_norm else (0,), dtype=dtype)
    return out, pre_norm, x.new_empty(N, dtype=stats_dtype), x.new_empty(N, dtype=stats_dtype)


def _run_train(*args) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The implementation in eager mode; traced (torch.compile), the native operator where the trace-time verdict
    allows (the graph then calls gemmbn::train_forward, and gemmbn::split_weight for "highest"), else the Python
    operator (the reference's route, or an empty batch) as one opaque node. Same arguments as _train_impl."""
    if not torch.compiler.is_compiling():
        return _train_impl(*args)
    x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, momentum, eps = args[:11]
    vectors = _vectors(bias, scale, gamma, beta, running_mean, running_var)
    if x.shape[0] == 0 or plan.static_reason(x, weight, vectors, eps, num_batches_tracked) is not None:
        return linear_scale_bn_train(*args)
    return _train_native(*args)


def _vectors(bias, scale, gamma, beta, running_mean=None, running_var=None) -> dict[str, Optional[Tensor]]:
    """The [N] tensors by name, as plan.static_reason takes them."""
    return {"bias": bias, "scale": scale, "gamma": gamma, "beta": beta, "running_mean": running_mean,
            "running_var": running_var}  # fmt: skip


# --- backward (either forward) ---------------------------------------------------------------


def _backward_impl(
    dout: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    scale: Tensor,
    gamma: Optional[Tensor],
    beta: Optional[Tensor],
    pre_norm: Tensor,
    mean: Tensor,
    invstd: Tensor,
    batch_statistics: bool,
    needs: list[bool],
    precision: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, dW, db, ds, dgamma, dbeta) of backward.linear_scale_bn_backward; an empty tensor where that gives None."""
    grads = backward.linear_scale_bn_backward(
        dout, x, weight, bias, scale, gamma, beta, pre_norm, mean, invstd, batch_statistics, needs, precision
    )
    return tuple(dout.new_empty(0) if grad is None else grad for grad in grads)


linear_scale_bn_backward = torch.library.custom_op("gemmbn::linear_scale_bn_backward", _backward_impl, mutates_args=())


def _grads_present(inputs, needs) -> list[bool]:
    """Which of (dx, dW, db, ds, dgamma, dbeta) the backward returns: asked for and the input not None."""
    return [bool(need) and t is not None for need, t in zip(needs, inputs)]


@linear_scale_bn_backward.register_fake
def _(dout, x, weight, bias, scale, gamma, beta, pre_norm, mean, invstd, batch_statistics, needs, precision):
    inputs = (x, weight, bias, scale, gamma, beta)
    return tuple(t.new_empty(t.shape) if present else dout.new_empty(0)
                 for t, present in zip(inputs, _grads_present(inputs, needs)))  # fmt: skip


def _run_backward(*args) -> tuple[Optional[Tensor], ...]:
    """The gradients (None where not returned): the implementation in eager mode, and traced where the forward took
    the native operators (backward.traced_natively); else the Python operator, one opaque node of the graph."""
    _refuse_double_backward()
    if not torch.compiler.is_compiling() or backward.traced_natively(*args[1:7], args[12]):
        return backward.linear_scale_bn_backward(*args)
    grads = linear_scale_bn_backward(*args)
    return tuple(g if present else None for g, present in zip(grads, _grads_present(args[1:7], args[11])))


def _refuse_double_backward() -> None:
    # The autograd engine runs a backward with grad mode on only for create_graph=True.
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError(
            "gemmbn: double backward (a backward with create_graph=True) is not supported; the fused layer "
            "gives first-order gradients of x, weight, bias, scale, gamma and beta"
        )


class _TrainFunction(torch.autograd.Function):
    """Autograd for the training forward (the operator itself cannot register a formula: it mutates). ``run``:
    _run_train, or _train_native (whose Refused then leaves apply with nothing recorded)."""

    @staticmethod
    def forward(ctx, run, *args):
        x, weight, bias, scale, gamma, beta = args[:6]
        out, pre_norm, save_mean, save_invstd = run(*args)
        ctx.save_for_backward(x, weight, bias, scale, gamma, beta, pre_norm, save_mean, save_invstd)
        ctx.precision = args[11]
        return out

    @staticmethod
    def backward(ctx, dout):
        saved = ctx.saved_tensors
        grads = _run_backward(dout, *saved, True, list(ctx.needs_input_grad[1:7]), ctx.precision)
        return (None, *grads, None, None, None, None, None, None, None)


def _train_native(*args) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The fused route alone, Refused propagating (the operator's refusal, the device's reason, or a batch of fewer
    than two rows, which nn.BatchNorm1d refuses): _train_impl's first try, the traced route, and the module's
    native-first call, whose arguments nothing validated before (the operator's checks are the validation; on
    Refused the caller validates and takes the usual route). Same arguments as _train_impl."""
    x = args[0]
    reason = fused_unavailable_reason(x)
    if reason is not None or x.shape[0] < 2:
        raise Refused(reason or "fewer than two rows")
    return fused.train_forward(*args[:11], precision_mod.resolve(x.dtype, args[11]), args[12])


def forward_train(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    scale: Tensor,
    gamma: Optional[Tensor],
    beta: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    num_batches_tracked: Optional[Tensor],
    momentum: Optional[float],
    eps: float,
    precision: str,
    native_first: bool = False,
) -> Tensor:
    """Differentiable out of linear_scale_bn_train (same arguments). y is kept for the backward only when a
    gradient other than beta's is needed (beta's is sum dout); otherwise the finish normalizes in place.
    ``native_first``: straight to the operator, raising Refused where it refuses (_train_native)."""
    args = (x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked,
            momentum, eps, precision)  # fmt: skip
    keep_pre_norm = _requires_grad(x, weight, bias, scale, gamma)
    if not keep_pre_norm and not _requires_grad(beta):
        return (_train_native if native_first else _run_train)(*args, False)[0]
    if native_first:  # eager by construction (the module's call)
        return _apply_eager(_TrainFunction, _train_native, *args, keep_pre_norm)
    return _TrainFunction.apply(_run_train, *args, keep_pre_norm)


# --- eval (running statistics) ----------------------------------------------------------------


def _eval_impl(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    scale: Tensor,
    gamma: Optional[Tensor],
    beta: Optional[Tensor],
    running_mean: Tensor,
    running_var: Tensor,
    eps: float,
    precision: str,
) -> Tensor:
    """out = ((x W^T + b) s - running_mean) / sqrt(running_var + eps) * gamma + beta; ``scale`` is a [N] vector."""
    if x.shape[0] == 0:  # no rows: nothing to compute (and no fallback to warn about)
        return x.new_empty((0, weight.shape[0]), dtype=_output_dtype(x, scale))
    precision = precision_mod.normalize(precision)
    try:
        return _eval_native(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps, precision)
    except Refused as refusal:
        warn_once(refusal.reason)
    with precision_mod.float32_matmul_precision(precision):
        out, _, _, _ = reference.linear_scale_batch_norm(
            x, weight, bias, scale, gamma, beta, running_mean, running_var, None, False, None, eps
        )
    return out


linear_scale_bn_eval = torch.library.custom_op("gemmbn::linear_scale_bn_eval", _eval_impl, mutates_args=())


@linear_scale_bn_eval.register_fake
def _(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps, precision):
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=_output_dtype(x, scale))


def _run_eval(*args) -> Tensor:
    """The implementation in eager mode and under torch.export, which traces it (non-strict: plain Python over fake
    tensors), so that the exported program calls the native gemmbn::eval_forward, which AOTInductor packages without
    Python. Under torch.compile, the native operator where the trace-time verdict allows, else the Python operator.
    Either way the route (fused or reference) and a "default" precision are fixed when traced."""
    if not torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return _eval_impl(*args)
    x, weight, bias, scale, gamma, beta, running_mean, running_var, eps = args[:9]
    vectors = _vectors(bias, scale, gamma, beta, running_mean, running_var)
    if x.shape[0] == 0 or plan.static_reason(x, weight, vectors, eps) is not None:
        return linear_scale_bn_eval(*args)
    return _eval_native(*args)


def _eval_setup_context(ctx, inputs, output):
    x, weight, bias, scale, gamma, beta, running_mean, running_var, eps, precision = inputs
    ctx.save_for_backward(x, weight, bias, scale, gamma, beta, running_mean, running_var)
    ctx.eps, ctx.precision = eps, precision


def _eval_backward(ctx, dout):
    return _eval_grads(ctx, dout, ctx.needs_input_grad[:6])


def _eval_grads(ctx, dout, needs):
    """The eval forward's (dx, dW, db, ds, dgamma, dbeta) and None for its other inputs; ``needs``: which of
    (x, weight, bias, scale, gamma, beta) need a gradient."""
    x, weight, bias, scale, gamma, beta, running_mean, running_var = ctx.saved_tensors
    # The running statistics are constants here: xhat = (y - running_mean) / sqrt(running_var + eps).
    stats_dtype = reference.statistics_dtype(x.dtype)
    invstd = torch.rsqrt(running_var.to(stats_dtype) + ctx.eps)
    grads = _run_backward(dout, x, weight, bias, scale, gamma, beta, x.new_empty(0), running_mean.to(stats_dtype),
                          invstd, False, list(needs), ctx.precision)  # fmt: skip
    return (*grads, None, None, None, None)


linear_scale_bn_eval.register_autograd(_eval_backward, setup_context=_eval_setup_context)


class _EvalFunction(torch.autograd.Function):
    """Autograd for the eval forward when it is reached without the operator (eager mode). ``run``: _run_eval or
    _eval_native."""

    @staticmethod
    def forward(ctx, run, *args):
        out = run(*args)
        _eval_setup_context(ctx, args, out)
        return out

    @staticmethod
    def backward(ctx, dout):
        return (None, *_eval_grads(ctx, dout, ctx.needs_input_grad[1:7]))


def _eval_native(*args) -> Tensor:
    """The fused eval route alone, Refused propagating (as _train_native, whose callers it shares). Same arguments as
    _eval_impl."""
    x = args[0]
    reason = fused_unavailable_reason(x)
    if reason is not None or x.shape[0] == 0:
        raise Refused(reason or "no rows")
    return fused.eval_forward(*args[:9], precision_mod.resolve(x.dtype, args[9]))


def forward_eval(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    scale: Tensor,
    gamma: Optional[Tensor],
    beta: Optional[Tensor],
    running_mean: Tensor,
    running_var: Tensor,
    eps: float,
    precision: str,
    native_first: bool = False,
) -> Tensor:
    """Differentiable linear_scale_bn_eval (same arguments; ``native_first`` as forward_train's)."""
    args = (x, weight, bias, scale, gamma, beta, running_mean, running_var, eps, precision)
    if not _requires_grad(x, weight, bias, scale, gamma, beta):
        return (_eval_native if native_first else _run_eval)(*args)
    if native_first:  # eager by construction (the module's call)
        return _apply_eager(_EvalFunction, _eval_native, *args)
    return _EvalFunction.apply(_run_eval, *args)


# autograd's C++ apply, which Function.apply calls through super() after its Python checks (_apply_eager).
_CPP_APPLY = {function: super(torch.autograd.Function, function).apply for function in (_TrainFunction, _EvalFunction)}
