"""What the GPU test modules share: the precision configs, the fused-path guard, models and inputs on CUDA."""

from __future__ import annotations

import contextlib
import os
import warnings

import pytest
import torch

from gemmbn import GemmBnFallbackWarning, GemmScaleBatchNorm, _native, fallback

# GEMMBN_TEST_ALLOW_FALLBACK=1 lets the GPU tests run without a build, to check the tests themselves; it
# proves nothing about the kernels.
ALLOW_FALLBACK = os.environ.get("GEMMBN_TEST_ALLOW_FALLBACK") == "1"
DEVICE = torch.device("cuda")

# (dtype, precision): "highest" = the fp32-faithful split GEMM; "high" = TF32; 16-bit = native.
CONFIGS = {
    "fp32-highest": (torch.float32, "highest"),
    "fp32-high": (torch.float32, "high"),
    "bf16": (torch.bfloat16, "highest"),
    "fp16": (torch.float16, "highest"),
}


def require_extension() -> None:
    """Fail (not skip) where an sm90 GPU is present but the operators are not built."""
    reason = _native.load_operators()
    if reason is not None and not ALLOW_FALLBACK:
        pytest.fail(f"an sm90 GPU is present but {reason}; build it (pip install .) to test the kernels")


def poison_next_allocation(shape, dtype=torch.float32) -> None:
    """Leave a NaN-filled block of this size in torch's caching allocator, which hands it to the next allocation of
    that size on this stream: how an operator's own outputs are poisoned before its kernel writes them."""
    torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@contextlib.contextmanager
def fused_path():
    """Fail the test if anything inside falls back to the PyTorch reference."""
    fallback.reset()
    with warnings.catch_warnings():
        if not ALLOW_FALLBACK:
            warnings.simplefilter("error", GemmBnFallbackWarning)
        yield


def model(dtype, precision, K, N, *, seed=0, **kwargs) -> GemmScaleBatchNorm:
    torch.manual_seed(seed)
    return GemmScaleBatchNorm(K, N, (N,), precision=precision, **kwargs).to(DEVICE, dtype)


def rand_x(M, K, dtype) -> torch.Tensor:
    return torch.rand(M, K, device=DEVICE, dtype=dtype)
