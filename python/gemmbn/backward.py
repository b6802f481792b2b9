"""Gradients of the forward: the math in one place, run by the fused kernels or by PyTorch ops.

Forward: z = x W^T + b, y = z s, xhat = (y - mean) invstd, out = xhat g + beta, with the batch statistics
(training: they depend on y) or the running ones (eval: constants). Per column, over the M rows:
    dbeta = sum dout,   dgamma = sum dout xhat
    grad_y = dL/dy = g invstd (dout - dbeta / M - xhat dgamma / M)       eval: g invstd dout
    sum_grad_y = sum_m grad_y                                              (closed form in kernels' api.h)
and with G = grad_y^T x (float32 [N, K]):
    dx = grad_y (s W),   dW = s G,   db = s sum_grad_y,   ds = sum_m grad_y z = (sum_m grad_y y) / s
                                                           (s = 0: sum_k W G + b sum_grad_y)
The GEMMs take grad_y, not dz = s grad_y: ds needs z, which y = z s loses where s = 0, while G keeps it;
so every gradient is exact at s = 0, and s multiplies the N x K operands instead of an M x N one.

Fused route (sm90 GPU, the extension, fused dtypes and sizes): gemmbn._C.batch_norm_backward reads dout
and y twice and writes grad_y once in the GEMMs' operand dtype; the two GEMMs run in the forward's
precision: bf16/fp16 tensor cores (cuBLAS) with float32 accumulation, TF32 (cuBLAS) for "high" and
"medium", the fp32-faithful split GEMM (gemmbn's own) for "highest". Elsewhere the same math in PyTorch
ops, in float32 (float64 for float64 data), with the GEMMs at PyTorch's own precision setting.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import Tensor

from . import fused, plan
from . import precision as precision_mod
from .fallback import warn_once
from .reference import linear_scale, statistics_dtype

REFERENCE = "reference"  # the GEMM route of the PyTorch fallback
# GEMMBN_FUSED_BACKWARD=0 runs every backward on the PyTorch route (A/B runs, or to rule the kernels out).
FUSED = os.environ.get("GEMMBN_FUSED_BACKWARD", "1") != "0"
# torch.mm(a, b, out_dtype) (bf16/fp16 in, float32 out) is in torch >= 2.9; before, the product is rounded first.
_MM_OUT_DTYPE = "out_dtype" in (torch.mm.__doc__ or "")


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
        grad_y = a * (dout - dbeta / dout.shape[0] - xhat * (dgamma / dout.shape[0]))
    else:
        grad_y = a * dout
    sum_grad_y_y = None if y is None else (grad_y * y.to(math)).sum(0)
    return grad_y, dbeta, dgamma, grad_y.sum(0), sum_grad_y_y


def _operand(t: Tensor) -> Tensor:
    """t contiguous and 16-byte aligned, as the kernels read it (a copy only where it is not)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _k_major(t: Tensor) -> Tensor:
    """t [M, C] as a contiguous [C, M'] float32 copy, M' = M rounded up to a multiple of 4 with zero columns:
    the split GEMM's operand layout when M is the reduction (16-byte rows)."""
    M, C = t.shape
    padded = -(-M // 4) * 4
    out = t.new_empty((C, padded)) if padded == M else t.new_zeros((C, padded))
    out[:, :M].copy_(t.t())
    return out


def _torch_gemm_precision(route: str):
    """The float32 matmul precision a torch GEMM of the route runs at: TF32 for the TF32 route ("high" and
    "medium"), PyTorch's own setting otherwise (16-bit operands ignore it; the reference follows it)."""
    return precision_mod.float32_matmul_precision("high") if route == precision_mod.TF32 else contextlib.nullcontext()


def _dx(route: str, grad_y: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """dx = grad_y (s W) [M, K] on the route's GEMM."""
    if route == precision_mod.SPLIT_FP32:
        N, K = weight.shape
        scaled_weight_t = torch.mul(weight.t(), scale, out=weight.new_empty((K, N)))  # (s W)^T, one pass
        return fused.split_matmul(grad_y, scaled_weight_t)
    scaled_weight = weight.to(grad_y.dtype) * scale.to(grad_y.dtype)[:, None]
    with _torch_gemm_precision(route):
        return grad_y @ scaled_weight


def _weight_product(route: str, grad_y: Tensor, x: Tensor) -> Tensor:
    """G = grad_y^T x [N, K] in float32 (float64 for float64 data) on the route's GEMM."""
    if route == precision_mod.SPLIT_FP32:
        return fused.split_matmul(_k_major(grad_y), _k_major(x))
    if route == precision_mod.NATIVE_16BIT:
        if _MM_OUT_DTYPE:
            return torch.mm(grad_y.t(), x, out_dtype=torch.float32)
        return (grad_y.t() @ x).float()
    with _torch_gemm_precision(route):
        return grad_y.t() @ x.to(grad_y.dtype)


def _linear_scale_grads(
    route: str, grad_y: Tensor, sum_grad_y: Tensor, sum_grad_y_y: Tensor | None, x: Tensor, weight: Tensor,
    bias: Tensor | None, scale: Tensor, needs: list[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dW, db, ds) from grad_y and its column sums (module docstring); None where not needed.

    ds = sum_m grad_y z comes from sum_grad_y_y / s (sum_m grad_y y, summed by the kernel in fp32/fp64 from
    grad_y before its rounding) where s != 0 and y was at hand, and from G where s = 0 (y = 0 there: z is
    lost) or y was not: G's own operand roundings (TF32's 2^-11) would double ds's error against eager's.
    """
    need_x, need_w, need_b, need_s = needs[:4]
    dx = dW = db = ds = None
    if need_x:
        dx = _dx(route, grad_y, weight, scale).to(x.dtype)
    s = scale.to(sum_grad_y.dtype)
    if need_w or need_s:
        G = _weight_product(route, grad_y, x)
        if route != REFERENCE:
            dW, w_dot_g = fused.weight_grads(G, _operand(weight), _operand(scale))  # both in one pass
            dW = dW if need_w else None
        else:
            dW = torch.mul(G, s[:, None], out=torch.empty_like(weight)) if need_w else None  # one rounding
            w_dot_g = (G * weight).sum(1) if need_s else None  # sum_m grad_y acc, without forming acc
        if need_s:
            ds = w_dot_g if bias is None else w_dot_g + bias.to(w_dot_g.dtype) * sum_grad_y
            if sum_grad_y_y is not None:
                ds = torch.where(s != 0, sum_grad_y_y.to(ds.dtype) / s, ds)
            ds = ds.to(scale.dtype)
    if need_b and bias is not None:
        db = (s * sum_grad_y).to(bias.dtype)
    return dx, dW, db, ds


def _route(x: Tensor, weight: Tensor, vectors: dict, precision: str) -> str:
    """The GEMM kind (precision.resolve) where the fused backward can run, else REFERENCE (warning once why)."""
    if not FUSED:
        return REFERENCE
    reason = plan.backward_reason(x, weight, vectors)
    if reason is None:
        return precision_mod.resolve(x.dtype, precision)
    warn_once(reason)
    return REFERENCE


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
    need_grad_y = any(needs[:4])
    if not (need_grad_y or needs[4]):  # dbeta alone (the forward then kept no y)
        dbeta = dout.sum(0, dtype=statistics_dtype(dout.dtype)).to(beta.dtype) if needs[5] else None
        return (None,) * 5 + (dbeta,)
    y = pre_norm if pre_norm.numel() else None
    route = _route(x, weight, {"bias": bias, "scale": scale, "gamma": gamma, "pre_norm": y}, precision)
    if y is None and (needs[4] or batch_statistics):  # xhat is needed: y was not kept, make it again
        if route == REFERENCE:
            y = linear_scale(x, weight, bias, scale)
        else:
            y = fused.linear_scale(*(None if t is None else _operand(t) for t in (x, weight, bias, scale)), route)
    if route == REFERENCE:
        grad_y, dbeta, dgamma, sum_grad_y, sum_grad_y_y = _normalization_grads_reference(
            dout, y, mean, invstd, gamma, batch_statistics
        )
    else:
        dout = _operand(dout.to(x.dtype))
        gamma_vector = None if gamma is None else gamma.contiguous()
        grad_y, column_grads = fused.batch_norm_backward(
            dout, y, mean.float(), invstd.float(), gamma_vector, batch_statistics, need_grad_y
        )
        dbeta, dgamma, sum_grad_y, sum_grad_y_y = column_grads
        sum_grad_y_y = sum_grad_y_y if y is not None else None
    grads = (None,) * 4
    if need_grad_y:
        grads = _linear_scale_grads(route, grad_y, sum_grad_y, sum_grad_y_y, x, weight, bias, scale, needs)
    # Copies: the vectors may be views of one scratch array, and an operator's outputs must not alias.
    dgamma = dgamma.to(gamma.dtype, copy=True) if needs[4] else None
    dbeta = dbeta.to(beta.dtype, copy=True) if needs[5] else None
    return (*grads, dgamma, dbeta)
