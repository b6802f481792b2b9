"""The fused (native) forward paths: allocate outputs and workspace, launch gemmbn._C kernels.

Callers have checked eligibility with plan.fused_plan. Every launch goes on PyTorch's current stream
of x's device and nothing here synchronizes with the host, so the paths are CUDA-graph capturable.
Tensors are detached before they cross DLPack (which refuses tensors that require grad); detaching
shares storage, so in-place updates of the running statistics land in the caller's buffers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.graph import increment_version

from . import precision as precision_mod
from ._native import extension

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_MOMENTS_TILE_ROWS = 128  # rows per statistics partial on the IEEE fp32 path (bias_scale_moments)


def _detached(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


@contextlib.contextmanager
def _on_device(x: Tensor) -> Iterator[int]:
    """Make x's device current (the binding checks it) and yield its current stream as an integer."""
    with torch.cuda.device(x.device):
        yield torch.cuda.current_stream(x.device).cuda_stream


def _ieee_matmul(x: Tensor, weight: Tensor, out: Tensor) -> None:
    """out = x @ W^T in true fp32 (cuBLAS SGEMM), whatever the global TF32 setting."""
    with precision_mod.float32_matmul_precision("highest"):
        torch.mm(x, weight.t(), out=out)


def train_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    gamma: Tensor | None,
    beta: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    num_batches_tracked: Tensor | None,
    momentum: float | None,
    eps: float,
    gemm_kind: str,
    keep_pre_norm: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Batch-statistics forward: y = (x W^T + b) s; out = (y - mean) invstd gamma + beta; running stats updated.

    Returns (out, pre_norm, save_mean, save_invstd) like reference.linear_scale_batch_norm.
    """
    _C = extension()
    x, weight, bias, scale, gamma, beta = map(_detached, (x, weight, bias, scale, gamma, beta))
    running_mean, running_var, num_batches_tracked = map(_detached, (running_mean, running_var, num_batches_tracked))
    (M, K), N = x.shape, weight.shape[0]
    if momentum is None and num_batches_tracked is None:
        momentum = 0.0  # nn.BatchNorm1d's factor when momentum is None and nothing is tracked
    y = x.new_empty((M, N))
    save_mean = torch.empty(N, dtype=torch.float32, device=x.device)
    save_invstd = torch.empty_like(save_mean)
    with _on_device(x) as stream:
        if gemm_kind == precision_mod.IEEE_FP32:
            tile_rows = _MOMENTS_TILE_ROWS
        else:
            tile_rows, _ = _C.gemm_config(_DTYPE_NAMES[x.dtype], M, N, K)
        # Per (M-tile, column) mean and M2 of y as stored; rows 0/1 of one allocation.
        partials = torch.empty((2, -(-M // tile_rows), N), dtype=torch.float32, device=x.device)
        # The launch below increments num_batches_tracked (when given) on the device.
        if gemm_kind == precision_mod.IEEE_FP32:
            _ieee_matmul(x, weight, y)
            _C.bias_scale_moments(y, y, bias, scale, partials[0], partials[1], num_batches_tracked, tile_rows, stream)
        else:
            _C.gemm_scale_stats(
                x, weight, y, bias, scale, None, None, partials[0], partials[1], num_batches_tracked, stream
            )
        # Normalize in place unless y itself is kept for the backward pass.
        out = torch.empty_like(y) if keep_pre_norm else y
        _C.finish_normalize(
            y, out, partials[0], partials[1], tile_rows, gamma, beta,
            running_mean, running_var, num_batches_tracked, momentum, eps, save_mean, save_invstd, stream,
        )  # fmt: skip
    # The kernels wrote through DLPack, which autograd does not see: count the in-place updates.
    increment_version([t for t in (running_mean, running_var, num_batches_tracked) if t is not None])
    pre_norm = y if keep_pre_norm else y.new_empty(0)
    return out, pre_norm, save_mean, save_invstd


def eval_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    scale: Tensor,
    gamma: Tensor | None,
    beta: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    eps: float,
    gemm_kind: str,
) -> Tensor:
    """Running-statistics forward: out = ((xW^T + b) s) g + c with g = gamma/sqrt(rv + eps), c = beta - rm g."""
    _C = extension()
    x, weight, bias, scale, gamma, beta = map(_detached, (x, weight, bias, scale, gamma, beta))
    running_mean, running_var = running_mean.detach(), running_var.detach()
    (M, _), N = x.shape, weight.shape[0]
    gain = torch.empty(N, dtype=torch.float32, device=x.device)
    shift = torch.empty_like(gain)
    out = x.new_empty((M, N))
    with _on_device(x) as stream:
        _C.fold_eval_affine(gamma, beta, running_mean, running_var, eps, gain, shift, stream)
        if gemm_kind == precision_mod.IEEE_FP32:
            # acc in true fp32, then one elementwise pass: out = acc * (s gain) + (b s gain + shift).
            _ieee_matmul(x, weight, out)
            column_gain = scale * gain
            column_shift = shift if bias is None else torch.addcmul(shift, bias, column_gain)
            torch.addcmul(column_shift, out, column_gain, out=out)
        else:
            _C.gemm_scale_stats(x, weight, out, bias, scale, gain, shift, None, None, None, stream)
    return out
