"""Batch statistics over ranks (issue 19), per rank: gemmbn's synchronized layer against the reference model with
nn.SyncBatchNorm, eager and torch.compile, and against gemmbn's own unsynchronized layer at the same per-rank shape.

    torchrun --nproc-per-node 2 perf/sync_step.py [--sizes "M K N;..."] [--configs bf16,tf32,fp32] [--iters N]
                                                  [--out CSV]
    python perf/sync_step.py --spawn 2 --sizes "64 32 16" --configs fp32   (gloo ranks on the CPU: a smoke run
                                                                           of the harness, its times mean nothing)

Providers (each its own copy of one seeded model; M is each rank's rows):
  gemmbn-single      GemmScaleBatchNorm, no process group: the single-GPU time the target compares with (<= 1.05x)
  gemmbn-sync-fused  gemmbn.convert_sync_batchnorm: the fused launches (distributed.py's default on a GPU)
  gemmbn-sync        the same with GEMMBN_SYNC_FUSED=0 set around each call: the PyTorch route
  syncbn-eager       ReferenceModel with nn.SyncBatchNorm.convert_sync_batchnorm (GPU only: SyncBatchNorm needs CUDA)
  syncbn-compile     torch.compile of that (GPU only)
Modes: fwd (training forward under no_grad) and fwd_bwd (zero grads, forward, backward with a fixed cotangent).
Every rank times the same calls in the same order (gemmbn.timing's rotating rounds: the collectives match), with
CUDA events and the L2 flushed before each call; rank 0 prints the slowest rank's median per provider (a
synchronized step is as slow as its slowest rank) and writes the CSV.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import shapes  # noqa: E402  (perf/ is not a package)
from train_step import CONFIGS, _commit, write_csv  # noqa: E402

import gemmbn  # noqa: E402
from gemmbn import distributed, timing  # noqa: E402

PROVIDERS = ("gemmbn-single", "gemmbn-sync", "gemmbn-sync-fused", "syncbn-eager", "syncbn-compile")
GPU_ONLY = ("gemmbn-sync-fused", "syncbn-eager", "syncbn-compile")
MODES = ("fwd", "fwd_bwd")
COLUMNS = ["world", "M", "K", "N", "config", "mode", "provider", "median_ms", "slowest_rank_median_ms",
           "over_gemmbn_single", "syncbn_eager_over_this", "syncbn_compile_over_this"]  # fmt: skip


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16384 4096 4096", help='"M K N;...": M rows on each rank')
    parser.add_argument("--configs", default="bf16,tf32,fp32")
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--spawn", type=int, default=0, help="run this many gloo ranks on the CPU (a smoke run)")
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def _models(K: int, N: int, dtype: torch.dtype, device: torch.device, providers: list[str]) -> dict:
    torch.manual_seed(0)
    reference = gemmbn.ReferenceModel(K, N, (N,)).to(device, dtype)
    models = {}
    for provider in providers:
        module = copy.deepcopy(reference)
        if provider == "gemmbn-single":
            module = gemmbn.GemmScaleBatchNorm.from_module(module)
        elif provider.startswith("gemmbn-sync"):
            module = gemmbn.convert_sync_batchnorm(module)
        else:
            module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
            if provider == "syncbn-compile":
                module = torch.compile(module, dynamic=False)
        models[provider] = module
    return models


def _call(provider: str, module, x: torch.Tensor, dout: torch.Tensor, mode: str):
    switch = {"gemmbn-sync": _route_switch("0"), "gemmbn-sync-fused": _route_switch("1")}.get(provider,
                                                                                             contextlib.nullcontext)

    def run():
        with switch():
            if mode == "fwd":
                with torch.no_grad():
                    module(x)
            else:
                module.zero_grad(set_to_none=True)
                x.grad = None
                module(x).backward(dout)
    return run


def _route_switch(value: str):
    """A context manager setting GEMMBN_SYNC_FUSED to value around a call (0: the PyTorch route, 1: the fused one)."""

    @contextlib.contextmanager
    def switch():
        before = os.environ.get(distributed.SYNC_FUSED)
        os.environ[distributed.SYNC_FUSED] = value
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(distributed.SYNC_FUSED)
            else:
                os.environ[distributed.SYNC_FUSED] = before

    return switch


def measure(M, K, N, config, providers, iters, device) -> list[dict]:
    torch._dynamo.reset()
    dtype, precision = CONFIGS[config]
    torch.set_float32_matmul_precision(precision)
    models = _models(K, N, dtype, device, providers)
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own rows
    x = torch.rand(M, K, generator=generator).to(device, dtype).requires_grad_(True)
    dout = torch.randn(M, N, generator=generator).to(device, dtype)
    flush = timing.flush_buffer(device)
    rows = []
    for mode in MODES:
        calls = [_call(p, models[p], x, dout, mode) for p in providers]
        times = timing.interleaved_ms(calls, device, iters=iters, warmup=2, flush=flush)
        medians = [statistics.median(t) for t in times]
        every_rank = [None] * dist.get_world_size()
        dist.all_gather_object(every_rank, medians)
        slowest = dict(zip(providers, (max(column) for column in zip(*every_rank))))
        for provider, median in zip(providers, medians):
            ratio = lambda other: f"{slowest[other] / slowest[provider]:.3f}" if other in slowest else ""  # noqa: E731
            rows.append({
                "world": dist.get_world_size(), "M": M, "K": K, "N": N, "config": config, "mode": mode,
                "provider": provider, "median_ms": f"{median:.4f}", "slowest_rank_median_ms": f"{slowest[provider]:.4f}",
                "over_gemmbn_single": f"{slowest[provider] / slowest['gemmbn-single']:.3f}"
                if "gemmbn-single" in slowest else "",
                "syncbn_eager_over_this": ratio("syncbn-eager"), "syncbn_compile_over_this": ratio("syncbn-compile"),
            })  # fmt: skip
    return rows


def _run(args, device: torch.device) -> None:
    providers = [p for p in args.providers.split(",") if p and (device.type == "cuda" or p not in GPU_ONLY)]
    rows = []
    for M, K, N in shapes.parse_sizes(args.sizes):
        for config in args.configs.split(","):
            rows += measure(M, K, N, config, providers, args.iters, device)
    if dist.get_rank() != 0:
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (gloo: a smoke run, not a timing)"
    header = (f"{name} x {dist.get_world_size()} ranks, torch {torch.__version__}, gemmbn {_commit()}, "
              f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}: the slowest rank's "
              f"median ms of {args.iters} calls per provider"
              f"{', L2 flushed before each' if device.type == 'cuda' else ''}, rounds interleaved.")  # fmt: skip
    print(header)
    print("| M×K→N per rank | config | mode | " + " | ".join(providers) + " |")
    print("|---|---|---|" + "---:|" * len(providers))
    keyed = {}
    for row in rows:
        keyed.setdefault((row["M"], row["K"], row["N"], row["config"], row["mode"]), {})[row["provider"]] = row
    for (M, K, N, config, mode), by_provider in keyed.items():
        cells = " | ".join(f"{by_provider[p]['slowest_rank_median_ms']} ({by_provider[p]['over_gemmbn_single']}x)"
                           for p in providers)  # fmt: skip
        print(f"| {M}×{K}→{N} | {config} | {mode} | {cells} |")
    print("(in parentheses: over gemmbn-single, the unsynchronized layer at the same per-rank shape)")
    if args.out:
        write_csv(args.out, header, COLUMNS, rows)


def _spawned_rank(rank: int, world: int, store: str, args) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    _run(args, torch.device("cpu"))
    dist.barrier()
    os._exit(0)  # as tests/test_sync_batchnorm.py's ranks: tearing a gloo group down can deadlock


def main(argv=None) -> int:
    args = _parse(argv)
    if args.spawn:
        with tempfile.TemporaryDirectory() as directory:
            mp.spawn(_spawned_rank, args=(args.spawn, f"{directory}/store", args), nprocs=args.spawn, join=True)
        return 0
    if "RANK" not in os.environ:
        print("sync_step.py runs under torchrun (--nproc-per-node >= 1), or with --spawn N on the CPU")
        return 1
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    try:
        _run(args, torch.device("cuda", local_rank))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
