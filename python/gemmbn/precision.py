"""Which GEMM a call runs, following PyTorch's float32 matmul precision switch.

| dtype      | precision  | GEMM                                                                    |
|------------|------------|-------------------------------------------------------------------------|
| float32    | "highest"  | fused kernel, fp32-faithful: scaled fp16 pairs, 3 tensor-core products  |
| float32    | "high"     | fused kernel, TF32 tensor cores                                         |
| float32    | "medium"   | fused kernel, TF32 tensor cores (see below)                             |
| bf16, fp16 | any        | fused kernel, native 16-bit tensor cores                                |

"medium": PyTorch's documentation lets float32 matmuls use bf16 internally *if a fast bf16-internal
algorithm exists*, "otherwise ... computed as if the precision is 'high'". gemmbn has no such kernel,
so "medium" gets "high"'s TF32 kernel, which is more accurate than medium requires.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PRECISIONS = ("highest", "high", "medium")
FOLLOW_TORCH = "default"  # operator argument: use torch.get_float32_matmul_precision() at run time

# GEMM kinds returned by resolve().
SPLIT_FP32 = "split_fp32"  # fused gemm_scale_stats on the split weight: fp32-faithful (f16_split.cuh)
TF32 = "tf32"  # fused gemm_scale_stats on float32 data (TF32 tensor cores)
NATIVE_16BIT = "native_16bit"  # fused gemm_scale_stats on bf16/fp16 data

FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the dtypes the kernels take


def current() -> str:
    """PyTorch's float32 matmul precision now: torch.get_float32_matmul_precision()."""
    if torch.compiler.is_compiling():
        # Traced, the TF32 switch itself: dynamo folds it into a constant and guards on it (a change recompiles);
        # "medium" sets it too, and runs "high"'s kernels anyway.
        return "high" if torch._C._get_cublas_allow_tf32() else "highest"
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        # torch >= 2.9 refuses the legacy query once the new per-backend API has been used; ask the
        # CUDA matmul backend directly ("tf32" -> "high", anything else -> IEEE "highest").
        backend = getattr(torch.backends.cuda.matmul, "fp32_precision", "ieee")
        return "high" if backend == "tf32" else "highest"


def validate(precision: str | None) -> str:
    """The operators' precision argument: ``precision`` checked, or FOLLOW_TORCH for None.

    Traceable by torch.compile (it does not read the global setting; the operator does, when it runs).
    """
    if precision is None:
        return FOLLOW_TORCH
    if precision not in PRECISIONS and precision != FOLLOW_TORCH:
        raise ValueError(f"precision must be one of {PRECISIONS} or None (follow PyTorch), got {precision!r}")
    return precision


def normalize(precision: str | None) -> str:
    """The precision a call uses: ``precision``, or PyTorch's global setting for None / FOLLOW_TORCH."""
    precision = validate(precision)
    return current() if precision == FOLLOW_TORCH else precision


def resolve(dtype: torch.dtype, precision: str | None) -> str:
    """GEMM kind for ``dtype`` and ``precision``: SPLIT_FP32, TF32 or NATIVE_16BIT (see module table)."""
    if dtype not in FUSED_DTYPES:
        raise TypeError(f"no fused kernel for {dtype}; the kernels take float32, bfloat16 and float16")
    if dtype != torch.float32:
        validate(precision)
        return NATIVE_16BIT  # 16-bit operands ignore the float32 setting: not read
    return SPLIT_FP32 if normalize(precision) == "highest" else TF32


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """Run the block with torch.set_float32_matmul_precision(precision); restore the old value after."""
    previous = current()
    if previous == precision:
        yield  # leave the global state untouched in the common case
        return
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
