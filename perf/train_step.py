"""The training step side by side: gemmbn, eager PyTorch and torch.compile, one process, one GPU.

    python perf/train_step.py [--sizes "M K N;..."] [--configs fp32,tf32,bf16,fp16] [--providers ...]
                              [--modes fwd_bwd,step] [--iters N] [--flush] [--sync] [--out CSV]

Each provider trains its own copy of one seeded model (KernelBench's Model: Linear, scale, BatchNorm1d in
training mode): gemmbn's GemmScaleBatchNorm, the reference in eager mode, and torch.compile of the
reference (static shapes). A timed call is one step: zero the gradients, forward, backward to x and every
parameter with a fixed random cotangent (fwd_bwd), and for `step` an SGD-with-momentum update as well.
Calls are timed with CUDA events, the providers interleaved in rotating rounds (gemmbn.timing), back to
back (the host never waits), with the L2 flushed before each call (--flush), and/or with the GPU idle
when each call starts (--sync: a caller that reads its loss every step sees the host's time too). Prints a table of medians
and ratios and writes one CSV row per (shape, config, mode, provider), with the peak memory of one step.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
try:
    import gemmbn  # an installed build (with its extension) wins
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))
    import gemmbn

import shapes  # noqa: E402  (perf/, on sys.path as the script's folder)
from gemmbn import timing

# The issue-16 shapes: KernelBench level 2 problem 39, problem 33, a short-K one and a tall one.
SIZES = "16384 4096 4096;1024 8192 8192;4096 1024 1024;65536 1024 1024"
CONFIGS = {  # name -> (dtype, torch.set_float32_matmul_precision)
    "fp32": (torch.float32, "highest"),
    "tf32": (torch.float32, "high"),
    "bf16": (torch.bfloat16, "highest"),
    "fp16": (torch.float16, "highest"),
}
PROVIDERS = ("gemmbn", "eager", "compile")
MODES = ("fwd_bwd", "step")
COLUMNS = ["M", "K", "N", "config", "mode", "provider", "median_ms", "min_ms", "max_ms", "peak_mib",
           "eager_over_this", "compile_over_this"]  # fmt: skip


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=SIZES, help='"M K N;M K N;..."')
    parser.add_argument("--configs", default="fp32,tf32,bf16")
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--iters", type=int, default=10, help="timed steps per provider (after 2 warm-up steps)")
    parser.add_argument("--flush", action="store_true", help="overwrite 256 MB before each timed step (evicts L2)")
    parser.add_argument("--sync", action="store_true", help="synchronize before each timed step")
    parser.add_argument("--out", type=Path, help="CSV path")
    return parser.parse_args(argv)


def _commit() -> str:
    if os.environ.get("GEMMBN_COMMIT"):
        return os.environ["GEMMBN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE).stdout.strip() or "unknown"  # fmt: skip
    except OSError:
        return "unknown"


def _models(M: int, K: int, N: int, dtype: torch.dtype, providers: list[str]) -> dict:
    """provider -> its own copy of one seeded model."""
    torch.manual_seed(0)
    reference = gemmbn.ReferenceModel(K, N, (N,)).to("cuda", dtype)
    models = {}
    for provider in providers:
        module = copy.deepcopy(reference)
        if provider == "gemmbn":
            module = gemmbn.GemmScaleBatchNorm.from_module(module)
        elif provider == "compile":
            module = torch.compile(module, dynamic=False)
        models[provider] = module
    return models


def _problem(M: int, K: int, N: int, config: str, providers: list[str]) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(provider -> model, x requiring its gradient, a fixed random cotangent) of a training step at M x K -> N in
    config, with PyTorch's float32 matmul precision set to the config's."""
    dtype, precision = CONFIGS[config]
    torch.set_float32_matmul_precision(precision)
    models = _models(M, K, N, dtype, providers)
    x = torch.rand(M, K, device="cuda", dtype=dtype, requires_grad=True)
    return models, x, torch.randn(M, N, device="cuda", dtype=dtype)


def sgd(module, mode: str):
    """A step's optimizer in `mode`: SGD with momentum for "step", None for "fwd_bwd" (forward and backward only)."""
    return torch.optim.SGD(module.parameters(), lr=1e-4, momentum=0.9) if mode == "step" else None


def _step(module, x: torch.Tensor, dout: torch.Tensor, optimizer):
    """One training step (optimizer None: forward and backward only); x requires its gradient."""
    def run():
        module.zero_grad(set_to_none=True)
        x.grad = None
        module(x).backward(dout)
        if optimizer is not None:
            optimizer.step()
    return run


def _peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure(M, K, N, config, modes, providers, iters, flush, sync) -> list[dict]:
    # Every compiled copy shares ReferenceModel.forward's code: without a reset, the ninth (shape, config)
    # meets dynamo's recompile limit and runs eagerly under the "compile" name.
    torch._dynamo.reset()
    models, x, dout = _problem(M, K, N, config, providers)
    rows = []
    for mode in modes:
        steps = {}
        for provider, module in models.items():
            steps[provider] = _step(module, x, dout, sgd(module, mode))
        peaks = {provider: _peak_mib(fn) for provider, fn in steps.items()}  # also the first (compiling) call
        times = timing.interleaved_ms(list(steps.values()), torch.device("cuda"), iters=iters, warmup=2,
                                      flush=timing.flush_buffer(torch.device("cuda")) if flush else None,
                                      synchronize=sync)  # fmt: skip
        medians = {provider: statistics.median(t) for provider, t in zip(steps, times)}
        for (provider, t) in zip(steps, times):
            rows.append({
                "M": M, "K": K, "N": N, "config": config, "mode": mode, "provider": provider,
                "median_ms": f"{medians[provider]:.4f}", "min_ms": f"{min(t):.4f}", "max_ms": f"{max(t):.4f}",
                "peak_mib": f"{peaks[provider]:.0f}",
                "eager_over_this": f"{medians['eager'] / medians[provider]:.3f}" if "eager" in medians else "",
                "compile_over_this": f"{medians['compile'] / medians[provider]:.3f}" if "compile" in medians else "",
            })  # fmt: skip
    return rows


def table(rows: list[dict], providers: list[str]) -> str:
    """Markdown: one line per (shape, config, mode), the providers' medians, gemmbn's ratios."""
    lines = ["| M×K→N | config | mode | " + " | ".join(f"{p} ms" for p in providers) +
             " | eager / gemmbn | compile / gemmbn | peak MiB (gemmbn / eager / compile) |",
             "|---|---|---|" + "---:|" * (len(providers) + 3)]  # fmt: skip
    keyed = {}
    for row in rows:
        keyed.setdefault((row["M"], row["K"], row["N"], row["config"], row["mode"]), {})[row["provider"]] = row
    for (M, K, N, config, mode), by_provider in keyed.items():
        medians = " | ".join(by_provider[p]["median_ms"] if p in by_provider else "—" for p in providers)
        ours = by_provider.get("gemmbn", {})
        peaks = " / ".join(by_provider[p]["peak_mib"] for p in PROVIDERS if p in by_provider)
        lines.append(f"| {M}×{K}→{N} | {config} | {mode} | {medians} | {ours.get('eager_over_this') or '—'}x | "
                     f"{ours.get('compile_over_this') or '—'}x | {peaks} |")  # fmt: skip
    return "\n".join(lines)


def write_csv(path: Path, header: str, columns: list[str], rows: list[dict]) -> None:
    """rows under a "# header" line (the run's machine, versions and method), columns in this order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write(f"# {header}\n")
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None) -> int:
    args = _parse(argv)
    if not torch.cuda.is_available():
        print("train_step.py times GPU training steps; no CUDA device here")
        return 1
    providers = [p for p in args.providers.split(",") if p]
    rows = []
    for M, K, N in shapes.parse_sizes(args.sizes):
        for config in args.configs.split(","):
            rows += measure(M, K, N, config, args.modes.split(","), providers, args.iters, args.flush, args.sync)
            print(table(rows[-len(providers) * len(args.modes.split(",")):], providers).splitlines()[-1], flush=True)
    method = " and ".join(m for m, on in (("L2 flushed before each step", args.flush),
                                          ("synchronized before each step", args.sync)) if on) or "back to back"
    header = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, gemmbn {_commit()}, "
              f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}. Training step "
              f"(zero grads, forward, backward{', SGD step' if 'step' in args.modes else ''}), median ms of "
              f"{args.iters} steps, {method}, providers interleaved in rotating rounds.")  # fmt: skip
    print("\n" + header + "\n\n" + table(rows, providers))
    if args.out:
        write_csv(args.out, header, COLUMNS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
