"""The fused synchronized route (issue 19; the default on a GPU, perf/NOTES.md v18-v20) on one GPU: one rank over NCCL
in this process, and three processes sharing the GPU through gloo. The module's step takes train_moments and
normalize_from_moments forward, batch_norm_backward_sums and batch_norm_backward over ranks backward, and its outputs,
running statistics and gradients are as close to float64 as eager's are (the unsynchronized tests' criteria). Two ranks:
tests/test_sync_batchnorm.py runs the route's Python on the CPU; the real two-GPU run needs the two-GPU machine."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from _gpu import CONFIGS, fused_path, model, rand_x, require_extension
from _helpers import float64_grads, grads, reference_copy
from conftest import requires_sm90
from test_backward_gpu import EAGER_PRECISION, ERROR_RATIO, _assert_within_eager
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
    from moved running statistics), each forward taking train_moments once, each backward the sums launch and the
    gradients' launch over ranks."""
    monkeypatch.setenv(distributed.SYNC_FUSED, "1")
    calls = _count_fused_launches(monkeypatch.setattr)
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
        assert calls == {"train_moments": 2 * step + 2, "sums": step + 1, "over_ranks": step + 1}, "the fused route ran"
        _assert_close_to_float64(out, out64, dtype, precision, f"step {step} output", M)
        for key in ("running_mean", "running_var"):
            _assert_close_to_float64(getattr(layer.bn, key), getattr(bn64, key), dtype, precision, key, M)
        _assert_within_eager(name, actual, baseline, expected, f"step {step}: ")


def _count_fused_launches(setattr_) -> dict:
    """Counts of the fused route's calls (train_moments; the backward's sums launch; its gradients' launch over
    ranks), each operator wrapped by setattr_(fused, name, wrapper)."""
    calls = {"train_moments": 0, "sums": 0, "over_ranks": 0}

    def counted(name, key, real):
        def call(*args, **kwargs):
            over_ranks = args[12] if len(args) > 12 else kwargs.get("over_ranks")  # batch_norm_backward's
            calls[key] += key != "over_ranks" or over_ranks is not None
            return real(*args, **kwargs)

        setattr_(fused, name, call)

    counted("train_moments", "train_moments", fused.train_moments)
    counted("batch_norm_backward_sums", "sums", fused.batch_norm_backward_sums)
    counted("batch_norm_backward", "over_ranks", fused.batch_norm_backward)
    return calls


SHARED_GPU_ROWS = (600, 0, 424)  # three ranks on one GPU: uneven, one without rows
SHARED_GPU_SHAPE = (512, 264)  # K, N


def _shared_gpu_batch(dtype):
    """(x, dout) of the whole batch, the same on every rank (seeded on the CPU)."""
    generator = torch.Generator().manual_seed(7)
    K, N = SHARED_GPU_SHAPE
    x = torch.rand(sum(SHARED_GPU_ROWS), K, generator=generator)
    return x.to("cuda", dtype), torch.randn(x.shape[0], N, generator=generator, dtype=torch.float64)


def _shared_gpu_rank(rank: int, world: int, store: str, out_dir: str) -> None:
    """One rank of three sharing the GPU (gloo: NCCL refuses two ranks on one device): every precision's step on the
    fused route, its rows' output and gradients and the layer's state saved for the parent to compare."""
    import os

    os.environ[distributed.SYNC_FUSED] = "1"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    rows = slice(sum(SHARED_GPU_ROWS[:rank]), sum(SHARED_GPU_ROWS[: rank + 1]))
    calls = _count_fused_launches(setattr)
    results = {}
    for name, (dtype, precision) in CONFIGS.items():
        layer = gemmbn.convert_sync_batchnorm(model(dtype, precision, *SHARED_GPU_SHAPE))
        x, dout = _shared_gpu_batch(dtype)
        x = x[rows].clone().requires_grad_(True)
        before = dict(calls)
        with fused_path():
            out = layer(x)
            out.backward(dout[rows].to(out.device, dtype))
        grads = {n: p.grad.cpu() for n, p in layer.named_parameters()}
        fused_calls = {key: calls[key] - before[key] for key in calls}
        results[name] = {"out": out.detach().cpu(), "x": x.grad.cpu(), "grads": grads, "fused": fused_calls,
                         "state": {k: v.cpu() for k, v in layer.state_dict().items()}}  # fmt: skip
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.barrier()
    os._exit(0)  # without destructors: tests/test_sync_batchnorm.py's _leave_rank says why


def test_three_ranks_sharing_the_gpu_equal_single_process_training(tmp_path):
    """Three processes on this GPU (600, 0 and 424 rows) train one step on the fused route through gloo: their
    outputs and x-gradients, concatenated, are as close to float64 single-process training on the whole batch as one
    process's fused step is (the one-rank test's criteria), and so are their parameter gradients, summed as DDP would,
    but for the ranks' own roundings; the running statistics are bitwise equal across ranks and within the forward's
    tolerance of float64."""
    import torch.multiprocessing as mp

    world = len(SHARED_GPU_ROWS)
    mp.spawn(_shared_gpu_rank, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    M = sum(SHARED_GPU_ROWS)
    for name, (dtype, precision) in CONFIGS.items():
        per_rank = [r[name] for r in ranks]
        launches = [dict.fromkeys(("train_moments", "sums", "over_ranks"), int(rows > 0)) for rows in SHARED_GPU_ROWS]
        assert [r["fused"] for r in per_rank] == launches, "the fused route ran"
        layer = model(dtype, precision, *SHARED_GPU_SHAPE)
        x, dout = _shared_gpu_batch(dtype)
        out64, bn64 = float64_forward(layer, x)
        expected = {}
        for label, module, inputs in (("float64", reference_copy(layer).double(), x.double()),
                                      ("eager", reference_copy(layer), x)):  # fmt: skip
            inputs = inputs.clone().requires_grad_(True)
            with float32_matmul_precision(EAGER_PRECISION[name]):
                out = module(inputs)
                out.backward(dout.to(out.device, out.dtype))
            expected[label] = {n.removeprefix("_orig_mod."): p.grad for n, p in module.named_parameters()}
            expected[label]["x"] = inputs.grad
        actual = {n: sum(r["grads"][n].double() for r in per_rank).to(g.dtype).cuda()
                  for n, g in expected["eager"].items() if n != "x"}  # fmt: skip
        actual["x"] = torch.cat([r["x"] for r in per_rank]).cuda()
        out = torch.cat([r["out"] for r in per_rank]).cuda()
        _assert_close_to_float64(out, out64, dtype, precision, f"{name} output", M)
        _assert_within_eager(name, {"x": actual.pop("x")}, {"x": expected["eager"].pop("x")},
                             {"x": expected["float64"].pop("x")}, f"{name}: ")  # fmt: skip
        # Each rank's parameter gradient is rounded to the parameter's dtype before DDP adds them, where eager rounds
        # once: those roundings (<= the unit roundoff u times each rank's gradient, elementwise) are added to the
        # budget of ERROR_RATIO x eager's error.
        u = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
        for key, grad64 in expected["float64"].items():
            ours = (actual[key].double() - grad64).norm().item()
            theirs = (expected["eager"][key].double() - grad64).norm().item()
            roundings = sum((u * r["grads"][key].double().abs()).norm().item() for r in per_rank)
            limit = ERROR_RATIO[name] * theirs + roundings
            assert ours <= limit, f"{name}: {key}: ||error|| {ours:.3e} > {ERROR_RATIO[name]} x eager's {theirs:.3e} " \
                                  f"+ the ranks' roundings {roundings:.3e}"
        for key in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
            assert all(torch.equal(r["state"][key], per_rank[0]["state"][key]) for r in per_rank), f"{name}: {key}"
        for key in ("running_mean", "running_var"):
            value = per_rank[0]["state"][f"bn.{key}"].cuda()
            _assert_close_to_float64(value, getattr(bn64, key), dtype, precision, f"{name}: {key}", M)
