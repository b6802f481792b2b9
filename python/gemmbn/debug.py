"""The kernels one at a time, for tests, tuning and profiling (perf/): torch.ops.gemmbn_debug
(python/csrc/debug_operators.cpp) with Python defaults.

The forward and backward never come here (fused.py calls the operators). These take the caller's buffers,
launch on torch's current stream, and refuse bad arguments with a RuntimeError starting "gemmbn: " before
anything runs. dtype names: "float32", "bfloat16", "float16"; split: the fp32-faithful GEMM's table.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import weight_cache
from ._native import load_operators

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

# gemm_config_row's fields, in api.h's order (kConfigFields).
CONFIG_FIELDS = ("tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "epilogue_n", "pingpong", "raster",
                 "swizzle", "promote_tiles", "stream_k", "statistics", "presplit", "merge_per_tile",
                 "partial_rows")  # fmt: skip


@functools.cache
def _ops():
    reason = load_operators()
    if reason is not None:
        raise RuntimeError(reason)
    return torch.ops.gemmbn_debug


def device_support(device: int) -> tuple[bool, str]:
    """(True, "") where the fused kernels run on this CUDA device, else (False, why not)."""
    supported, why = _ops().device_support(device)
    return bool(supported), why


def gemm_config(dtype: str, M: int, N: int, K: int, config: int = -1, split: bool = False,
                statistics: bool = True) -> tuple[int, int]:  # fmt: skip
    """(partial_rows, tile_n) of the configuration row the GEMM runs for this problem (config < 0: the one chosen;
    statistics: the choice for a launch with partials, False: without, as the eval forward's)."""
    row = _ops().gemm_config_row(dtype, M, N, K, config, split, statistics)
    return row[-1], row[1]


def gemm_launch_config(dtype: str, M: int, N: int, K: int, config: int = -1, split: bool = False,
                       statistics: bool = True) -> dict[str, int]:  # fmt: skip
    """The configuration row as this problem's launch takes it (config < 0: the row chosen): CONFIG_FIELDS, with the
    swizzle reduced where the row's would pad the tile grid (configs.h unpadded_swizzle)."""
    return dict(zip(CONFIG_FIELDS, _ops().gemm_config_row(dtype, M, N, K, config, split, statistics)))


def gemm_selected_config(dtype: str, M: int, N: int, K: int, split: bool = False, statistics: bool = True,
                         dram_gbps: int | None = None) -> int:  # fmt: skip
    """Index into gemm_configs of the row chosen for this problem on the current device (dram_gbps None), or on a
    device whose peak DRAM bandwidth is dram_gbps GB/s (0: unknown), the one device fact the rule reads."""
    return _ops().gemm_selected_config(dtype, M, N, K, split, statistics, -1 if dram_gbps is None else dram_gbps)


def device_dram_gbps() -> int:
    """The current CUDA device's peak DRAM bandwidth in GB/s as the row rule reads it (0: no device to ask)."""
    return _ops().device_dram_gbps()


def ragged_tile_from_y() -> bool:
    """Whether this build's GEMM leaves the partials of a ragged last row block (M not a multiple of partial_rows)
    unwritten and finish_normalize reads those rows from y instead (CMake GEMMBN_RAGGED_TILE_FROM_Y, on by default)."""
    return bool(_ops().ragged_tile_from_y())


def gemm_selected_splits(M: int, N: int) -> int:
    """Split-K factor a stream-K row's call gets for an M x N output when it names none (1: CUTLASS's heuristic)."""
    return _ops().gemm_selected_splits(M, N)


def train_statistics_from_y(dtype: str, M: int, N: int, K: int, split: bool = False) -> bool:
    """Whether the training forward takes its statistics from finish_normalize's pass over y (else the GEMM's
    epilogue): the rule, or GEMMBN_STATISTICS_SOURCE=epilogue|y where set."""
    return _ops().train_statistics_from_y(dtype, M, N, K, split)


def train_product_by_cublas(dtype: str, M: int, N: int, K: int) -> bool:
    """Whether the training forward's product x W^T is cuBLAS's (torch's mm, then finish_normalize's product variant:
    bias, scale, statistics from y) rather than gemmbn's GEMM: the rule, or GEMMBN_TRAIN_PRODUCT=cublas|gemmbn where
    set (16-bit only)."""
    return _ops().train_product_by_cublas(dtype, M, N, K)


HOST_MARKS = ("operator_entered", "gemm_launching", "gemm_enqueued")


def host_mark_ns(mark: str) -> int:
    """time.clock_gettime_ns(time.CLOCK_MONOTONIC) as it read when this process last passed a point of a forward's
    host path (0: not yet): "operator_entered" (a forward operator began), "gemm_launching" (the GEMM's checks done,
    its launch next) or "gemm_enqueued" (the GEMM launched). A call's host time to a point is its mark minus the
    clock at the call's start (perf/host_overhead.py --mark)."""
    if mark not in HOST_MARKS:
        raise ValueError(f"mark must be one of {HOST_MARKS}, got {mark!r}")
    return _ops().host_mark_ns(HOST_MARKS.index(mark))


def monotonic_ns() -> int:
    """The native side's reading of CLOCK_MONOTONIC now (the clock of host_mark_ns)."""
    return _ops().monotonic_ns()


def gemm_configs(dtype: str, split: bool = False) -> list[dict[str, int]]:
    """The configuration table (kernels/include/gemmbn/configs.h), one dict of CONFIG_FIELDS per row (swizzle: the
    table's, as a problem of 196608 x 196608 outputs gets it: 3 x 2^16, whose tile grid every tile width (96 too),
    swizzle and cluster divides)."""
    ops = _ops()
    return [dict(zip(CONFIG_FIELDS, ops.gemm_config_row(dtype, 196608, 196608, 1, i, split, True)))
            for i in range(ops.gemm_config_count(dtype, split))]  # fmt: skip


def gemm_workspace_bytes(dtype: str, M: int, N: int, K: int, config: int = -1, split: bool = False,
                         splits: int = -1, statistics: bool = True, raster: int = -1, swizzle: int = -1) -> int:  # fmt: skip
    """Bytes of workspace gemm_scale_stats needs on this row (0 except on stream-K rows and the split GEMM's presplit
    rows, whose workspace holds x's fp16 pairs), with the launch's tile order (raster, swizzle: -1 as a launch that
    names none)."""
    return _ops().gemm_workspace_bytes(dtype, M, N, K, config, split, splits, statistics, raster, swizzle)


def split_weight_columns(K: int) -> int:
    """Columns of the split weight (fp16 hi and lo) for K input features."""
    return _ops().split_weight_columns(K)


def row_scale_count(M: int) -> int:
    """Entries of the split GEMM's x_scale workspace for M rows (whole 128-row tiles)."""
    return _ops().row_scale_count(M)


def gemm_scale_stats(
    x: Tensor, weight: Tensor, y: Tensor, bias: Tensor | None, scale: Tensor | None, gain: Tensor | None,
    shift: Tensor | None, partial_mean: Tensor | None, partial_m2: Tensor | None, batches_tracked: Tensor | None,
    *, config: int = -1, raster: int = -1, swizzle: int = -1, splits: int = -1, weight_split: Tensor | None = None,
    weight_unscale: Tensor | None = None, x_scale: Tensor | None = None, workspace: Tensor | None = None,
) -> None:  # fmt: skip
    """y = ((x W^T + bias) scale) gain + shift, with the per-tile column mean/M2 of y as stored (api.h)."""
    _ops().gemm_scale_stats(x, weight, y, bias, scale, gain, shift, partial_mean, partial_m2, batches_tracked,
                            config, raster, swizzle, splits, weight_split, weight_unscale, x_scale, workspace)  # fmt: skip


def finish_normalize(
    y: Tensor, out: Tensor, partial_mean: Tensor, partial_m2: Tensor, tile_rows: int, gamma: Tensor | None,
    beta: Tensor | None, running_mean: Tensor | None, running_var: Tensor | None, batches_tracked: Tensor | None,
    momentum: float | None, eps: float, save_mean: Tensor, save_invstd: Tensor,
) -> None:  # fmt: skip
    """Merge the partials, update the running statistics, out = (y - mean) invstd gamma + beta (api.h)."""
    _ops().finish_normalize(y, out, partial_mean, partial_m2, tile_rows, gamma, beta, running_mean, running_var,
                            batches_tracked, momentum, eps, save_mean, save_invstd)  # fmt: skip


def fold_eval_affine(gamma: Tensor | None, beta: Tensor | None, running_mean: Tensor, running_var: Tensor,
                     eps: float, gain: Tensor, shift: Tensor, bias: Tensor | None = None,
                     scale: Tensor | None = None) -> None:  # fmt: skip
    """gain = s gamma / sqrt(running_var + eps), shift = beta + (b s - running_mean) gamma / sqrt(running_var + eps)
    (float32), with the linear layer's bias b and scale s (None: 0 and 1) folded in, as the eval operator does."""
    _ops().fold_eval_affine(gamma, beta, bias, scale, running_mean, running_var, eps, gain, shift)


def gemm_workspace(
    x: Tensor, N: int, K: int, *, config: int = -1, split: bool = False, splits: int = -1, statistics: bool = True,
    raster: int = -1, swizzle: int = -1,
) -> Tensor | None:
    """gemm_scale_stats's workspace for x [M, K] -> N columns on this row (config < 0: the row chosen for a launch
    with partials, or without when not ``statistics``), or None where the row needs none (all but stream-K and presplit
    rows)."""
    size = gemm_workspace_bytes(_DTYPE_NAMES[x.dtype], x.shape[0], N, K, config, split, splits, statistics, raster,
                                swizzle)  # fmt: skip
    return torch.empty(size, dtype=torch.uint8, device=x.device) if size else None


def split_gemm_arguments(weight: Tensor, rows: int) -> dict[str, Tensor]:
    """gemm_scale_stats's keyword arguments for the split GEMM of ``rows`` rows of x against ``weight``: the cached
    split weight (weight_cache) and a fresh x_scale workspace (row_scales fills it inside the call)."""
    weight_split, weight_unscale = weight_cache.split_weight(weight)
    x_scale = torch.empty(row_scale_count(rows), dtype=torch.float32, device=weight.device)
    return {"weight_split": weight_split, "weight_unscale": weight_unscale, "x_scale": x_scale}
