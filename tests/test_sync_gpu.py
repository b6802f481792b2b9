"""The fused synchronized forward (issue 19; GEMMBN_SYNC_FUSED=1, perf/NOTES.md v18) on one GPU: one rank over NCCL
in this process. The module's step takes train_moments and normalize_from_moments, and its outputs, running
statistics and gradients are as close to float64 as eager's are (the unsynchronized tests' criteria). Two ranks:
tests/test_sync_batchnorm.py runs the route's Python on the CPU; the real two-GPU run needs the two-GPU machine.
Written without a GPU run."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from _gpu import CONFIGS, fused_path, model, rand_x, require_extension
from _helpers import float64_grads, grads, reference_copy
from conftest import requires_sm90
from test_backward_gpu import EAGER_PRECISION, _assert_within_eager
from test_fused_gpu import _assert_close_to_float64

import gemmbn
from gemmbn import distributed, fused
from gemmbn.precision import float32_matmul_precision
from gemmbn.reference import float64_forward

pytestmark = [pytest.mark.gpu, requires_sm90]


@pytest.fixture(scope="module", autouse=True)
def _built():
    require_extension()


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_one_rank_fused_synchronized_step(name, one_rank, monkeypatch):
    """Forward (output and running statistics against float64, the fused forward's tolerance) and gradients (within
    the backward tests' ratio of eager's error) of a synchronized layer on the fused launches, two steps (the second
    from moved running statistics), each taking train_moments once."""
    monkeypatch.setenv(distributed.SYNC_FUSED, "1")
    calls = []
    real = fused.train_moments
    monkeypatch.setattr(fused, "train_moments", lambda *a: calls.append(a[0].shape) or real(*a))
    dtype, precision = CONFIGS[name]
    M, K, N = 1000, 512, 264
    layer = gemmbn.convert_sync_batchnorm(model(dtype, precision, K, N))
    for step in range(2):
        x = rand_x(M, K, dtype)
        expected = float64_grads(layer, x)
        eager = reference_copy(layer)
        out64, bn64 = float64_forward(layer, x)
        with float32_matmul_precision(EAGER_PRECISION[name]):
            baseline = grads(eager, x)
        with fused_path():
            actual = grads(layer, x)
            with torch.no_grad():
                out = copy.deepcopy(layer)(x)
        assert len(calls) == 2 * step + 2, "the fused route ran"
        _assert_close_to_float64(out, out64, dtype, precision, f"step {step} output", M)
        for key in ("running_mean", "running_var"):
            _assert_close_to_float64(getattr(layer.bn, key), getattr(bn64, key), dtype, precision, key, M)
        _assert_within_eager(name, actual, baseline, expected, f"step {step}: ")
