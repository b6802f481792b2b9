"""Where the training statistics should come from, per shape: the training forward with its partials from the GEMM's
epilogue and from finish_normalize's pass over y, side by side with eager and torch.compile, in one process.

    python perf/statistics_source.py [--sizes "M K N;..."] [--configs tf32,bf16] [--iters 20] [--no-compile] [--out CSV]

Both sources run the same module; the operator reads GEMMBN_STATISTICS_SOURCE per call (api.h:
train_statistics_from_y), which each timed call sets first. Calls are interleaved in rotating rounds, back to back,
the L2 flushed before each (gemmbn.timing). Prints medians, the y pass's ratio to the epilogue, and what the rule
(the variable unset) picks; the rule in kernels/src/gemm_dispatch.cpp is chosen from these tables (perf/NOTES.md v17, v18).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch
import shapes
from models import reference_drop_in_compiled
from train_step import write_csv

from gemmbn import debug, timing

# The sweep's shapes with K <= 1024 (perf/shapes.py), where the epilogue's reductions weigh most.
SIZES = "16384 512 8192;4096 512 8192;65536 512 512;65536 1024 1024;16384 1024 1024;4096 1024 1024"
CONFIGS = {"tf32": (torch.float32, "high"), "bf16": (torch.bfloat16, "-"), "fp16": (torch.float16, "-")}
SOURCE = "GEMMBN_STATISTICS_SOURCE"


def _with_source(module, x, source: str | None):
    def run():
        if source is None:
            os.environ.pop(SOURCE, None)
        else:
            os.environ[SOURCE] = source
        with torch.no_grad():
            module(x)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--configs", default="tf32,bf16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    flush = timing.flush_buffer(device)
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, training forward, median ms")
    print("| M×K→N | config | epilogue | y pass | y / epilogue | eager | compile | rule picks |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for M, K, N in shapes.parse_sizes(args.sizes):
        for config in args.configs.split(","):
            dtype, _ = CONFIGS[config]
            reference, drop_in, compiled, x = reference_drop_in_compiled(M, K, N, dtype)
            fns = {"epilogue": _with_source(drop_in, x, "epilogue"), "y": _with_source(drop_in, x, "y")}
            fns["eager"] = _with_source(reference, x, None)
            if not args.no_compile:
                fns["compile"] = _with_source(compiled, x, None)
            times = timing.interleaved_ms(list(fns.values()), device, iters=args.iters, flush=flush)
            os.environ.pop(SOURCE, None)
            median = {name: statistics.median(t) for name, t in zip(fns, times)}
            picks = "y" if debug.train_statistics_from_y(str(dtype).removeprefix("torch."), M, N, K) else "epilogue"
            rows.append({"M": M, "K": K, "N": N, "config": config, **{f"{k}_ms": f"{v:.4f}" for k, v in median.items()},
                         "rule": picks})  # fmt: skip
            compile_ms = f"{median['compile']:.3f}" if "compile" in median else "—"
            print(f"| {M}×{K}→{N} | {config} | {median['epilogue']:.3f} | {median['y']:.3f} | "
                  f"{median['y'] / median['epilogue']:.3f} | {median['eager']:.3f} | "
                  f"{compile_ms} | {picks} |")
    if args.out:
        commit = os.environ.get("GEMMBN_COMMIT", "unknown")
        header = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, gemmbn {commit}: training forward, "
                  f"median ms of {args.iters} interleaved calls, L2 flushed before each")  # fmt: skip
        write_csv(args.out, header, list(rows[0]), rows)


if __name__ == "__main__":
    main()
