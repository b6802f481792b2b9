"""The fused (native) forward paths: allocate outputs and workspace, launch gemmbn._C kernels.

Callers have checked eligibility with plan.fused_plan. Every launch goes on PyTorch's current stream
of x's device and nothing here synchronizes with the host, so the paths are CUDA-graph capturable.
Tensors cross into the extension as DLPack capsules made by torch.utils.dlpack.to_dlpack: 0.4 us each,
where handing nanobind the tensor makes it call Tensor.__dlpack__ (3.3 us, and it refuses tensors that
require grad). Capsules share storage, so in-place updates of the running statistics land in the
caller's buffers.

Where the GEMM is short, the host's work before the first launch is the forward's latency (the GPU
waits for it), so the training forward makes one binding call for both launches, with one scratch
array for the partials, and anything not needed by the launches comes after them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.graph import increment_version
from torch.utils.dlpack import to_dlpack

from . import precision as precision_mod
from . import weight_cache
from ._native import extension

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _dl(t: Tensor | None):
    """A DLPack capsule of t (None stays None): what the binding's array arguments take fastest."""
    return None if t is None else to_dlpack(t)


# PyTorch's current stream of a device as an integer. The raw query takes ~0.2 us; the public
# torch.cuda.current_stream builds a Stream object first (~2 us). Inductor's generated code uses the raw one.
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device_index: int) -> int:
    if _raw_current_stream is not None:
        return _raw_current_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


@contextlib.contextmanager
def _on_device(x: Tensor) -> Iterator[int]:
    """Make x's device current (the binding checks it) and yield its current stream as an integer."""
    index = x.device.index
    if index == torch.cuda.current_device():  # the common case: no device switch
        yield _current_stream(index)
        return
    with torch.cuda.device(index):
        yield _current_stream(index)


def _split_operands(weight: Tensor, rows: int, gemm_kind: str, stream: int) -> dict:
    """The GEMM's extra keyword arguments: the split weight and x's scales for the fp32-faithful kernel."""
    if gemm_kind != precision_mod.SPLIT_FP32:
        return {}
    return {name: _dl(t) for name, t in weight_cache.split_gemm_arguments(weight, rows, stream).items()}


def gemm_workspace(
    x: Tensor, N: int, K: int, *, config: int = -1, split: bool = False, splits: int = -1, statistics: bool = True
) -> Tensor | None:
    """The GEMM's workspace for x [M, K] -> N columns on this row (config < 0: the row chosen for a launch
    with partials, or without when not ``statistics``), or None.

    Only stream-K rows need one (their partial accumulators and flags, zeroed by the launch itself).
    """
    size = extension().gemm_workspace_bytes(
        _DTYPE_NAMES[x.dtype], x.shape[0], N, K, config, split, splits, statistics
    )
    return _new_workspace(x, size)


def _new_workspace(x: Tensor, size: int) -> Tensor | None:
    """size bytes of workspace on x's device from PyTorch's cache, or None when the row needs none."""
    return torch.empty(size, dtype=torch.uint8, device=x.device) if size else None


@functools.lru_cache(maxsize=1024)
def _gemm_plan(
    dtype_name: str, M: int, N: int, K: int, split: bool, statistics: bool, device_index: int
) -> tuple[int, int]:
    """(rows per statistics partial, workspace bytes) of the row select_config picks for this launch.

    Both depend only on the shape, whether partials are computed and the device (its SM count sizes a
    stream-K workspace), so a forward looks them up here instead of making two binding calls each time.
    """
    C = extension()
    tile_rows, _ = C.gemm_config(dtype_name, M, N, K, split=split, statistics=statistics)
    return tile_rows, C.gemm_workspace_bytes(dtype_name, M, N, K, -1, split, -1, statistics)


def _plan_for(x: Tensor, N: int, K: int, split: bool, statistics: bool) -> tuple[int, int]:
    return _gemm_plan(_DTYPE_NAMES[x.dtype], x.shape[0], N, K, split, statistics, x.device.index)


def _workspace_argument(x: Tensor, workspace_bytes: int) -> dict:
    """gemm_scale_stats's workspace keyword: {} where the chosen row needs none."""
    workspace = _new_workspace(x, workspace_bytes)
    return {} if workspace is None else {"workspace": _dl(workspace)}


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
    (M, K), N = x.shape, weight.shape[0]
    if momentum is None and num_batches_tracked is None:
        momentum = 0.0  # nn.BatchNorm1d's factor when momentum is None and nothing is tracked
    split = gemm_kind == precision_mod.SPLIT_FP32
    tile_rows, workspace_bytes = _plan_for(x, N, K, split, statistics=True)
    y = x.new_empty((M, N))
    # Normalize in place unless y itself is kept for the backward pass.
    out = torch.empty_like(y) if keep_pre_norm else None
    # Per (row block, column) mean and M2 of y as stored: [0] the means, [1] the M2s.
    partials = torch.empty((2, -(-M // tile_rows), N), dtype=torch.float32, device=x.device)
    save_mean = torch.empty(N, dtype=torch.float32, device=x.device)
    save_invstd = torch.empty_like(save_mean)
    with _on_device(x) as stream:
        extras = {**_split_operands(weight, M, gemm_kind, stream), **_workspace_argument(x, workspace_bytes)}
        # Both launches; the GEMM increments num_batches_tracked (when given) on the device.
        _C.train_forward(
            _dl(x), _dl(weight), _dl(y), _dl(out), _dl(bias), _dl(scale), _dl(gamma), _dl(beta),
            _dl(running_mean), _dl(running_var), _dl(num_batches_tracked), _dl(partials), momentum, eps,
            _dl(save_mean), _dl(save_invstd), stream, **extras,
        )  # fmt: skip
    # The kernels wrote through DLPack, which autograd does not see: count the in-place updates.
    increment_version([t for t in (running_mean, running_var, num_batches_tracked) if t is not None])
    if keep_pre_norm:
        return out, y, save_mean, save_invstd
    return y, y.new_empty(0), save_mean, save_invstd


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
    (M, K), N = x.shape, weight.shape[0]
    _, workspace_bytes = _plan_for(x, N, K, gemm_kind == precision_mod.SPLIT_FP32, statistics=False)
    out = x.new_empty((M, N))
    affine = torch.empty((2, N), dtype=torch.float32, device=x.device)  # the folded gain and shift
    with _on_device(x) as stream:
        extras = {**_split_operands(weight, M, gemm_kind, stream), **_workspace_argument(x, workspace_bytes)}
        _C.eval_forward(
            _dl(x), _dl(weight), _dl(out), _dl(bias), _dl(scale), _dl(gamma), _dl(beta), _dl(running_mean),
            _dl(running_var), eps, _dl(affine), stream, **extras,
        )  # fmt: skip
    return out


# --- backward ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _backward_workspace_bytes(dtype_name: str, M: int, N: int, device_index: int) -> int:
    """batch_norm_backward's workspace for [M, N] (it depends on the device's SM count, hence the index)."""
    return extension().batch_norm_backward_workspace_bytes(dtype_name, M, N)


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
) -> tuple[Tensor | None, ...]:
    """(dz = s dL/dy [M, N], dgamma, dbeta, dbias, dscale), each in dout's dtype where ``outputs`` (ordered so)
    asks for it, else None: api.h's math, one launch.

    Tensors contiguous and 16-byte aligned, of dout's dtype but mean and invstd (float32 [N]: the running
    statistics when not ``batch_statistics``); y may be None only then, and neither dgamma nor dscale asked for.
    """
    _C = extension()
    M, N = dout.shape
    dz = torch.empty_like(dout) if outputs[0] else None
    dgamma, dbeta, dbias, dscale = (dout.new_empty(N) if need else None for need in outputs[1:])
    with _on_device(dout) as stream:
        size = _backward_workspace_bytes(_DTYPE_NAMES[dout.dtype], M, N, dout.device.index)
        workspace = torch.empty(size, dtype=torch.uint8, device=dout.device)
        _C.batch_norm_backward(
            _dl(dout), _dl(y), _dl(dz), _dl(mean), _dl(invstd), _dl(gamma), _dl(scale), _dl(x), _dl(weight),
            _dl(bias), batch_statistics, _dl(workspace), _dl(dgamma), _dl(dbeta), _dl(dbias), _dl(dscale), stream,
        )  # fmt: skip
    return dz, dgamma, dbeta, dbias, dscale


def matmul(a: Tensor, b_rows: Tensor, gemm_kind: str) -> Tensor:
    """a @ b_rows^T in float32 on gemmbn's GEMM (no epilogue): a [M, K], b_rows [N, K], contiguous float32, K and
    N multiples of 4; the fp32-faithful split GEMM or TF32. For the split GEMM b_rows is split on every call (the
    backward's operands change every step; the weight cache would keep each one alive)."""
    if gemm_kind != precision_mod.SPLIT_FP32:
        return linear_scale(a, b_rows, None, None, gemm_kind)
    _C = extension()
    M, N = a.shape[0], b_rows.shape[0]
    out = a.new_empty((M, N))
    with _on_device(a) as stream:
        weight_split, weight_unscale = weight_cache.split_now(b_rows, stream)
        x_scale = torch.empty(_C.row_scale_count(M), dtype=torch.float32, device=a.device)
        _C.gemm_scale_stats(
            _dl(a), _dl(b_rows), _dl(out), None, None, None, None, None, None, None, stream,
            weight_split=_dl(weight_split), weight_unscale=_dl(weight_unscale), x_scale=_dl(x_scale),
        )  # fmt: skip
    return out


def transpose_padded(t: Tensor) -> Tensor:
    """t [R, C] (contiguous float32) transposed into a new [C, R'], R' = R rounded up to a multiple of 4, the
    columns past R zero: the split GEMM's operand where the reduction runs down t's columns."""
    R, C = t.shape
    out = t.new_empty((C, -(-R // 4) * 4))
    with _on_device(t) as stream:
        extension().transpose_padded(_dl(t), _dl(out), stream)
    return out


def linear_scale(x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, gemm_kind: str) -> Tensor:
    """y = (x W^T + b) s on the fused GEMM without statistics (the eval backward's y; scale None: 1)."""
    _C = extension()
    (M, K), N = x.shape, weight.shape[0]
    _, workspace_bytes = _plan_for(x, N, K, gemm_kind == precision_mod.SPLIT_FP32, statistics=False)
    y = x.new_empty((M, N))
    with _on_device(x) as stream:
        extras = {**_split_operands(weight, M, gemm_kind, stream), **_workspace_argument(x, workspace_bytes)}
        _C.gemm_scale_stats(
            _dl(x), _dl(weight), _dl(y), _dl(bias), _dl(scale), None, None, None, None, None, stream, **extras
        )  # fmt: skip
    return y
