"""Shared pytest setup: import path, the gpu marker, the sm90 skip, and fresh fallback warnings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

# Use an installed gemmbn (with its built extension) when there is one; else the sources.
if importlib.util.find_spec("gemmbn") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from gemmbn import fallback  # noqa: E402


def _sm90_missing() -> str | None:
    """Why this machine cannot run the GPU tests, or None on an sm90 GPU."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"the fused kernels need sm90 (Hopper), this GPU is sm{major}{minor}"
    return None


SM90_MISSING = _sm90_missing()
requires_sm90 = pytest.mark.skipif(SM90_MISSING is not None, reason=f"GPU test skipped: {SM90_MISSING}")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an sm90 (Hopper) GPU and the built extension")
    # Tests that look for the fallback warning catch it explicitly (pytest.warns records it anyway).
    config.addinivalue_line("filterwarnings", "ignore::gemmbn.fallback.GemmBnFallbackWarning")
    # Raised inside torch's own inductor stack on some versions; nothing of ours.
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture(autouse=True)
def _fresh_fallback_warnings():
    """Every test starts with no fallback reason reported, so 'warn once' is per test."""
    fallback.reset()
    yield
