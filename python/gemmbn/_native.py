"""The compiled extension gemmbn._C, imported on first use.

The package works without it (everything falls back to the PyTorch reference), so a missing or
broken build is recorded as a reason instead of failing ``import gemmbn``.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from torch import Tensor


@functools.cache
def _load() -> tuple[ModuleType | None, str | None]:
    """(module, None) once gemmbn._C imports, else (None, why not)."""
    try:
        return importlib.import_module("gemmbn._C"), None
    except ImportError as error:
        return None, f"the native extension gemmbn._C is not available ({error})"


def extension() -> ModuleType:
    """gemmbn._C; raises RuntimeError with the import failure if it is not built."""
    module, reason = _load()
    if module is None:
        raise RuntimeError(reason)
    return module


@functools.cache
def _device_reason(device_index: int) -> str | None:
    """None where _C.device_support accepts the CUDA device, else its reason (cached per device)."""
    supported, reason = extension().device_support(device_index)
    return None if supported else f"cuda:{device_index} cannot run the fused kernels: {reason}"


def fused_unavailable_reason(x: Tensor) -> str | None:
    """None when the native path can run on x's device; else why not (CPU, no extension, not sm90)."""
    if not x.is_cuda:
        return f"x is on {x.device.type}; the fused kernels need an sm90 (Hopper) GPU"
    module, reason = _load()
    if module is None:
        return reason
    return _device_reason(x.device.index if x.device.index is not None else 0)
