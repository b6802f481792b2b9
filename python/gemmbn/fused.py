"""The fused (native) forward paths: allocate outputs and workspace, launch gemmbn._C kernels.

Callers have checked eligibility with plan.fused_plan. Every launch goes on PyTorch's current stream
of x's device and nothing here synchronizes with the host, so the paths are CUDA-graph capturable.
Tensors cross into the extension as DLPack capsules made by torch.utils.dlpack.to_dlpack: 0.4 us each,
where handing nanobind the tensor makes it call Tensor.__dlpack__ (3.3 us, and it refuses tensors that
require grad); a forward passes ~19, so this is most of its host time on a small problem. Capsules
share storage, so in-place updates of the running statistics land in the caller's buffers.
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


@contextlib.contextmanager
def _on_device(x: Tensor) -> Iterator[int]:
    """Make x's device current (the binding checks it) and yield its current stream as an integer."""
    already_current = x.device.index == torch.cuda.current_device()  # the common case: no device switch
    with contextlib.nullcontext() if already_current else torch.cuda.device(x.device):
        yield torch.cuda.current_stream(x.device).cuda_stream


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
    y = x.new_empty((M, N))
    # Separate allocations: unpacking one [2, N] tensor (unbind) costs more host time than a second empty.
    save_mean = torch.empty(N, dtype=torch.float32, device=x.device)
    save_invstd = torch.empty_like(save_mean)
    split = gemm_kind == precision_mod.SPLIT_FP32
    with _on_device(x) as stream:
        tile_rows, workspace_bytes = _plan_for(x, N, K, split, statistics=True)
        # Per (row block, column) mean and M2 of y as stored.
        partial_means = torch.empty((-(-M // tile_rows), N), dtype=torch.float32, device=x.device)
        partial_m2s = torch.empty_like(partial_means)
        # Normalize in place unless y itself is kept for the backward pass.
        out = torch.empty_like(y) if keep_pre_norm else y
        # The launch increments num_batches_tracked (when given) on the device.
        gemm_args = (
            _dl(x), _dl(weight), _dl(y), _dl(bias), _dl(scale), None, None, _dl(partial_means), _dl(partial_m2s),
            _dl(num_batches_tracked), stream,
        )  # fmt: skip
        # A capsule is consumed by the call that takes it, so the finish gets its own; made before the
        # GEMM's launch so that little host time separates the two launches (it shows at small shapes).
        finish_args = (
            _dl(y), _dl(out), _dl(partial_means), _dl(partial_m2s), tile_rows, _dl(gamma), _dl(beta),
            _dl(running_mean), _dl(running_var), _dl(num_batches_tracked), momentum, eps,
            _dl(save_mean), _dl(save_invstd), stream,
        )  # fmt: skip
        gemm_extras = {**_split_operands(weight, M, gemm_kind, stream), **_workspace_argument(x, workspace_bytes)}
        _C.gemm_scale_stats(*gemm_args, **gemm_extras)
        _C.finish_normalize(*finish_args)
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
    (M, K), N = x.shape, weight.shape[0]
    gain = torch.empty(N, dtype=torch.float32, device=x.device)
    shift = torch.empty_like(gain)
    out = x.new_empty((M, N))
    with _on_device(x) as stream:
        _, workspace_bytes = _plan_for(x, N, K, gemm_kind == precision_mod.SPLIT_FP32, statistics=False)
        _C.fold_eval_affine(
            _dl(gamma), _dl(beta), _dl(running_mean), _dl(running_var), eps, _dl(gain), _dl(shift), stream
        )
        _C.gemm_scale_stats(
            _dl(x), _dl(weight), _dl(out), _dl(bias), _dl(scale), _dl(gain), _dl(shift), None, None, None, stream,
            **_split_operands(weight, M, gemm_kind, stream),
            **_workspace_argument(x, workspace_bytes),
        )
    return out
