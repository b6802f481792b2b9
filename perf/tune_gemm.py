"""Tuning sweep of the fused GEMM: every row of the configuration tables x tile orders, one process.

    python perf/tune_gemm.py [--size M K N ...] [--set NAME] [--dtypes float32,bfloat16,float16,split] [--rasters 0,1,2]
                             [--swizzles 1,2,4,8] [--splits 1,2,4] [--rows 0,1] [--no-stats] [--iters 20] [--out CSV]

For each (operand type, row of kernels/include/gemmbn/configs.h, raster, swizzle): the median time of
one gemm_scale_stats launch with the statistics epilogue (what a training forward with the epilogue's statistics runs;
--no-stats: without the node, as the eval forward and a training forward with its statistics from y run), L2 flushed
before every call as perf/bench.py does, next to cuBLAS `mm` and `addmm` in the same precision
(float32: TF32; split, the fp32-faithful GEMM on float32 data: IEEE SGEMM). All candidates
of a dtype are timed interleaved (round i times each once), so clock drift under load is shared. raster: 0 CUTLASS
heuristic, 1 along M, 2 along N; swizzle: the persistent scheduler's max swizzle size (0: the one a launch that names
none gets, configs.h unpadded_swizzle, written "rule:<size>"); splits (stream-K
rows only): 1 CUTLASS's data-parallel waves plus stream-K remainder, n > 1 plain split-K (a call that names no
split gets select_splits's choice, configs.h); rows: the table rows to time (default: every row). The fastest
line per dtype is the candidate for select_config (kernels/src/gemm_dispatch.cpp) at this shape.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench import Timer
import shapes
from gemmbn import debug
from gemmbn.debug import gemm_workspace

# name -> (dtype, split)
OPERANDS = {"float32": (torch.float32, False), "bfloat16": (torch.bfloat16, False),
            "float16": (torch.float16, False), "split": (torch.float32, True)}  # fmt: skip


def sweep(M: int, K: int, N: int, name: str, rasters, swizzles, split_counts, timer: Timer,
          table_rows=None, with_node: bool = True) -> list[dict]:
    C = debug
    dtype, split = OPERANDS[name]
    dtype_name = str(dtype).removeprefix("torch.")
    torch.manual_seed(0)
    x = torch.rand(M, K, device="cuda", dtype=dtype)
    w = (torch.rand(N, K, device="cuda", dtype=dtype) - 0.5) / K**0.5
    b = torch.rand(N, device="cuda", dtype=dtype)
    s = torch.randn(N, device="cuda", dtype=dtype)
    y = torch.empty(M, N, device="cuda", dtype=dtype)
    flops = 2 * M * N * K
    split_args = {}
    if split:  # the weight split once, untimed: the module caches it per weight version
        split_args = debug.split_gemm_arguments(w, M)
    candidates = []  # (row dict, fn)
    for index, config in enumerate(C.gemm_configs(dtype_name, split)):
        if (table_rows is not None and index not in table_rows) or (with_node and not config["statistics"]):
            continue  # a row without the statistics node takes launches without partials only
        tile_m, _ = C.gemm_config(dtype_name, M, N, K, index, split)
        partials = torch.empty(2, -(-M // tile_m), N, device="cuda") if with_node else (None, None)
        shape = f"{config['tile_m']}x{config['tile_n']}x{config['tile_k']} c{config['cluster_m']}x{config['cluster_n']}"
        shape += f" epi{config['epilogue_n'] or 'auto'}" + (" pingpong" if config['pingpong'] else "")
        shape += " stream-K" if config["stream_k"] else ""
        for splits in split_counts if config["stream_k"] else [-1]:
            for raster in rasters:
                for swizzle in swizzles:
                    # Allocated once per candidate, untimed (the module allocates from PyTorch's cache per call).
                    workspace = gemm_workspace(x, N, K, config=index, split=split, splits=splits, raster=raster,
                                               swizzle=swizzle, statistics=with_node)  # fmt: skip
                    label = swizzle if swizzle > 0 else \
                        f"rule:{debug.gemm_launch_config(dtype_name, M, N, K, index, split, with_node)['swizzle']}"
                    def launch(index=index, raster=raster, swizzle=swizzle, partials=partials, splits=splits,
                               workspace=workspace):
                        C.gemm_scale_stats(x, w, y, b, s, None, None, partials[0], partials[1], None,
                                           config=index, raster=raster, swizzle=swizzle, splits=splits,
                                           workspace=workspace, **split_args)
                    candidates.append(({"dtype": name, "provider": "gemmbn", "statistics": int(with_node), "row": index,
                                        "config": shape, "raster": raster, "swizzle": label, "splits": splits}, launch))
    def with_tf32(fn):  # float32 -> TF32 cuBLAS as the TF32 kernel, IEEE for split; bf16/fp16 unaffected
        def call():
            previous = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = not split
            try:
                return fn()
            finally:
                torch.backends.cuda.matmul.allow_tf32 = previous
        return call
    for provider, fn in (("cublas mm", lambda: torch.mm(x, w.t())), ("cublas addmm", lambda: torch.addmm(b, x, w.t()))):
        candidates.append(({"dtype": name, "provider": provider, "statistics": "", "row": "", "config": "",
                            "raster": "", "swizzle": "", "splits": ""}, with_tf32(fn)))
    # Interleaved rounds: clock drift under sustained load falls on every candidate alike.
    times = timer.interleaved([fn for _, fn in candidates])
    rows = []
    for (row, _), samples in zip(candidates, times):
        ms = statistics.median(samples)
        rows.append({**row, "median_ms": ms, "spread_ms": max(samples) - min(samples), "tflops": flops / ms / 1e9})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, action="append", metavar=("M", "K", "N"),
                        help="repeatable (default: 16384 4096 4096)")
    parser.add_argument("--set", help="perf/shapes.py's shape sets as well (bench.py's --set)")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16,split")
    parser.add_argument("--rasters", default="0,1,2")
    parser.add_argument("--swizzles", default="1,2,4,8", help="0: the launch's rule")
    parser.add_argument("--splits", default="1", help="stream-K rows: 1 (stream-K) and/or split-K factors")
    parser.add_argument("--rows", help="table rows to time, comma-separated (default: every row)")
    parser.add_argument("--no-stats", action="store_true", help="the GEMM without its statistics node")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", help="CSV of every line")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("tune_gemm.py needs a CUDA device (sm90)")
    sizes = [tuple(size) for size in args.size or ([] if args.set else [(16384, 4096, 4096)])]
    sizes += [tuple(shape) for _, shape in shapes.resolve(args.set)] if args.set else []
    rasters = [int(v) for v in args.rasters.split(",")]
    swizzles = [int(v) for v in args.swizzles.split(",")]
    split_counts = [int(v) for v in args.splits.split(",")]
    table_rows = None if args.rows is None else {int(v) for v in args.rows.split(",")}
    timer = Timer(torch.device("cuda"), args.iters, warmup=3)
    rows = []
    for (M, K, N), name in ((size, name) for size in sizes for name in args.dtypes.split(",")):
        found = [{"M": M, "K": K, "N": N, **r}
                 for r in sweep(M, K, N, name, rasters, swizzles, split_counts, timer, table_rows,
                                             not args.no_stats)]
        rows += found
        cublas = min(r["median_ms"] for r in found if r["provider"].startswith("cublas"))
        node = "without the statistics node" if args.no_stats else "with the statistics node"
        print(f"\n{torch.cuda.get_device_name()}  {M}x{K}->{N} {name} {node}: median of {args.iters}, L2 flushed, ms, "
              "fastest first (ratio to the faster cuBLAS call)")
        for r in sorted(found, key=lambda r: r["median_ms"]):
            label = r["provider"]
            if r["provider"] == "gemmbn":
                label = f"row {r['row']} {r['config']} raster {r['raster']} swizzle {r['swizzle']}"
                label += f" splits {r['splits']}" if r["splits"] > 1 else ""
            print(f"  {r['median_ms']:8.3f} ms {r['tflops']:6.0f} TFLOP/s {r['median_ms'] / cublas:6.3f}x  {label}")
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
