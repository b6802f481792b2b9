"""Batch statistics over a process group (nn.SyncBatchNorm's semantics), on the CPU with gloo.

Three ranks hold 5, 0 and 8 rows of one batch (uneven, one empty). Each runs convert_sync_batchnorm's
GemmScaleBatchNorm forward and backward on its rows; the results must be those of single-process training
of the reference model (nn.Linear, scale, nn.BatchNorm1d) on the concatenated batch: each rank's outputs
and x-gradients are its rows of the single-process ones, the ranks' parameter gradients add up to the
single-process ones (DDP adds them), and every rank's running statistics equal the single-process ones,
bitwise equal across ranks. Five DDP SGD steps end where single-process training does. float64 models, so
the bound is float64 rounding (1e-12 relative: the statistics' merge order differs from one pass over the
batch).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gemmbn
from gemmbn import ReferenceModel

ROWS = (5, 0, 8)
K, N = 6, 4
STEPS = 2  # the second forward starts from running statistics the first one moved


def _batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, cotangent) of the whole batch at a step: the same on every rank (seeded)."""
    generator = torch.Generator().manual_seed(100 + step)
    total = sum(ROWS)
    x = torch.rand(total, K, generator=generator, dtype=torch.float64) * 3 - 1
    return x, torch.randn(total, N, generator=generator, dtype=torch.float64)


def _model(momentum) -> ReferenceModel:
    torch.manual_seed(0)
    return ReferenceModel(K, N, (N,), momentum=momentum).double()


def _step(module, x: torch.Tensor, dout: torch.Tensor) -> dict:
    """One forward and backward of module on x's rows: output, x's and the parameters' gradients, state after."""
    x = x.clone().requires_grad_(True)
    module.zero_grad(set_to_none=True)
    out = module(x)
    out.backward(dout)
    return {"out": out.detach(), "x_grad": x.grad,
            "grads": {name: p.grad.clone() for name, p in module.named_parameters()},
            "state": {k: v.clone() for k, v in module.state_dict().items()}}  # fmt: skip


def _leave_rank() -> None:
    """End a rank's process once its results are saved, without running destructors. Tearing down a gloo process
    group can deadlock (seen with torch 2.13, in CI): ~ProcessGroupGloo, run with the GIL held (a Python object
    holding the group is freed), joins the group's worker thread while that thread waits for the GIL to free a
    finished collective's thread-local state. A barrier first, so that no rank leaves while another still needs
    it."""
    dist.barrier()
    os._exit(0)


def _rank_main(rank: int, world: int, store: str, momentum, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = gemmbn.convert_sync_batchnorm(_model(momentum))
    assert isinstance(model, gemmbn.GemmScaleBatchNorm) and model.process_group is not None
    rows = slice(sum(ROWS[:rank]), sum(ROWS[:rank + 1]))
    results = [_step(model, *(t[rows] for t in _batches(step))) for step in range(STEPS)]
    # Eval normalizes with the running statistics: no collective may run (one would raise here).
    model.eval()
    real_all_gather, dist.all_gather = dist.all_gather, None
    try:
        results.append({"eval_out": model(torch.rand(3, K, dtype=torch.float64))})
    finally:
        dist.all_gather = real_all_gather
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    _leave_rank()


def _single_process(momentum) -> list[dict]:
    reference = _model(momentum)
    return [_step(reference, *_batches(step)) for step in range(STEPS)]


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "momentum_none"])
def test_three_ranks_equal_single_process_training(tmp_path, momentum):
    world = len(ROWS)
    mp.spawn(_rank_main, args=(world, str(tmp_path / "store"), momentum, str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    expected = _single_process(momentum)
    close = {"rtol": 1e-12, "atol": 1e-12}
    for step, single in enumerate(expected):
        per_rank = [r[step] for r in ranks]
        torch.testing.assert_close(torch.cat([r["out"] for r in per_rank]), single["out"], **close)
        torch.testing.assert_close(torch.cat([r["x_grad"] for r in per_rank]), single["x_grad"], **close)
        for name, grad in single["grads"].items():
            torch.testing.assert_close(sum(r["grads"][name] for r in per_rank), grad, **close, msg=name)
        for key, value in single["state"].items():
            for r in per_rank:
                torch.testing.assert_close(r["state"][key], value, **close, msg=key)
                assert torch.equal(r["state"][key], per_rank[0]["state"][key]), f"{key} differs between ranks"
    # Eval: each rank's own rows, the running statistics (which are equal on every rank) as constants.
    assert all(r[STEPS]["eval_out"].shape == (3, N) for r in ranks)


SGD_STEPS = 5


def _ddp_rank_main(rank: int, world: int, store: str, out_dir: str) -> None:
    """SGD_STEPS steps of DDP over the converted model; saves the final state."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(gemmbn.convert_sync_batchnorm(_model(0.1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    begin = sum(ROWS[:rank])
    for step in range(SGD_STEPS):
        x, dout = _batches(step)
        optimizer.zero_grad(set_to_none=True)
        model(x[begin:begin + ROWS[rank]]).backward(dout[begin:begin + ROWS[rank]])
        optimizer.step()
    torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, f"{out_dir}/ddp{rank}.pt")
    _leave_rank()


def test_ddp_steps_equal_single_process_training(tmp_path):
    """Five DDP SGD steps with momentum end where single-process training on the concatenated batches does.
    DDP averages the ranks' gradients, so the single process's loss is divided by the world size."""
    world = len(ROWS)
    mp.spawn(_ddp_rank_main, args=(world, str(tmp_path / "store"), str(tmp_path)), nprocs=world, join=True)
    reference = _model(0.1)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9)
    for step in range(SGD_STEPS):
        x, dout = _batches(step)
        optimizer.zero_grad(set_to_none=True)
        reference(x).backward(dout / world)
        optimizer.step()
    for rank in range(world):
        state = torch.load(tmp_path / f"ddp{rank}.pt")
        for key, value in reference.state_dict().items():
            torch.testing.assert_close(state[key], value, rtol=1e-12, atol=1e-12, msg=f"rank {rank}: {key}")


def test_convert_sync_batchnorm_converts_and_shares():
    """A ReferenceModel becomes a GemmScaleBatchNorm sharing its parameters; nested modules are converted in
    place; a GemmScaleBatchNorm gets the group; process_group=None means the default group."""
    group = object()  # any object stands for a group here: no collective runs
    reference = _model(0.1)
    converted = gemmbn.convert_sync_batchnorm(reference, group)
    assert isinstance(converted, gemmbn.GemmScaleBatchNorm) and converted.process_group is group
    assert converted.gemm.weight is reference.gemm.weight and converted.bn is reference.bn
    outer = torch.nn.Sequential(copy.deepcopy(reference), torch.nn.ReLU())
    assert gemmbn.convert_sync_batchnorm(outer, group) is outer
    assert isinstance(outer[0], gemmbn.GemmScaleBatchNorm) and outer[0].process_group is group
    layer = gemmbn.GemmScaleBatchNorm(K, N, (N,))
    assert layer.process_group is None and gemmbn.convert_sync_batchnorm(layer).process_group is dist.group.WORLD
    # A copy (an EMA model, say) has its own parameters and shares the group, which cannot be copied.
    copied = copy.deepcopy(converted)
    assert copied.process_group is group and copied.gemm.weight is not converted.gemm.weight
    assert torch.equal(copied.gemm.weight, converted.gemm.weight) and copied.bn.running_var is not converted.bn.running_var


def test_compiled_fullgraph_synchronized_step(tmp_path):
    """torch.compile(fullgraph=True) traces the synchronized forward and backward (collectives included): one
    gloo rank in this process, outputs and gradients as the eager synchronized step's (float64, 1e-12)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        eager = gemmbn.convert_sync_batchnorm(_model(0.1))
        compiled_module = copy.deepcopy(eager)
        compiled = torch.compile(compiled_module, fullgraph=True)
        x, dout = _batches(0)
        results = []
        for module, call in ((eager, eager), (compiled_module, compiled)):
            inputs = x.clone().requires_grad_(True)
            out = call(inputs)
            out.backward(dout)
            results.append([out.detach(), inputs.grad, *(p.grad for p in module.parameters()),
                            module.bn.running_mean, module.bn.running_var])  # fmt: skip
        for expected, actual in zip(*results):
            torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    finally:
        dist.destroy_process_group()


# The fused synchronized route's Python (distributed._SynchronizedFusedLayer: its autograd wiring, collectives, batch
# count, the dummy row of a rank without rows, the backward's gathered sums and its PyTorch fallback) on the CPU, with
# the forward's two native operators and the backward's sums launch replaced by their contracts in PyTorch ops, and
# the backward's gradient launch refusing (the kernels themselves: tests/test_finish_emulated.py's and
# tests/test_backward_emulated.py's rank cases, and the GPU tests in tests/test_sync_gpu.py). float32, as the fused
# route takes.


def _train_moments_contract(x, weight, bias, scale, gemm_kind):
    """fused.train_moments's contract: y and its columns' [3, N] float32 (rows, mean, M2)."""
    y = (x @ weight.t() + bias) * scale
    y64 = y.double()
    mean = y64.mean(0)
    return y, torch.stack([torch.full_like(mean, y.shape[0]), mean, ((y64 - mean) ** 2).sum(0)]).float()


def _normalize_from_moments_contract(y, rank_moments, gamma, beta, running_mean, running_var, num_batches_tracked,
                                     momentum, eps):  # fmt: skip
    """fused.normalize_from_moments's contract: the statistics of every rank's moments (float64 merge), the running
    statistics moved with them (num_batches_tracked read, not counted), y normalized."""
    counts, means, m2s = rank_moments.double().unbind(1)
    rows = counts.sum(0)
    mean = (counts * means).sum(0) / rows
    var = (m2s + counts * (means - mean) ** 2).sum(0) / rows
    factor = momentum if momentum is not None else 1.0 / num_batches_tracked.item()
    running_mean.copy_((1 - factor) * running_mean.double() + factor * mean)
    running_var.copy_((1 - factor) * running_var.double() + factor * var * rows / (rows - 1))
    invstd = torch.rsqrt(var + eps)
    out = (y.double() - mean) * invstd * gamma.double() + beta.double()
    return out.to(y.dtype), mean.float(), invstd.float()


def _batch_norm_backward_sums_contract(dout, y, mean, invstd):
    """fused.batch_norm_backward_sums's contract: [3, N] float64 sums of dout, dout (y - mean) and y - mean."""
    d = y.double() - mean.double()
    return torch.stack([dout.double().sum(0), (dout.double() * d).sum(0), d.sum(0)])


def _refused(*args, **kwargs):
    from gemmbn._native import Refused

    raise Refused("the gradients' launch is the GPU's (this test takes the route's PyTorch fallback)")


def _fused_rank_main(rank: int, world: int, store: str, momentum, out_dir: str) -> None:
    from gemmbn import distributed, fused

    calls = []
    os.environ[distributed.SYNC_FUSED] = "1"
    distributed.fused_unavailable_reason = lambda x: None
    fused.train_moments = lambda *a: calls.append("train_moments") or _train_moments_contract(*a)
    fused.normalize_from_moments = lambda *a: calls.append("normalize") or _normalize_from_moments_contract(*a)
    fused.batch_norm_backward_sums = lambda *a: calls.append("sums") or _batch_norm_backward_sums_contract(*a)
    fused.batch_norm_backward = lambda *a, **k: calls.append("backward") or _refused()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = gemmbn.convert_sync_batchnorm(_model(momentum).float())
    rows = slice(sum(ROWS[:rank]), sum(ROWS[:rank + 1]))
    results = [_step(model, *(t[rows].float() for t in _batches(step))) for step in range(STEPS)]
    results.append({"calls": calls})
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    _leave_rank()


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "momentum_none"])
def test_fused_route_equals_single_process_training(tmp_path, momentum):
    """The three ranks (5, 0 and 8 rows) on the fused route: outputs, x's gradients, the ranks' summed parameter
    gradients and the running statistics against single-process float64 training on the concatenated batch, within
    float32's rounding (1e-5 relative; 1e-5 absolute, since the ranks' scale gradients, ~6 each, cancel to ~1e-4 in
    their sum, which keeps float32's ~1e-6 absolute rounding of the parts; a wrong formula errs by ~1); the running
    statistics bitwise equal on every rank, the empty one's included (it runs the same launch on a row of zeros);
    each rank called train_moments only when it had rows and normalize_from_moments once a step, and in the backward
    the sums launch and the gradients' launch (refused here) when it had rows."""
    world = len(ROWS)
    mp.spawn(_fused_rank_main, args=(world, str(tmp_path / "store"), momentum, str(tmp_path)), nprocs=world,
             join=True)  # fmt: skip
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    expected = _single_process(momentum)
    close = {"rtol": 1e-5, "atol": 1e-5}
    for step, single in enumerate(expected):
        per_rank = [r[step] for r in ranks]
        torch.testing.assert_close(torch.cat([r["out"] for r in per_rank]).double(), single["out"], **close)
        torch.testing.assert_close(torch.cat([r["x_grad"] for r in per_rank]).double(), single["x_grad"], **close)
        for name, grad in single["grads"].items():
            torch.testing.assert_close(sum(r["grads"][name] for r in per_rank).double(), grad, **close, msg=name)
        for key, value in single["state"].items():
            for r in per_rank:
                torch.testing.assert_close(r["state"][key].to(value.dtype), value, **close, msg=key)
                assert torch.equal(r["state"][key], per_rank[0]["state"][key]), f"{key} differs between ranks"
    for rank, rows in enumerate(ROWS):
        expected_calls = (["train_moments"] * (rows > 0) + ["normalize"] + ["sums", "backward"] * (rows > 0)) * STEPS
        assert ranks[rank][STEPS]["calls"] == expected_calls, rank
