"""The models the per-forward perf scripts compare, built one way (seed 0; float32 matmuls TF32 unless --precision
highest asks for PyTorch's IEEE SGEMM and gemmbn's split GEMM)."""

from __future__ import annotations

import argparse

import gemmbn
import torch

# torch.set_float32_matmul_precision's value -> what float32 matmuls run on, for the scripts' headers.
FLOAT32_MATMULS = {"high": "TF32", "highest": "IEEE / split"}


def add_precision_option(parser: argparse.ArgumentParser) -> None:
    """--precision, the float32 matmul precision reference_drop_in_compiled takes."""
    parser.add_argument("--precision", default="high", choices=list(FLOAT32_MATMULS),
                        help="float32 matmuls: high (TF32) or highest (gemmbn's split GEMM, PyTorch's IEEE SGEMM)")


def reference_drop_in_compiled(M: int, K: int, N: int, dtype: torch.dtype, precision: str = "high"):
    """(reference, drop_in sharing its parameters and buffers, torch.compile(reference), x [M, K]) on CUDA, float32
    matmuls at `precision` (torch.set_float32_matmul_precision: "high" TF32, "highest" gemmbn's split GEMM)."""
    torch.manual_seed(0)
    torch.set_float32_matmul_precision(precision)
    reference = gemmbn.ReferenceModel(K, N, (N,)).to("cuda", dtype)
    drop_in = gemmbn.GemmScaleBatchNorm.from_module(reference)
    x = torch.rand(M, K, device="cuda", dtype=dtype)
    return reference, drop_in, torch.compile(reference), x
