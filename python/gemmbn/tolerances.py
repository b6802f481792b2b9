"""Accuracy budgets of the fused paths against a float64 reference, each with its reason.

The measure is the relative Frobenius error ||out - out64|| / ||out64|| of the normalized output
(unit variance per column, so absolute and relative errors are of one size). The float64 reference is
computed from the very inputs and parameters the kernel saw (16-bit values included), so only the
kernel's own roundings count. Measured on an H200 (rand x, nn.Linear init, randn scale; 1000x512->264
and 16384x4096->4096): TF32 ~4e-4, bf16 ~4e-3, fp16 ~5e-4; eager PyTorch in the same
dtype errs as much or more. With very few rows (M=2) 16-bit errors grow for eager and gemmbn alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tolerance:
    """A bound on the relative Frobenius error and why it is that size."""

    limit: float
    reason: str


_TOLERANCES = {
    (torch.float32, "highest"): Tolerance(
        5e-6,
        "fp32-faithful split GEMM, within ~2x of eager fp32's error (eager errs 2.3e-6 at 16384x4096->4096): "
        "operands kept to 22 bits (2^-22 per product, ~1e-7 of a dot product) with an fp32 promotion "
        "every 128 columns; y rounded to fp32, statistics merged in fp32/fp64 (measured 4.8e-7 on an H200)",
    ),
    (torch.float32, "high"): Tolerance(
        3e-3,
        "TF32 operands keep 10 mantissa bits (rounding ~2^-11 each); the K-term error and the value "
        "both grow like sqrt(K), leaving ~2^-11 x a small factor (rand inputs' mean, removed by BN, adds ~2x)",
    ),
    (torch.bfloat16, None): Tolerance(
        2e-2,
        "output rounded to bf16 (8-bit mantissa, 2^-9 relative) plus fp32 accumulation; also covers "
        "operand rounding (~4e-3) when the inputs were rounded from fp32",
    ),
    (torch.float16, None): Tolerance(
        5e-3,
        "output rounded to fp16 (11-bit mantissa, 2^-12 relative) plus fp32 accumulation; also covers "
        "operand rounding (~5e-4) when the inputs were rounded from fp32",
    ),
}


def output_tolerance(dtype: torch.dtype, precision: str) -> Tolerance:
    """Tolerance of the fused path for ``dtype`` at ``precision`` ("medium" runs the TF32 kernel)."""
    if dtype != torch.float32:
        return _TOLERANCES[(dtype, None)]
    return _TOLERANCES[(torch.float32, "highest" if precision == "highest" else "high")]


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """||actual - expected||_F / ||expected||_F, computed in float64."""
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm()).item()
