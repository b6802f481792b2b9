"""Whether a call can take the fused path, answered ahead of the call: ``gemmbn.fused_plan`` (public).

The forward and backward do not ask it: they call the native operators, which check the same facts in C++ and
refuse before anything runs (the callers then fall back). This module mirrors those checks for users who want
the verdict up front; tests/test_operators_gpu.py holds the two to the same answers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._native import fused_unavailable_reason

_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT32_LIMIT = 2**31  # the kernels index with 32-bit ints
_ALIGNMENT = 16  # bytes: TMA tiles and 16-byte vector accesses


def _present(weight: Tensor, vectors: dict[str, Tensor | None]) -> dict[str, Tensor]:
    """weight and the vectors that are not None, by name."""
    return {"weight": weight, **{name: t for name, t in vectors.items() if t is not None}}


def _size_reason(x: Tensor, weight: Tensor, present: dict[str, Tensor]) -> str | None:
    """None when the dtypes and sizes suit the kernels (``present``: _present's tensors), else why not."""
    if x.dtype not in _FUSED_DTYPES:
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


def layout_reason(
    x: Tensor, weight: Tensor, vectors: dict[str, Tensor | None], eps: float, batches_tracked: Tensor | None = None
) -> str | None:
    """None when dtypes, sizes and alignment suit the kernels, else the first reason they do not.

    ``x`` and ``weight`` are expected contiguous already (the ops make them so); ``vectors`` maps
    names to the [N] tensors (bias, scale, gamma, beta, running stats), None entries ignored.
    """
    present = _present(weight, vectors)
    reason = _size_reason(x, weight, present)
    if reason is not None:
        return reason
    if batches_tracked is not None and batches_tracked.dtype != torch.int64:
        return f"num_batches_tracked is {batches_tracked.dtype}; the kernels count in int64"
    for name, tensor in {"x": x, **present}.items():
        if not tensor.is_contiguous():
            return f"{name} is not contiguous"
        if tensor.data_ptr() % _ALIGNMENT:
            return f"{name}'s data pointer is not 16-byte aligned"
    if not eps > 0:
        return f"eps={eps} is not positive (the kernels need sqrt(var + eps) > 0)"
    return None


def fused_plan(
    x: Tensor,
    weight: Tensor,
    vectors: dict[str, Tensor | None],
    eps: float,
    batches_tracked: Tensor | None = None,
) -> str | None:
    """None when the fused kernels can run this call, else why not (device first, then layout)."""
    return fused_unavailable_reason(x) or layout_reason(x, weight, vectors, eps, batches_tracked)
