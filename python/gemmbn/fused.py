"""The fused (native) paths: one call each into gemmbn's torch operators (python/csrc/operators.cpp).

Each operator checks its arguments (dtypes, shapes, devices), copies read operands of another layout into the
kernels' (contiguous, 16-byte aligned), picks the GEMM's configuration row, allocates its outputs and workspace
from torch's caching allocator and launches on torch's current stream of the inputs' device, all in C++: nothing
here synchronizes with the host, so the paths are CUDA-graph capturable. Arguments the kernels cannot take are
refused before anything the caller holds is written, and the refusal surfaces here as ``Refused`` with the reason:
the callers fall back to PyTorch on it, so the layout is checked once, in C++. Where the GEMM is short the host's
work before the first launch is the forward's latency (the GPU waits for it), which is why a forward is a single
operator call.

The operators are reached through their OpOverloads, looked up once (_native.operator): torch.ops attribute
lookups cost microseconds a call.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.graph import increment_version

from . import precision as precision_mod
from . import eval_fold_cache, weight_cache
from ._native import call as _call
from ._native import operator


def _split_weight(weight: Tensor, gemm_kind: str) -> tuple[Tensor | None, Tensor | None]:
    """(weight_split, weight_unscale) for the fp32-faithful GEMM (weight_cache: cached per weight version, made in
    the graph when traced), else (None, None)."""
    if gemm_kind != precision_mod.SPLIT_FP32:
        return None, None
    return weight_cache.split_weight(weight)


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

    Returns (out, pre_norm, save_mean, save_invstd) like reference.linear_scale_batch_norm (pre_norm is y when
    ``keep_pre_norm``, else empty and out was normalized in place).
    """
    result = _call(
        operator("train_forward"), x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked,
        momentum, eps, *_split_weight(weight, gemm_kind), keep_pre_norm,
    )  # fmt: skip
    if not torch.compiler.is_compiling():  # traced, functionalization accounts for the operator's mutations
        # The kernels wrote the buffers from C++, which autograd does not see: count the in-place updates.
        increment_version([t for t in (running_mean, running_var, num_batches_tracked) if t is not None])
    return result


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
    """Running-statistics forward: out = ((xW^T + b) s) g + c with g = gamma/sqrt(rv + eps), c = beta - rm g; the
    fold of b, s, g and c into a gain and a shift is kept while none of them changes (eval_fold_cache)."""
    split = _split_weight(weight, gemm_kind)
    affine = eval_fold_cache.affine(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps)
    if affine is None:
        return _call(operator("eval_forward"), x, weight, bias, scale, gamma, beta, running_mean, running_var, eps,
                     *split)  # fmt: skip
    return _call(operator("eval_forward_folded"), x, weight, affine, *split)


# --- backward ---------------------------------------------------------------------------------


def batch_norm_backward(
    dout: Tensor,
    y: Tensor | None,
    mean: Tensor,
    invstd: Tensor,
    gamma: Tensor | None,
    scale: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    batch_statistics: bool,
    outputs: tuple[bool, bool, bool, bool, bool],
    transposed: bool = False,
    over_ranks: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor | None, ...]:
    """(dz = s dL/dy [M, N], dgamma, dbeta, dbias, dscale), each in dout's dtype where ``outputs`` (ordered so)
    asks for it, else None, then transpose_with_maxima(dz) where ``transposed`` (float32, with dz; else None):
    api.h's math, one launch.

    Tensors of dout's dtype but mean and invstd (float32 [N]: the running
    statistics when not ``batch_statistics``); y may be None only then, and neither dgamma nor dscale asked for.
    ``over_ranks``: batch statistics over a process group's ranks, (this batch's batch_norm_backward_sums [3, N], the
    ranks' first two rows added in rank order [2, N], the rows of every rank as a float64 [1]); mean and invstd are
    then the global statistics.
    """
    dz, dgamma, dbeta, dbias, dscale = outputs
    mask = dz | dgamma << 1 | dbeta << 2 | dbias << 3 | dscale << 4 | transposed << 5  # operators.cpp's BackwardOutput
    grads = _call(operator("batch_norm_backward"), dout, y, mean, invstd, gamma, scale, x, weight, bias,
                  batch_statistics, mask, *(over_ranks or ()))  # fmt: skip
    return (*(grad if need else None for grad, need in zip(grads, outputs)), tuple(grads[5:]) if transposed else None)


def batch_norm_backward_sums(dout: Tensor, y: Tensor, mean: Tensor, invstd: Tensor) -> Tensor:
    """[3, N] float64: the column sums of dout, dout (y - mean) and y - mean over this batch's rows, with the global
    statistics (float32 mean and invstd): what a rank contributes to a synchronized backward (distributed.py)."""
    return _call(operator("batch_norm_backward_sums"), dout, y, mean, invstd)


def matmul(a: Tensor, b_rows: Tensor) -> Tensor:
    """a @ b_rows^T in float32 on gemmbn's TF32 GEMM (no epilogue): a [M, K], b_rows [N, K], K and N multiples
    of 4."""
    return _call(operator("linear_scale"), a, b_rows, None, None, None, None)


def split_matmul(a: Tensor, b: Tensor, a_row_max: Tensor | None = None) -> Tensor:
    """a @ b in float32 on the fp32-faithful split GEMM: a [M, K] with K a multiple of 4, b [K', N] (K' <= K: the
    rows past K' are zero, as transpose_padded pads a), N a multiple of 4. b is split on every call (the
    backward's operands change every step; the weight cache would keep each one alive), straight from b's rows
    (split_columns) without a transposed copy. a_row_max: the bits of a's rows' maxima where known
    (transpose_with_maxima), else the GEMM finds them in a pass over a."""
    return _call(operator("split_matmul"), a, *_call(operator("split_columns"), b), a_row_max)


def transpose_padded(t: Tensor) -> Tensor:
    """t [R, C] (float32) transposed into a new [C, R'], R' = R rounded up to a multiple of 4, the
    columns past R zero: the GEMMs' operand where the reduction runs down t's columns."""
    return _call(operator("transpose_padded"), t, False)[0]


def transpose_with_maxima(t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(transpose_padded(t), t's rows' maxima, t's columns' maxima): the maxima as int32 bits of float32, the row
    scales split_matmul needs for t and for the transpose, made in the transpose's one pass over t."""
    return _call(operator("transpose_padded"), t, True)


def linear_scale(x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, gemm_kind: str) -> Tensor:
    """y = (x W^T + b) s on the fused GEMM without statistics (the eval backward's y; scale None: 1)."""
    return _call(operator("linear_scale"), x, weight, bias, scale, *_split_weight(weight, gemm_kind))


def train_moments(x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gemm_kind: str) -> tuple[Tensor, Tensor]:
    """(y = (x W^T + b) s, moments [3, N] float32: rows, mean and M2 of y's columns): the synchronized forward's first
    launches, before the ranks' collective (distributed.py)."""
    return _call(operator("train_moments"), x, weight, bias, scale, *_split_weight(weight, gemm_kind))


def normalize_from_moments(
    y: Tensor, rank_moments: Tensor, gamma: Tensor | None, beta: Tensor | None, running_mean: Tensor | None,
    running_var: Tensor | None, num_batches_tracked: Tensor | None, momentum: float | None, eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, save_mean, save_invstd): y normalized with the statistics of the ranks' moments [ranks, 3, N] (float32,
    rank order), the running statistics moved with them; num_batches_tracked is read, not counted."""
    result = _call(operator("normalize_from_moments"), y, rank_moments, gamma, beta, running_mean, running_var,
                   num_batches_tracked, momentum, eps)  # fmt: skip
    if not torch.compiler.is_compiling():
        increment_version([t for t in (running_mean, running_var) if t is not None])
    return result
