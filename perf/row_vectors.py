"""What the epilogue's per-column vectors cost: the GEMM without partials (the eval forward's and the y-pass training
forward's launch) with each set of its vectors given, in one process.

    python perf/row_vectors.py [--sizes "M K N;..."] [--configs tf32,bf16] [--iters 40] [--rounds 2] [--out CSV]

y = ((x W^T + b) s) g + h with b, s (the layer's bias and scale, in the data's dtype) and g, h (the eval fold's gain
and shift, float32) each given or left null (the identity), on the row select_config picks for a launch without
partials. Candidates are timed interleaved, L2 flushed before each call (gemmbn.timing), `rounds` times. The eval
forward launches (g, h), the training forward (b, s); "none" is the floor the vectors add to (perf/NOTES.md v26);
"g,h=b,s" gives g = s and h = b s in float32, the (b, s) launch's output through the float vectors: the vectors' type
against the output's values (perf/NOTES.md v32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes
from models import reference_drop_in_compiled
from train_step import write_csv

from gemmbn import debug, timing

SIZES = "16384 512 8192;4096 512 8192;65536 512 512;16384 4096 4096"
CONFIGS = {"tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VECTOR_SETS = ("none", "b", "g", "b,s", "g,h", "b,s,g,h", "g,h=b,s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--configs", default="tf32,bf16")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    flush = timing.flush_buffer(device)
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, GEMM without partials, median ms")
    print(f"| M×K→N | config | row | round | {' | '.join(VECTOR_SETS)} |")
    print("|---|---|---:|---:|" + "---:|" * len(VECTOR_SETS))
    for M, K, N in shapes.parse_sizes(args.sizes):
        for config in args.configs.split(","):
            dtype = CONFIGS[config]
            _, drop_in, _, x = reference_drop_in_compiled(M, K, N, dtype)
            w, b, s = drop_in.gemm.weight.detach(), drop_in.gemm.bias.detach(), drop_in.scale.detach()
            g = torch.rand(N, device=device) + 0.5
            h = torch.rand(N, device=device) - 0.5
            y = torch.empty(M, N, device=device, dtype=dtype)
            workspace = debug.gemm_workspace(x, N, K, statistics=False)
            given = {"b": b, "s": s, "g": g, "h": h}

            def launch(names: str):
                if names == "g,h=b,s":
                    v = [None, None, s.float(), b.float() * s.float()]
                else:
                    v = [given[n] if n in names.split(",") else None for n in "bsgh"]
                return lambda: debug.gemm_scale_stats(x, w, y, *v, None, None, None, workspace=workspace)

            row = debug.gemm_selected_config(str(dtype).removeprefix("torch."), M, N, K, statistics=False)
            for r in range(args.rounds):
                times = timing.interleaved_ms([launch(v) for v in VECTOR_SETS], device, iters=args.iters, flush=flush)
                median = {v: statistics.median(t) for v, t in zip(VECTOR_SETS, times)}
                rows.append({"M": M, "K": K, "N": N, "config": config, "row": row, "round": r,
                             **{f"{v}_ms": f"{median[v]:.4f}" for v in VECTOR_SETS}})  # fmt: skip
                cells = " | ".join(f"{median[v]:.4f}" for v in VECTOR_SETS)
                print(f"| {M}×{K}→{N} | {config} | {row} | {r} | {cells} |")
    if args.out:
        commit = os.environ.get("GEMMBN_COMMIT", "unknown")
        header = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, gemmbn {commit}: GEMM without partials, "
                  f"median ms of {args.iters} interleaved calls, L2 flushed before each")  # fmt: skip
        write_csv(args.out, header, list(rows[0]), rows)


if __name__ == "__main__":
    main()
