"""Gradients of the forward: the math in one place, run by the fused kernels or by PyTorch ops.

Forward: z = x W^T + b, y = z s, xhat = (y - mean) invstd, out = xhat g + beta, with the batch statistics
(training: they depend on y) or the running ones (eval: constants). Per column, over the M rows:
    dbeta = sum dout,   dgamma = sum dout xhat
    grad_y = dL/dy = g invstd (dout - dbeta / M - xhat dgamma / M)       eval: g invstd dout
    sum_grad_y = sum_m grad_y                                              (closed form in kernels' api.h)
    dz = s grad_y,   dx = dz W,   dW = dz^T x,   db = s sum_grad_y,   ds = sum_m grad_y z
ds needs z, which y = z s keeps only where s != 0: there ds = (sum_m grad_y y) / s; where s = 0 the fused
kernel makes z from x and W for those columns alone, and the PyTorch route uses G = grad_y^T x instead of dz
(dW = s G, ds = sum_k W G + b sum_grad_y): it keeps z everywhere at the price of N x K passes.

Fused route (sm90 GPU, the extension, fused dtypes and sizes): the gemmbn::batch_norm_backward operator reads dout
and y twice and writes dz once in the GEMMs' operand dtype (for "highest" with dW also dz^T and dz's maxima, the
split GEMMs' operand and row scales), with every [N] gradient; the two GEMMs run in
the forward's precision: bf16/fp16 tensor cores (cuBLAS) with float32 accumulation, TF32 for "high" and
"medium" (gemmbn's own GEMM for large outputs, else cuBLAS), the fp32-faithful split GEMM (gemmbn's own) for
"highest". Elsewhere the G form in PyTorch
ops, in float32 (float64 for float64 data), with the GEMMs at PyTorch's own precision setting.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import Tensor

from . import fused, plan
from . import precision as precision_mod
from ._native import Refused, fused_unavailable_reason
from .fallback import warn_once
from .reference import linear_scale, statistics_dtype

REFERENCE = "reference"  # the GEMM route of the PyTorch fallback
# GEMMBN_FUSED_BACKWARD=0 runs every backward on the PyTorch route (A/B runs, or to rule the kernels out).
FUSED = os.environ.get("GEMMBN_FUSED_BACKWARD", "1") != "0"


def grad_y_batch_statistics(
    dout: Tensor, xhat: Tensor, a: Tensor, sum_dout: Tensor, sum_dout_xhat: Tensor, count: Tensor | int
) -> Tensor:
    """dL/dy = a (dout - sum_dout / count - xhat sum_dout_xhat / count), a = gamma invstd, with the batch statistics'
    column sums over `count` rows (this batch's, or every rank's for synchronized statistics: distributed.py)."""
    return a * (dout - sum_dout / count - xhat * (sum_dout_xhat / count))


def _normalization_grads_reference(
    dout: Tensor, y: Tensor | None, mean: Tensor, invstd: Tensor, gamma: Tensor | None, batch_statistics: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(grad_y, dbeta, dgamma, sum_grad_y, sum_grad_y_y) in PyTorch ops, in the statistics dtype; without y
    dgamma is 0 and sum_grad_y_y None."""
    math = statistics_dtype(dout.dtype)
    dout, invstd = dout.to(math), invstd.to(math)
    dbeta = dout.sum(0)
    xhat = None if y is None else (y.to(math) - mean.to(math)) * invstd
    dgamma = torch.zeros_like(dbeta) if xhat is None else (dout * xhat).sum(0)
    a = invstd if gamma is None else gamma.to(math) * invstd
    if batch_statistics:
        grad_y = grad_y_batch_statistics(dout, xhat, a, dbeta, dgamma, dout.shape[0])
    else:
        grad_y = a * dout
    sum_grad_y_y = None if y is None else (grad_y * y.to(math)).sum(0)
    return grad_y, dbeta, dgamma, grad_y.sum(0), sum_grad_y_y


def _reduction_rows(t: Tensor) -> Tensor:
    """t [R, C] as gemmbn's GEMMs read an operand whose reduction runs along C: float32 rows, C a multiple of 4
    (zero columns added). A transposed view (dz^T; x^T and W^T for the TF32 GEMM) goes through the tiled
    transpose; the operators copy any other layout into theirs."""
    if t.is_contiguous() and t.shape[1] % 4 == 0:
        return t
    return fused.transpose_padded(t.t())


def _torch_gemm_precision(route: str):
    """The float32 matmul precision a torch GEMM of the route runs at: TF32 for the TF32 route ("high" and
    "medium"), PyTorch's own setting otherwise (16-bit operands ignore it; the reference follows it)."""
    return precision_mod.float32_matmul_precision("high") if route == precision_mod.TF32 else contextlib.nullcontext()


# The TF32 route runs a gradient GEMM on gemmbn's TF32 GEMM (after tiled transposes of its operands) where the
# output has at least this many elements: without split-K it needs an output that fills the GPU many times
# over, and there it beat cuBLAS; below, cuBLAS's split-K kernels won (perf/NOTES.md v13).
OWN_TF32_MIN_OUTPUT = 1 << 24


def _matmul(route: str, a: Tensor, b: Tensor) -> Tensor:
    """a @ b on the fused route's GEMM: gemmbn's own (the fp32-faithful split GEMM for "highest", the TF32 one for
    large outputs), a read with its reduction along rows (b too for TF32; the split GEMM splits b from its own
    rows); else cuBLAS (16-bit with float32 accumulation, or TF32: the caller holds _torch_gemm_precision)."""
    if route == precision_mod.SPLIT_FP32:  # b split from its rows: no transposed copy (perf/NOTES.md, v16)
        return fused.split_matmul(_reduction_rows(a), b)
    if route == precision_mod.TF32 and a.shape[0] * b.shape[1] >= OWN_TF32_MIN_OUTPUT:
        return fused.matmul(_reduction_rows(a), _reduction_rows(b.t()))
    return a @ b


def _fused_grads(
    route: str, dout: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gamma: Tensor | None,
    y: Tensor | None, mean: Tensor, invstd: Tensor, batch_statistics: bool, needs: list[bool],
    over_ranks: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor | None, ...]:
    """(dx, dW, db, ds, dgamma, dbeta) on the fused route: the kernel for dz and the [N] gradients, two GEMMs.
    over_ranks: batch statistics over a process group's ranks (fused.batch_norm_backward's; distributed.py)."""
    need_x, need_w, need_b, need_s, need_gamma, need_beta = needs
    dout = dout if dout.dtype == x.dtype else dout.to(x.dtype)
    mean, invstd = (t if t.dtype == torch.float32 else t.float() for t in (mean, invstd))
    # fp32 "highest" with dW: the kernel also writes dz^T and the maxima of dz's rows and columns, the split GEMMs'
    # operand and row scales, sparing transpose_padded's pass over dz (perf/NOTES.md, v17); dz is let go once dx
    # has read it.
    split_dw = route == precision_mod.SPLIT_FP32 and need_w
    dz, dgamma, dbeta, db, ds, transposed = fused.batch_norm_backward(
        dout, y, mean, invstd, gamma, scale, x, weight, bias, batch_statistics,
        (need_x or need_w or need_s, need_gamma, need_beta, need_b, need_s), split_dw, over_ranks,
    )  # fmt: skip
    if split_dw:
        dz_t, dz_row_max, dz_column_max = transposed
        dx = fused.split_matmul(dz, weight, dz_row_max) if need_x else None
        del dz
        return dx, fused.split_matmul(dz_t, x, dz_column_max), db, ds, dgamma, dbeta
    with _torch_gemm_precision(route):  # PyTorch's TF32 switch set once for both GEMMs (perf/NOTES.md v29)
        dx = _matmul(route, dz, weight) if need_x else None
        dW = _matmul(route, dz.t(), x) if need_w else None
    return dx, dW, db, ds, dgamma, dbeta


def _reference_grads(
    grad_y: Tensor, sum_grad_y: Tensor, sum_grad_y_y: Tensor | None, x: Tensor, weight: Tensor,
    bias: Tensor | None, scale: Tensor, needs: list[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dW, db, ds) in PyTorch ops from grad_y and its column sums (the G form of the module docstring);
    None where not needed. ds comes from sum_grad_y_y / s where s != 0 and y was at hand (G's own roundings,
    TF32's 2^-11, would double ds's error against eager's), from G where s = 0 or y was not."""
    need_x, need_w, need_b, need_s = needs[:4]
    dx = dW = db = ds = None
    s = scale.to(sum_grad_y.dtype)
    if need_x:
        dx = (grad_y @ (weight.to(grad_y.dtype) * s[:, None])).to(x.dtype)
    if need_w or need_s:
        G = grad_y.t() @ x.to(grad_y.dtype)
        dW = torch.mul(G, s[:, None], out=torch.empty_like(weight)) if need_w else None  # one rounding
        if need_s:
            ds = (G * weight).sum(1)  # sum_m grad_y acc, without forming acc
            ds = ds if bias is None else ds + bias.to(ds.dtype) * sum_grad_y
            if sum_grad_y_y is not None:
                ds = torch.where(s != 0, sum_grad_y_y.to(ds.dtype) / s, ds)
            ds = ds.to(scale.dtype)
    if need_b and bias is not None:
        db = (s * sum_grad_y).to(bias.dtype)
    return dx, dW, db, ds


def _route(x: Tensor, precision: str) -> str:
    """The GEMM kind (precision.resolve) where the fused backward may run (the device and build allow it; the
    operators still check the layout), else REFERENCE (warning once why)."""
    if not FUSED:
        return REFERENCE
    reason = fused_unavailable_reason(x)
    if reason is None:
        return precision_mod.resolve(x.dtype, precision)
    warn_once(reason)
    return REFERENCE


def traced_natively(
    x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gamma: Tensor | None, beta: Tensor | None,
    precision: str,
) -> bool:
    """Whether a traced backward (torch.compile) can call the native operators itself: the fused route's
    trace-time verdict (plan.static_reason) allows it, and its torch GEMMs need no change of PyTorch's TF32 switch
    (the TF32 route of a module pinned to "high" while PyTorch's setting is "highest"), which a graph cannot make."""
    if not FUSED:
        return False
    vectors = {"bias": bias, "scale": scale, "gamma": gamma, "beta": beta}
    if plan.static_reason(x, weight, vectors, eps=1.0) is not None:  # eps is the forward's business
        return False
    return precision_mod.resolve(x.dtype, precision) != precision_mod.TF32 or precision_mod.current() != "highest"


def linear_scale_bn_backward(
    dout: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    gamma: Tensor | None,
    beta: Tensor | None,
    pre_norm: Tensor,
    mean: Tensor,
    invstd: Tensor,
    batch_statistics: bool,
    needs: list[bool],
    precision: str,
) -> tuple[Tensor | None, ...]:
    """(dx, dW, db, ds, dgamma, dbeta), None where ``needs`` (ordered so) is False or the input is None.

    pre_norm: the forward's y, or empty (then recomputed when needed); mean, invstd [N]: the batch statistics
    (``batch_statistics``) or the running mean and 1/sqrt(running_var + eps). ``precision`` as the forward's.
    """
    needs = list(needs)
    needs[2] = needs[2] and bias is not None
    needs[4] = needs[4] and gamma is not None
    needs[5] = needs[5] and beta is not None
    if dout.shape[0] == 0:  # a batch of no rows (nn.BatchNorm1d's): x's gradient is empty, the others 0
        inputs = (x, weight, bias, scale, gamma, beta)
        return tuple(torch.zeros_like(t) if need else None for t, need in zip(inputs, needs))
    need_grad_y = any(needs[:4])
    if not (need_grad_y or needs[4]):  # dbeta alone (the forward then kept no y)
        dbeta = dout.sum(0, dtype=statistics_dtype(dout.dtype)).to(beta.dtype) if needs[5] else None
        return (None,) * 5 + (dbeta,)
    y = pre_norm if pre_norm.numel() else None
    route = _route(x, precision)
    if route != REFERENCE:
        try:
            # y was not kept (eval) but ds needs it, or dgamma xhat: make it again.
            if y is None and (needs[4] or batch_statistics or needs[3]):
                y = fused.linear_scale(x, weight, bias, scale, route)
            return _fused_grads(route, dout, x, weight, bias, scale, gamma, y, mean, invstd, batch_statistics, needs)
        except Refused as refusal:  # the operators checked the layout before running anything
            warn_once(refusal.reason)
    if y is None and (needs[4] or batch_statistics):  # xhat is needed: y was not kept (eval), make it again
        y = linear_scale(x, weight, bias, scale)
    grad_y, dbeta, dgamma, sum_grad_y, sum_grad_y_y = _normalization_grads_reference(
        dout, y, mean, invstd, gamma, batch_statistics
    )
    grads = (None,) * 4
    if need_grad_y:
        grads = _reference_grads(grad_y, sum_grad_y, sum_grad_y_y, x, weight, bias, scale, needs)
    dgamma = dgamma.to(gamma.dtype) if needs[4] else None
    dbeta = dbeta.to(beta.dtype) if needs[5] else None
    return (*grads, dgamma, dbeta)
