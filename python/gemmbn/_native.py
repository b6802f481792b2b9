"""The compiled parts, loaded on first use: the torch operators (gemmbn/_operators.so: every launch of a forward or
backward) and the extension gemmbn._C (device support queries and the perf tools' single-kernel calls).

The package works without them (everything falls back to the PyTorch reference), so a missing or broken
build is recorded as a reason instead of failing ``import gemmbn``.
"""

from __future__ import annotations

import functools
import importlib
import pathlib
import types
from types import ModuleType

import torch
from torch import Tensor

# The operators use LibTorch's stable ABI as of torch 2.10 (CMakeLists.txt: TORCH_TARGET_VERSION).
OPERATORS_MIN_TORCH = (2, 10)
OPERATOR_NAMES = ("train_forward", "eval_forward", "linear_scale", "split_weight", "transpose_padded",
                  "batch_norm_backward")  # fmt: skip


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


@functools.cache
def load_operators() -> str | None:
    """None once gemmbn's operators are registered with torch's dispatcher (gemmbn/_operators.so), else why not."""
    if _torch_version() < OPERATORS_MIN_TORCH:
        return (f"torch {torch.__version__} is older than 2.10, whose stable ABI gemmbn's native operators are built "
                "on")  # fmt: skip
    path = pathlib.Path(__file__).with_name("_operators.so")
    if not path.exists():
        return f"gemmbn's native operators are not built ({path.name} is missing next to {pathlib.Path(__file__).name})"
    try:
        torch.ops.load_library(str(path))
    except OSError as error:
        return f"gemmbn's native operators did not load ({error})"
    from . import operator_fakes  # imports reference, which needs nothing native

    operator_fakes.register()
    return None


@functools.cache
def operators() -> types.SimpleNamespace:
    """gemmbn's torch operators by name (their default OpOverloads, looked up once); RuntimeError if not loadable."""
    reason = load_operators()
    if reason is not None:
        raise RuntimeError(reason)
    return types.SimpleNamespace(**{name: getattr(torch.ops.gemmbn, name).default for name in OPERATOR_NAMES})


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
    reason = load_operators()
    if reason is not None:
        return reason
    return _device_reason(x.device.index if x.device.index is not None else 0)
