"""Whether a call can take the fused path, answered ahead of the call: ``gemmbn.fused_plan`` (public).

Eager calls do not ask it: they call the native operators, which check the same facts in C++ and refuse before
anything runs (the callers then fall back). This module mirrors those checks for users who want the verdict up
front, and for traced graphs (torch.compile), which must choose their route without data: ``static_reason``.
tests/test_operators_gpu.py holds the plan to the operators' answers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._native import fused_unavailable_reason
from .precision import FUSED_DTYPES

_INT32_LIMIT = 2**31  # the kernels index with 32-bit ints
_ALIGNMENT = 16  # bytes: TMA tiles and 16-byte vector accesses


def _present(weight: Tensor, vectors: dict[str, Tensor | None]) -> dict[str, Tensor]:
    """weight and the vectors that are not None, by name."""
    return {"weight": weight, **{name: t for name, t in vectors.items() if t is not None}}


def _size_reason(x: Tensor, weight: Tensor, present: dict[str, Tensor]) -> str | None:
    """None when the dtypes and sizes suit the kernels (``present``: _present's tensors), else why not."""
    if x.dtype not in FUSED_DTYPES:
        return f"dtype {x.dtype} has no fused kernel (float32, bfloat16 and float16 do)"
    for name, tensor in present.items():
        if tensor.dtype != x.dtype:
            return f"{name} is {tensor.dtype} but x is {x.dtype}; the fused kernels take one dtype for all tensors"
    (M, K), N = x.shape, weight.shape[0]
    for dim, size in (("M", M), ("N", N), ("K", K)):
        if not 0 < size < _INT32_LIMIT:
            return f"{dim}={size} is outside [1, 2**31) (the kernels index with 32-bit integers)"
    elements_per_row = _ALIGNMENT // x.element_size()
    for dim, size in (("K", K), ("N", N)):
        if size % elements_per_row:
            return (
                f"{dim}={size} is not a multiple of {elements_per_row} "
                f"(TMA needs 16-byte rows of {x.dtype})"
            )
    return None


# The tensors the kernels update in place: the operators cannot copy them into the kernels' layout (a copy would not
# carry the update back), so these alone must arrive contiguous and aligned. Every other operand may be a view.
_WRITTEN = ("running_mean", "running_var")


def layout_reason(
    x: Tensor, weight: Tensor, vectors: dict[str, Tensor | None], eps: float, batches_tracked: Tensor | None = None
) -> str | None:
    """None when the dtypes, sizes and strides suit the kernels, else the first reason they do not (data pointers
    aside). ``vectors`` maps names to the [N] tensors (bias, scale, gamma, beta, running stats), None entries ignored.
    """
    present = _present(weight, vectors)
    reason = _size_reason(x, weight, present)
    if reason is not None:
        return reason
    if batches_tracked is not None and batches_tracked.dtype != torch.int64:
        return f"num_batches_tracked is {batches_tracked.dtype}; the kernels count in int64"
    for name in _WRITTEN:
        if name in present and not present[name].is_contiguous():
            return f"{name} is not contiguous (the kernels update it in place)"
    if not eps > 0:
        return f"eps={eps} is not positive (the kernels need sqrt(var + eps) > 0)"
    return None


def static_reason(
    x: Tensor, weight: Tensor, vectors: dict[str, Tensor | None], eps: float, batches_tracked: Tensor | None = None
) -> str | None:
    """The device's reason, then layout_reason's: everything but data pointers, so it answers for the fake tensors of
    a trace too (a traced graph takes the fused path on it; a running buffer at an unaligned address is then refused
    when the graph runs)."""
    return fused_unavailable_reason(x) or layout_reason(x, weight, vectors, eps, batches_tracked)


def fused_plan(
    x: Tensor,
    weight: Tensor,
    vectors: dict[str, Tensor | None],
    eps: float,
    batches_tracked: Tensor | None = None,
) -> str | None:
    """None when the fused kernels can run this call, else why not (device first, then layout).

    ``vectors`` maps names to the [N] tensors (bias, scale, gamma, beta, running_mean, running_var), None entries
    ignored. Operands the kernels only read may have any strides and offset (the operators copy them into the
    kernels' layout); the running statistics must be contiguous and 16-byte aligned.
    """
    reason = static_reason(x, weight, vectors, eps, batches_tracked)
    if reason is not None:
        return reason
    for name in _WRITTEN:
        tensor = vectors.get(name)
        if tensor is not None and tensor.data_ptr() % _ALIGNMENT:
            return f"{name}'s data pointer is not 16-byte aligned (the kernels update it in place)"
    return None
