"""The eval forward's folded affine (the gemmbn::eval_affine operator), cached against its inputs' versions.

In eval mode the per-column gain and shift that fold BatchNorm's running statistics, gamma, beta and the linear
layer's bias and scale into the GEMM's epilogue change only when one of those tensors does; folding them on every call
costs a small kernel launch, 10-20% of the smallest forwards (perf/NOTES.md v21). The cache keeps one [2, N] affine
per running_mean tensor (one per layer) and folds again whenever any input tensor was replaced, moved storage or
bumped its version counter: every in-place update through a tensor (an optimizer step, a training forward's
running-statistics update, ``copy_``, ``load_state_dict``, ``resize_``) bumps it. Writes through ``.data`` bypass the
counter, as they bypass autograd; call ``clear()`` after such a write (weight_cache.py has the same contract).

Inference tensors have no version counter and are folded on every call; so is every call while a CUDA graph is being
captured (a replay re-folds the vectors as they are then) or traced (torch.compile, torch.export: the graph calls
gemmbn::eval_forward, fold included).
"""

from __future__ import annotations

from torch import Tensor

from ._native import call, operator
from .version_cache import VersionCache

_cache = VersionCache()


def clear() -> None:
    """Forget every cached affine (after writing a running statistic or a parameter through ``.data``, say)."""
    _cache.clear()


def affine(x: Tensor, weight: Tensor, bias, scale, gamma, beta, running_mean, running_var, eps: float) -> Tensor | None:
    """[2, N] float32 (gain, shift) of eval_forward's fold, folded on the current stream when stale (Refused as the
    operator refuses); None where it is not to be cached (above): eval_forward folds inside then. The stream argument
    is weight_cache.split_weight's: the fold is ordered before the GEMM that first reads it; a later forward on another
    stream is ordered by the caller's synchronization of the inputs."""
    inputs = (bias, scale, gamma, beta, running_mean, running_var)
    return _cache.get(running_mean, inputs, (x.dtype, x.device, eps),
                      lambda: call(operator("eval_affine"), x, weight, *inputs, eps))  # fmt: skip
