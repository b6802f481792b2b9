"""Gradients of the fused forward, in PyTorch ops.

Forward: acc = x W^T, y = (acc + b) s, out = xhat g + beta with
  training: xhat = (y - mean) invstd  (batch statistics, which depend on y)
  eval:     xhat = (y - running_mean) / sqrt(running_var + eps)  (constants)
Math runs in float32 (float64 for float64 inputs); each gradient is cast to its input's dtype.
Only the gradients asked for (``needs``, ordered x, weight, bias, scale, gamma, beta) are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from torch import Tensor

from .reference import linear_scale, statistics_dtype

# (dx, dweight, dbias, dscale, dgamma, dbeta); None where not asked for or the input is None.
Grads = tuple[Optional[Tensor], ...]


def _cast(grad: Tensor | None, like: Tensor | None) -> Tensor | None:
    return None if grad is None or like is None else grad.to(like.dtype)


def _linear_scale_grads(
    dy: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, needs: Sequence[bool]
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """Given dy = dL/dy: dx = (dy s) W, dW = s G, db = s sum_m dy, ds = sum_k W G + b sum_m dy, with G = dy^T x."""
    need_x, need_w, need_b, need_s = needs[:4]
    math = dy.dtype
    s = scale.to(math)
    dx = dW = db = ds = None
    if need_x:
        dx = (dy * s) @ weight.to(math)
    if need_w or need_s:
        G = dy.t() @ x.to(math)  # [N, K]
        if need_w:
            dW = s[:, None] * G
        if need_s:
            ds = (weight.to(math) * G).sum(1)  # sum_m dy * acc, without forming acc
    if need_b or (need_s and bias is not None):
        dy_sum = dy.sum(0)
        if need_b:
            db = s * dy_sum
        if need_s and bias is not None:
            ds = ds + bias.to(math) * dy_sum
    return _cast(dx, x), _cast(dW, weight), _cast(db, bias), _cast(ds, scale)


def train_backward(
    dout: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    gamma: Tensor | None,
    beta: Tensor | None,
    pre_norm: Tensor,
    save_mean: Tensor,
    save_invstd: Tensor,
    needs: Sequence[bool],
) -> Grads:
    """Batch statistics: dy = g invstd / M (M dout - dbeta - xhat dgamma); dbeta = sum dout, dgamma = sum dout xhat."""
    math = statistics_dtype(x.dtype)
    M = x.shape[0]
    # pre_norm is empty when the forward did not keep y; then recompute it.
    y = pre_norm if pre_norm.numel() else linear_scale(x, weight, bias, scale)
    invstd = save_invstd.to(math)
    xhat = (y.to(math) - save_mean.to(math)) * invstd
    dout = dout.to(math)
    dbeta = dout.sum(0)
    dgamma = (dout * xhat).sum(0)
    g_invstd = invstd if gamma is None else gamma.to(math) * invstd
    dy = (g_invstd / M) * (M * dout - dbeta - xhat * dgamma)
    grads = _linear_scale_grads(dy, x, weight, bias, scale, needs)
    return (*grads, _cast(dgamma if needs[4] else None, gamma), _cast(dbeta if needs[5] else None, beta))


def eval_backward(
    dout: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    gamma: Tensor | None,
    beta: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    eps: float,
    needs: Sequence[bool],
) -> Grads:
    """Running statistics: dy = dout g r, r = 1/sqrt(rv + eps); dbeta = sum dout, dgamma = sum dout (y - rm) r."""
    math = statistics_dtype(x.dtype)
    rstd = (running_var.to(math) + eps).rsqrt()
    dout = dout.to(math)
    dgamma = dbeta = None
    if needs[4]:
        xhat = (linear_scale(x, weight, bias, scale).to(math) - running_mean.to(math)) * rstd
        dgamma = (dout * xhat).sum(0)
    if needs[5]:
        dbeta = dout.sum(0)
    gain = rstd if gamma is None else gamma.to(math) * rstd
    grads = _linear_scale_grads(dout * gain, x, weight, bias, scale, needs)
    return (*grads, _cast(dgamma, gamma), _cast(dbeta, beta))
