"""Where the training forward's statistics and product should come from, per shape: the training forward with its
partials from the GEMM's epilogue, from finish_normalize's pass over y, and (16-bit) with cuBLAS's product and the
finish's product variant, side by side with the rule's choice, eager and torch.compile, in one process.

    python perf/statistics_source.py [--sizes "M K N;..."] [--configs tf32,bf16] [--iters 20] [--no-compile]
                                     [--no-cublas] [--sync] [--step] [--out CSV]

Every candidate runs the same module; the operator reads GEMMBN_STATISTICS_SOURCE and GEMMBN_TRAIN_PRODUCT per call
(api.h: train_statistics_from_y, train_product_by_cublas), which each timed call sets first. Calls are interleaved in
rotating rounds, back to back, the L2 flushed before each (gemmbn.timing). Prints medians, the y pass's and cuBLAS's
ratios to the epilogue, and what the rules (the variables unset) pick; the rules in kernels/src/gemm_dispatch.cpp are
chosen from these tables (perf/NOTES.md v17, v18, v28). --sync: the GPU idle before each call (the host's time shows);
--step: forward and backward (y kept for it) instead of the forward under no_grad. The cuBLAS candidate runs only in a
build with CMake GEMMBN_CUBLAS_PRODUCT=ON (the variable forces nothing in others).
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
SOURCE, PRODUCT = "GEMMBN_STATISTICS_SOURCE", "GEMMBN_TRAIN_PRODUCT"
# Each candidate's settings of the two variables (None: unset, the rules decide).
CANDIDATES = {"epilogue": ("epilogue", "gemmbn"), "y": ("y", "gemmbn"), "cublas": (None, "cublas"), "rule": (None, None)}


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _with_source(module, x, source: str | None, product: str | None = None, dout: torch.Tensor | None = None):
    """One timed call: the forward under no_grad, or (dout given; x requires its gradient) forward and backward."""
    def run():
        _set(SOURCE, source)
        _set(PRODUCT, product)
        if dout is None:
            with torch.no_grad():
                module(x)
        else:
            module.zero_grad(set_to_none=True)
            module(x).backward(dout)
    return run


def _cublas_product_built() -> bool:
    _set(PRODUCT, "cublas")
    built = debug.train_product_by_cublas("bfloat16", 16384, 512, 8192)
    _set(PRODUCT, None)
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--configs", default="tf32,bf16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-cublas", action="store_true", help="without the cuBLAS product candidate")
    parser.add_argument("--sync", action="store_true", help="the GPU idle before each timed call")
    parser.add_argument("--step", action="store_true", help="forward and backward instead of the forward")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    flush = timing.flush_buffer(device)
    rows = []
    cublas = not args.no_cublas and _cublas_product_built()
    what = ("training forward + backward" if args.step else "training forward") + (", synchronized" if args.sync else "")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {what}, median ms")
    print("| M×K→N | config | epilogue | y pass | cuBLAS | rule | y / epilogue | cuBLAS / best other | eager | compile "
          "| rule picks |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for M, K, N in shapes.parse_sizes(args.sizes):
        for config in args.configs.split(","):
            dtype, _ = CONFIGS[config]
            reference, drop_in, compiled, x = reference_drop_in_compiled(M, K, N, dtype)
            dout = torch.randn(M, N, device=x.device, dtype=dtype) if args.step else None
            x.requires_grad_(args.step)
            dtype_name = str(dtype).removeprefix("torch.")
            half = dtype != torch.float32
            fns = {name: _with_source(drop_in, x, *settings, dout=dout) for name, settings in CANDIDATES.items()
                   if name != "cublas" or (half and cublas)}  # fmt: skip
            fns["eager"] = _with_source(reference, x, None, dout=dout)
            if not args.no_compile:
                fns["compile"] = _with_source(compiled, x, None, dout=dout)
            times = timing.interleaved_ms(list(fns.values()), device, iters=args.iters, flush=flush,
                                          synchronize=args.sync)  # fmt: skip
            _set(SOURCE, None)
            _set(PRODUCT, None)
            median = {name: statistics.median(t) for name, t in zip(fns, times)}
            picks = "y" if debug.train_statistics_from_y(dtype_name, M, N, K) else "epilogue"
            if half and debug.train_product_by_cublas(dtype_name, M, N, K):
                picks = "cublas"
            rows.append({"M": M, "K": K, "N": N, "config": config, **{f"{k}_ms": f"{v:.4f}" for k, v in median.items()},
                         "rule_picks": picks})  # fmt: skip
            show = lambda name: f"{median[name]:.4f}" if name in median else "—"  # noqa: E731
            cublas_ratio = (f"{median['cublas'] / min(median['epilogue'], median['y']):.3f}" if "cublas" in median
                            else "—")  # fmt: skip
            print(f"| {M}×{K}→{N} | {config} | {show('epilogue')} | {show('y')} | {show('cublas')} | {show('rule')} | "
                  f"{median['y'] / median['epilogue']:.3f} | {cublas_ratio} | {show('eager')} | {show('compile')} | "
                  f"{picks} |", flush=True)
    if args.out:
        commit = os.environ.get("GEMMBN_COMMIT", "unknown")
        header = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, gemmbn {commit}: {what}, "
                  f"median ms of {args.iters} interleaved calls, L2 flushed before each")  # fmt: skip
        columns = list(dict.fromkeys(key for row in rows for key in row))  # float32 rows have no cuBLAS column
        write_csv(args.out, header, columns, rows)


if __name__ == "__main__":
    main()
