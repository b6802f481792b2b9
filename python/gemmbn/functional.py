"""gemmbn's functional entry point: validation, then the train or eval operator."""

from __future__ import annotations

import contextlib

from torch import Tensor

from . import distributed, ops
from . import precision as precision_mod
from ._native import Refused
from .errors import GemmBnTypeError, GemmBnValueError
from .reference import check_batch_size


def _check_vector(name: str, t: Tensor | None, num_features: int, x: Tensor) -> None:
    if t is None:
        return
    if not isinstance(t, Tensor):
        raise GemmBnTypeError(f"{name} must be a Tensor or None, got {type(t).__name__}")
    if t.shape != (num_features,):
        raise GemmBnValueError(f"{name} must have shape ({num_features},), got {tuple(t.shape)}")
    if t.device != x.device:
        raise GemmBnValueError(f"{name} is on {t.device} but x is on {x.device}")


def _scale_vector(scale: Tensor, num_features: int, x: Tensor) -> Tensor:
    """scale as a contiguous [N] vector; any shape that broadcasts along the N columns of y is accepted."""
    if not isinstance(scale, Tensor):
        raise GemmBnTypeError(f"scale must be a Tensor, got {type(scale).__name__}")
    if scale.device != x.device:
        raise GemmBnValueError(f"scale is on {scale.device} but x is on {x.device}")
    if scale.shape == (num_features,) and scale.is_contiguous():
        return scale  # the module's own parameter: nothing to reshape (saves ~5 us a forward)
    # Broadcasting with y [M, N] must give [M, N] and scale must not vary along M.
    leading = scale.shape[:-1]
    last = scale.shape[-1] if scale.dim() else 1
    if scale.dim() > 2 or any(size != 1 for size in leading) or last not in (1, num_features):
        raise GemmBnValueError(
            f"scale of shape {tuple(scale.shape)} does not broadcast to ({num_features},): "
            "one factor per output feature"
        )
    # Reshape/expand stay in the autograd graph, so the gradient reduces back to scale's own shape.
    return scale.reshape(-1).expand(num_features).contiguous()


def _validate(
    x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, use_batch_stats, eps,
    synchronized=False,
) -> Tensor:
    """Raise GemmBnValueError/GemmBnTypeError for bad arguments, before any operator (and any mutation) runs."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, Tensor):
            raise GemmBnTypeError(f"{name} must be a Tensor, got {type(t).__name__}")
    if not x.is_floating_point():
        raise GemmBnTypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.dim() != 2:
        raise GemmBnValueError(f"x must be 2-D [batch, in_features], got shape {tuple(x.shape)}")
    if weight.dim() != 2:
        raise GemmBnValueError(f"weight must be 2-D [out_features, in_features], got shape {tuple(weight.shape)}")
    if x.shape[1] != weight.shape[1]:
        raise GemmBnValueError(f"in_features mismatch: x has {x.shape[1]} features, weight expects {weight.shape[1]}")
    if weight.device != x.device:
        raise GemmBnValueError(f"weight is on {weight.device} but x is on {x.device}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise GemmBnTypeError(f"{name} is {t.dtype} but x is {x.dtype}; nn.Linear needs them to match")
    num_features = weight.shape[0]
    for name, t in (("bias", bias), ("gamma", gamma), ("beta", beta),
                    ("running_mean", running_mean), ("running_var", running_var)):  # fmt: skip
        _check_vector(name, t, num_features, x)
    if (running_mean is None) != (running_var is None):
        raise GemmBnValueError("running_mean and running_var must be given together (or both None)")
    if num_batches_tracked is not None:
        if num_batches_tracked.numel() != 1 or num_batches_tracked.is_floating_point():
            raise GemmBnValueError("num_batches_tracked must be an integer tensor with one element")
        if num_batches_tracked.device != x.device:
            raise GemmBnValueError(f"num_batches_tracked is on {num_batches_tracked.device} but x is on {x.device}")
    # nn.functional.batch_norm's own checks, same messages.
    if use_batch_stats:
        if not synchronized:  # over a process group the rows of every rank count
            check_batch_size(x.shape[0], num_features)
        if eps <= 0.0:
            raise GemmBnValueError(f"batch_norm eps must be positive during training, but got {eps}")
    elif eps < 0.0:
        raise GemmBnValueError(f"batch_norm eps must be non-negative, but got {eps}")
    return _scale_vector(scale, num_features, x)


def linear_scale_batch_norm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    gamma: Tensor | None,
    beta: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    num_batches_tracked: Tensor | None,
    training: bool,
    momentum: float | None,
    eps: float,
    precision: str | None = None,
    process_group=None,
) -> Tensor:
    """out = BatchNorm1d((x W^T + b) * s): (y - mean) / sqrt(var + eps) * gamma + beta, y = (x W^T + b) s.

    Semantics of nn.BatchNorm1d's forward given its buffers: batch statistics when ``training`` or
    ``running_mean is None``; then running_mean/var (if given) move by ``momentum`` (None: cumulative
    average 1/num_batches_tracked, read on the device) and, when ``training``, num_batches_tracked
    (if given) is incremented. ``scale`` may be any shape that broadcasts to (N,).
    ``precision`` ("highest", "high", "medium") picks the float32 GEMM; None follows
    torch.get_float32_matmul_precision(). ``process_group`` (a torch.distributed group, None: none): batch
    statistics over the rows of every rank in it, nn.SyncBatchNorm's semantics (distributed.py; the PyTorch
    route for now). Errors are raised before anything is mutated.
    """
    use_batch_stats = training or running_mean is None
    synchronized = use_batch_stats and process_group is not None
    scale = _validate(
        x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, use_batch_stats, eps,
        synchronized,
    )
    precision = precision_mod.validate(precision)  # None -> read the global setting when the op runs
    if synchronized:
        # PyTorch's own setting needs no context (reading it would break a torch.compile graph).
        explicit = precision != precision_mod.FOLLOW_TORCH
        with precision_mod.float32_matmul_precision(precision) if explicit else contextlib.nullcontext():
            return distributed.forward_train(
                x, weight, bias, scale, gamma, beta, running_mean, running_var,
                num_batches_tracked if training else None, momentum, eps, process_group,
            )  # fmt: skip
    if not use_batch_stats:
        return ops.forward_eval(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps, precision)
    # Only a training step counts batches (nn.BatchNorm1d does not count in eval mode).
    batches_tracked = num_batches_tracked if training else None
    return ops.forward_train(
        x, weight, bias, scale, gamma, beta, running_mean, running_var, batches_tracked,
        momentum, eps, precision,
    )  # fmt: skip


def native_first(x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, training,
                 momentum, eps, precision) -> Tensor:  # fmt: skip
    """linear_scale_batch_norm's result (same arguments, no process group) straight from the native operator, for a
    module's own parameters and buffers: nothing is validated in Python first. The operator checks every fact the
    kernels rely on and refuses before anything the caller holds is written, raising Refused, whereupon the caller
    takes linear_scale_batch_norm's validated route (which raises the clear error, or falls back). Saves that route's
    checks, ~7 us a forward on a fast host (perf/host_path.py)."""
    if scale.dim() != 1:
        raise Refused("scale is not a [N] vector")  # linear_scale_batch_norm reshapes it
    precision = precision_mod.validate(precision)
    if training or running_mean is None:
        return ops.forward_train(
            x, weight, bias, scale, gamma, beta, running_mean, running_var,
            num_batches_tracked if training else None, momentum, eps, precision, native_first=True,
        )  # fmt: skip
    return ops.forward_eval(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps, precision,
                            native_first=True)  # fmt: skip
