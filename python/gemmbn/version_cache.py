"""Values made from tensors and kept while none of those tensors changes: weight_cache.py's split weight and
eval_fold_cache.py's folded eval affine.

An entry is keyed on one of its tensors (the key tensor, by identity) and is stale once any of its tensors was
replaced, moved storage or bumped its version counter (every in-place update through a tensor does), or the caller's
``extra`` facts changed. Writes through ``.data`` bypass the counter; the owning module's ``clear()`` is the answer
there. An entry goes as soon as any of its tensors is freed (a weak reference's callback), so while it is kept the
tensor ids in its signature name those tensors and no later ones: a hit compares the signature alone.

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
    owners: tuple  # weak references to the tensors, each evicting the entry (None where an optional one was None)
    signature: tuple  # per tensor (id, data_ptr, version), then the caller's extra facts
    value: Any


class VersionCache:
    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        # Reentrant: an eviction callback can run inside get's own locked section, when an allocation there lets the
        # garbage collector free a cached tensor that sits in a reference cycle.
        self._lock = threading.RLock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def get(self, key: Tensor, tensors: tuple, extra: Any, make: Callable[[], Any]) -> Any | None:
        """The value made by ``make()`` from ``tensors`` (which hold ``key``; None entries allowed) and ``extra``: the
        kept one while none changed, else made now and kept; None where nothing may be cached (module docstring)."""
        if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
            return None
        try:
            signature = (*[None if t is None else (id(t), t.data_ptr(), t._version) for t in tensors], extra)
        except RuntimeError:  # "Inference tensors do not track version counter"
            return None
        index = id(key)
        with self._lock:
            entry = self._entries.get(index)
            if entry is not None and entry.signature == signature:
                return entry.value
        value = make()

        def evict(_, index=index, signature=signature) -> None:
            self._evict(index, signature)

        owners = tuple(None if t is None else weakref.ref(t, evict) for t in tensors)
        with self._lock:
            self._entries[index] = _Entry(owners, signature, value)
        return value

    def _evict(self, index: int, signature: tuple) -> None:
        """One of the tensors of the entry made with ``signature`` was freed: drop that entry (not a newer one)."""
        with self._lock:
            entry = self._entries.get(index)
            if entry is not None and entry.signature is signature:
                del self._entries[index]
