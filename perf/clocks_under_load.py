"""Time per call, SM clock and power of each GEMM kernel under sustained load (one process).

    python perf/clocks_under_load.py [--size M K N] [--seconds S] [--dtypes bfloat16,float32] [--rows 0,16]

Why: gemmbn's 16-bit GEMM runs ~13% behind cuBLAS's bare GEMM at 16384x4096->4096 with the same
tensor-core instruction mix, and an H200 at its power limit lowers its clock. If cycles per call
(time x clock) are level, the gap is power (energy per flop: L2 and shared-memory traffic); if the
clocks are level, it is the schedule. Each candidate runs back to back for S seconds (no L2 flush:
sustained throughput, as in training) while `nvidia-smi` samples the clock and power every 50 ms
(read only; nothing is set). Candidates rotate twice, so drift falls on all of them. Two regimes:
  sustained  calls back to back (a training loop's steady state: the board at its power limit)
  bursts     4 calls, then 30 ms idle (how perf/bench.py's interleaved rounds load the GPU)
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

try:
    import gemmbn  # noqa: F401 - an installed build (with its extension) wins
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from gemmbn import debug  # noqa: E402
from gemmbn.debug import gemm_workspace  # noqa: E402


def sample_clocks(seconds: float, run_once, bursts: bool) -> tuple[float, float, float]:
    """(median ms per call, median SM MHz, median W) while run_once() runs for `seconds`."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50", "-i", str(torch.cuda.current_device())],
                           stdout=subprocess.PIPE, text=True)
    for _ in range(3):
        run_once()
    torch.cuda.synchronize()
    times, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(4 if bursts else 20)]
        for start, end in events:
            start.record()
            run_once()
            end.record()
        events[-1][1].synchronize()  # keeps the queue short, so the wall clock and the GPU agree
        times += [start.elapsed_time(end) for start, end in events]
        if bursts:
            time.sleep(0.03)
    smi.terminate()
    out, _ = smi.communicate()
    lines = out.splitlines()
    mhz, watts = [], []
    for line in lines[len(lines) // 5:]:  # the first fifth: ramp-up
        parts = [p.strip() for p in line.split(",")]
        try:
            mhz.append(float(parts[0]))
            watts.append(float(parts[1]))
        except (ValueError, IndexError):
            continue
    median = lambda v: statistics.median(v) if v else math.nan  # noqa: E731
    return statistics.median(times), median(mhz), median(watts)


def candidates(dtype: torch.dtype, M: int, K: int, N: int, rows: set[int] | None = None) -> dict:
    C = debug
    name = str(dtype).removeprefix("torch.")
    x = torch.rand(M, K, device="cuda").to(dtype)
    w = ((torch.rand(N, K, device="cuda") * 2 - 1) / math.sqrt(K)).to(dtype)
    b, s = torch.randn(N, device="cuda").to(dtype), torch.randn(N, device="cuda").to(dtype)
    y = torch.empty(M, N, device="cuda", dtype=dtype)
    wt = w.t()
    fns = {}
    for row, config in enumerate(C.gemm_configs(name, False)):
        if not config["statistics"] or (rows is not None and row not in rows):  # rows without the node: no partials
            continue
        partial_rows, _ = C.gemm_config(name, M, N, K, row)
        row_partials = torch.empty(2, -(-M // partial_rows), N, device="cuda")
        workspace = gemm_workspace(x, N, K, config=row)  # stream-K rows only
        fns[f"gemmbn row {row} gemm+stats"] = lambda row=row, pp=row_partials, ws=workspace: C.gemm_scale_stats(
            x, w, y, b, s, None, None, pp[0], pp[1], None, config=row, workspace=ws)
    fns["gemmbn row 0 gemm"] = lambda: C.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None,
                                                          config=0)
    fns["cuBLAS addmm"] = lambda: torch.addmm(b, x, wt, out=y)
    fns["cuBLAS mm"] = lambda: torch.mm(x, wt, out=y)
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(16384, 4096, 4096), metavar=("M", "K", "N"))
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--rows", help="table rows with the statistics node to time, comma-separated (default: all)")
    args = parser.parse_args()
    rows = None if args.rows is None else {int(r) for r in args.rows.split(",")}
    M, K, N = args.size
    torch.backends.cuda.matmul.allow_tf32 = True  # float32 here means the TF32 kernels on both sides
    print(f"{torch.cuda.get_device_name()}  {M}x{K}->{N}  {args.seconds:g} s per candidate and regime, twice")
    flops = 2.0 * M * N * K
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        fns = candidates(dtype, M, K, N, rows)
        for regime in ("sustained", "bursts"):
            results = {k: [] for k in fns}
            for _ in range(2):
                for k, fn in fns.items():
                    results[k].append(sample_clocks(args.seconds, fn, regime == "bursts"))
            print(f"{dtype_name} {regime}:  {'':<18} {'ms':>7} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6} {'Mcycles':>8}")
            for k, runs in results.items():
                ms = statistics.median(r[0] for r in runs)
                mhz = statistics.median(r[1] for r in runs)
                watts = statistics.median(r[2] for r in runs)
                print(f"  {k:<28} {ms:7.3f} {flops / ms / 1e9:8.0f} {mhz:7.0f} {watts:6.0f} {ms * mhz / 1e3:8.3f}")


if __name__ == "__main__":
    main()
