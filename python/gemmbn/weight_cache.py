"""The fp32-faithful GEMM's weight operand (the gemmbn::split_weight operator), cached against the weight's version.

split_weight turns W [N, K] (float32) into scaled fp16 hi/lo parts in the kernel's layout plus a
per-row power of two; it reads W once (~0.03 ms at 4096x4096), a small part of a forward but wasted
when W did not change. The cache keeps one split per weight tensor and makes it again whenever the
tensor's storage or its version counter moved: every in-place update through the tensor (an
optimizer step, ``copy_``, ``load_state_dict``) bumps the counter. Writes through ``weight.data``
bypass the counter, as they bypass autograd; call ``clear()`` after such a write.

While a CUDA graph is being captured the split is always made inside the capture, so each replay
re-splits the weight as it is then (the cache cannot see updates made between replays). Traced (torch.export,
torch.compile) the split is likewise an operator of the graph, made on every run: a cache entry would hold the
trace's fake tensors.
"""

from __future__ import annotations

from torch import Tensor

from ._native import call, operator
from .version_cache import VersionCache

_cache = VersionCache()


def clear() -> None:
    """Forget every cached split (after writing a weight through ``.data``, say)."""
    _cache.clear()


def split_now(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(weight_split, weight_unscale) of a float32 [N, K] CUDA tensor, made on the current stream, uncached."""
    return call(operator("split_weight"), weight)


def split_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(weight_split, weight_unscale) of a float32 CUDA weight, made on the current stream when stale.

    The split is made on the stream of the forward that first needs it, and the GEMM after it runs on
    that stream too, so no event is needed: a later forward on another stream is ordered by the
    caller's own synchronization of the weight, as any read of it would be.
    """
    cached = _cache.get(weight, (weight,), weight.shape, lambda: split_now(weight))
    return cached if cached is not None else split_now(weight)
