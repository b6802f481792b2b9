"""The compiled part, loaded on first use: gemmbn/_operators.so, the torch operators gemmbn::* (every launch of a
forward or backward) and gemmbn_debug::* (device support, the configuration tables, single kernels: debug.py).

The package works without it (everything falls back to the PyTorch reference), so a missing or broken
build is recorded as a reason instead of failing ``import gemmbn``.
"""

from __future__ import annotations

import functools
import pathlib
import types

import torch
from torch import Tensor

from .precision import FUSED_DTYPES

# The operators use LibTorch's stable ABI as of torch 2.10 (CMakeLists.txt: TORCH_TARGET_VERSION).
OPERATORS_MIN_TORCH = (2, 10)
OPERATOR_NAMES = ("train_forward", "eval_forward", "eval_affine", "eval_forward_folded", "linear_scale",
                  "train_moments", "normalize_from_moments", "split_weight", "split_columns", "split_matmul",
                  "transpose_padded", "batch_norm_backward", "batch_norm_backward_sums")  # fmt: skip


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


# How a refusal's message starts (operators.cpp's fail()); a launch that failed reads "gemmbn failed ...".
_REFUSAL = "gemmbn: "


class Refused(Exception):
    """An operator refused its arguments (the message says why); nothing was launched or written. Read the reason
    as ``reason``: torch 2.10's dynamo cannot trace str() of an exception (its str is C), 2.11 and later can."""

    @property
    def reason(self) -> str:
        return self.args[0]


def call(operator, *args):
    """operator(*args) with a refusal raised as Refused (anything else propagates as it is): the callers fall back
    to PyTorch on Refused, so the kernels' layout requirements are checked once, in C++."""
    try:
        return operator(*args)
    except RuntimeError as error:
        message = str(error)
        if message.startswith(_REFUSAL):
            raise Refused(message.removeprefix(_REFUSAL)) from None
        raise


def operator(name: str) -> torch._ops.OpOverload:
    """gemmbn::<name>'s default overload; RuntimeError if the library is not loadable. Eager calls take it from
    operators() (a torch.ops attribute lookup costs microseconds); traced code from torch.ops, which dynamo folds."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.gemmbn, name).default
    return getattr(operators(), name)


@functools.cache
def operators() -> types.SimpleNamespace:
    """gemmbn's torch operators by name (their default OpOverloads, looked up once); RuntimeError if not loadable."""
    reason = load_operators()
    if reason is not None:
        raise RuntimeError(reason)
    return types.SimpleNamespace(**{name: getattr(torch.ops.gemmbn, name).default for name in OPERATOR_NAMES})


@torch.compiler.assume_constant_result  # traced, a constant (a process's build and GPUs do not change)
def _environment_reason(device_index: int) -> str | None:
    """None where the operators are loaded and cuda:<device_index> runs their kernels, else why not."""
    return _environment_reason_cached(device_index)


@functools.cache
def _environment_reason_cached(device_index: int) -> str | None:
    reason = load_operators()
    if reason is not None:
        return reason
    supported, why = torch.ops.gemmbn_debug.device_support(device_index)
    return None if supported else f"cuda:{device_index} cannot run the fused kernels: {why}"


def fused_unavailable_reason(x: Tensor) -> str | None:
    """None when the native path can run on x's device and dtype; else why not (CPU, not built, not sm90)."""
    if not x.is_cuda:
        return f"x is on {x.device.type}; the fused kernels need an sm90 (Hopper) GPU"
    if x.dtype not in FUSED_DTYPES:
        return f"dtype {x.dtype} has no fused kernel (float32, bfloat16 and float16 do)"
    return _environment_reason(x.device.index if x.device.index is not None else 0)
