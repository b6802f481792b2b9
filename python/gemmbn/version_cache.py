"""Values made from tensors and kept while none of those tensors changes: weight_cache.py's split weight and
eval_fold_cache.py's folded eval affine.

An entry is keyed on one of its tensors (the key tensor, by identity) and is stale once any of its tensors was
replaced (weak references: identity, not a reused id), moved storage or bumped its version counter (every in-place
update through a tensor does), or the caller's ``extra`` facts changed. Writes through ``.data`` bypass the counter;
the owning module's ``clear()`` is the answer there. An entry goes when its key tensor is freed.

Nothing is cached while torch.compile or torch.export traces (an entry would hold fake tensors), while a CUDA graph is
being captured (a replay must make the value again from the tensors as they are then), or for an inference tensor
(no version counter): ``get`` answers None and the caller makes the value uncached.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class _Entry:
    owners: tuple  # weak references to the tensors (None where an optional one was None)
    key_at: int  # the key tensor's place among them
    signature: tuple  # per tensor (data_ptr, version), then the caller's extra facts
    value: Any


class VersionCache:
    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def get(self, key: Tensor, tensors: tuple, extra: Any, make: Callable[[], Any]) -> Any | None:
        """The value made by ``make()`` from ``tensors`` (which hold ``key``; None entries allowed) and ``extra``: the
        kept one while none changed, else made now and kept; None where nothing may be cached (module docstring)."""
        if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
            return None
        try:
            signature = (*[None if t is None else (t.data_ptr(), t._version) for t in tensors], extra)
        except RuntimeError:  # "Inference tensors do not track version counter"
            return None
        index = id(key)
        with self._lock:
            entry = self._entries.get(index)
            if entry is not None and entry.signature == signature and all(map(_refers_to, entry.owners, tensors)):
                return entry.value
        value = make()
        key_at = next(i for i, t in enumerate(tensors) if t is key)
        owners = tuple(None if t is None else weakref.ref(t) for t in tensors)
        owners = owners[:key_at] + (weakref.ref(key, lambda _, index=index: self._evict(index)),) + owners[key_at + 1:]
        with self._lock:
            self._entries[index] = _Entry(owners, key_at, signature, value)
        return value

    def _evict(self, index: int) -> None:
        """The key tensor was freed: drop its entry (unless a newer tensor with the same id has one now)."""
        with self._lock:
            entry = self._entries.get(index)
            if entry is not None and entry.owners[entry.key_at]() is None:
                del self._entries[index]


def _refers_to(owner, t) -> bool:
    return t is None if owner is None else owner() is t
