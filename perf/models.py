"""The models the per-forward perf scripts compare, built one way (seed 0, TF32 for float32)."""

from __future__ import annotations

import gemmbn
import torch


def reference_drop_in_compiled(M: int, K: int, N: int, dtype: torch.dtype, precision: str = "high"):
    """(reference, drop_in sharing its parameters and buffers, torch.compile(reference), x [M, K]) on CUDA, float32
    matmuls at `precision` (torch.set_float32_matmul_precision: "high" TF32, "highest" gemmbn's split GEMM)."""
    torch.manual_seed(0)
    torch.set_float32_matmul_precision(precision)
    reference = gemmbn.ReferenceModel(K, N, (N,)).to("cuda", dtype)
    drop_in = gemmbn.GemmScaleBatchNorm.from_module(reference)
    x = torch.rand(M, K, device="cuda", dtype=dtype)
    return reference, drop_in, torch.compile(reference), x
