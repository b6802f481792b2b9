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

import threading
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from ._native import call, operator


@dataclass
class _Entry:
    owners: tuple  # weak references to the folded tensors (None where an optional one was None)
    signature: tuple  # per tensor (data_ptr, version), then x's dtype and device, and eps
    affine: Tensor


_entries: dict[int, _Entry] = {}
_lock = threading.Lock()


def clear() -> None:
    """Forget every cached affine (after writing a running statistic or a parameter through ``.data``, say)."""
    with _lock:
        _entries.clear()


def affine(x: Tensor, weight: Tensor, bias, scale, gamma, beta, running_mean, running_var, eps: float) -> Tensor | None:
    """[2, N] float32 (gain, shift) of eval_forward's fold, folded on the current stream when stale (Refused as the
    operator refuses); None where it is not to be cached (above): eval_forward folds inside then. The stream argument
    is weight_cache.split_weight's: the fold is ordered before the GEMM that first reads it; a later forward on another
    stream is ordered by the caller's synchronization of the inputs."""
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return None
    inputs = (bias, scale, gamma, beta, running_mean, running_var)
    signature = _signature(x, inputs, eps)
    if signature is None:
        return None
    key = id(running_mean)
    with _lock:
        entry = _entries.get(key)
        if (
            entry is not None
            and entry.signature == signature
            and all(map(_refers_to, entry.owners, inputs))
        ):
            return entry.affine
    folded = call(operator("eval_affine"), x, weight, *inputs, eps)
    owners = tuple(None if t is None else weakref.ref(t) for t in inputs)
    owners = owners[:4] + (weakref.ref(running_mean, lambda _, key=key: _evict(key)),) + owners[5:]
    with _lock:
        _entries[key] = _Entry(owners, signature, folded)
    return folded


def _signature(x: Tensor, inputs: tuple, eps: float) -> tuple | None:
    """What a cached affine was folded from, or None where an input has no version counter (an inference tensor)."""
    try:
        return (*[None if t is None else (t.data_ptr(), t._version) for t in inputs], x.dtype, x.device, eps)
    except RuntimeError:  # "Inference tensors do not track version counter"
        return None


def _refers_to(owner, t) -> bool:
    return t is None if owner is None else owner() is t


def _evict(key: int) -> None:
    with _lock:
        entry = _entries.get(key)
        if entry is not None and entry.owners[4]() is None:
            del _entries[key]
