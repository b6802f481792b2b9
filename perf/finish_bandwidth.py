"""finish_normalize against the copy bandwidth it is bound by (issue target: >= 90% of a device copy).

    python perf/finish_bandwidth.py [--size M N | --sizes "M N;M N"] [--iters 30] [--walks]

One process, candidates timed interleaved with the L2 flushed before each call (perf/bench.py's Timer):
  finish       gemmbn's finish_normalize in place over y (reads y once, writes it once), with the
               partials' row count the GEMM's selected row writes at M x N (K = N)
  static, claims  (--walks) the same with phase 2's items walked statically or claimed from a counter
               (GEMMBN_FINISH_CLAIMS=0 / 1, read at each launch), whatever the rule picks
  copy         torch: y2.copy_(y)           (reads and writes the same bytes: the ceiling)
  in-place     torch: y.mul_(1.0)           (the same access pattern as finish, one elementwise op)
Bandwidth = bytes read + written / median time. Reported per dtype, with finish / copy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Timer
from gemmbn import debug


def _walk(walk: str, finish):
    """finish() with GEMMBN_FINISH_CLAIMS set to walk ("0" static, "1" claims) for the launch."""
    def run():
        os.environ["GEMMBN_FINISH_CLAIMS"] = walk
        try:
            finish()
        finally:
            del os.environ["GEMMBN_FINISH_CLAIMS"]
    return run


def measure(name: str, dtype: torch.dtype, M: int, N: int, timer: Timer, walks: bool = False) -> None:
    """Print finish, copy and in-place times and bandwidths for one dtype."""
    C = debug
    tile_m, _ = C.gemm_config(name, M, N, N)  # name is the dtype string the binding takes
    tiles = -(-M // tile_m)
    y = torch.randn(M, N, device="cuda").to(dtype)
    y2 = torch.empty_like(y)
    # Partials of y itself, so the normalize is a well-defined (if unused) transform.
    rows = torch.arange(M, device="cuda") // tile_m
    partials = torch.zeros(2, tiles, N, device="cuda")
    partials[0].index_add_(0, rows, y.float())
    partials[0] /= torch.bincount(rows, minlength=tiles).clamp(min=1).unsqueeze(1).float()
    partials[1].fill_(float(tile_m))  # M2 ~ n var with var 1
    gamma, beta = torch.ones(N, device="cuda", dtype=dtype), torch.zeros(N, device="cuda", dtype=dtype)
    save = torch.empty(2, N, device="cuda")
    def finish():
        C.finish_normalize(y, y, partials[0], partials[1], tile_m, gamma, beta, None, None, None, 0.1, 1e-5, save[0],
                           save[1])

    candidates = {"finish": finish, "copy": lambda: y2.copy_(y), "in-place": lambda: y.mul_(1.0)}
    if walks:
        candidates.update({"static": _walk("0", finish), "claims": _walk("1", finish)})
    times = dict(zip(candidates, timer.interleaved(list(candidates.values()))))
    moved = 2 * y.numel() * y.element_size()
    medians = {k: statistics.median(v) for k, v in times.items()}
    for k, ms in medians.items():
        print(f"  {M}x{N} {name:<9} {k:<9} {ms * 1e3:8.1f} us  {moved / ms / 1e9:6.2f} TB/s  "
              f"{medians['copy'] / ms:6.1%} of copy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=2, type=int, default=(16384, 4096), metavar=("M", "N"))
    parser.add_argument("--sizes", help='"M N;M N": several sizes instead of --size')
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--walks", action="store_true", help="also time phase 2 walked statically and claimed")
    args = parser.parse_args()
    sizes = [tuple(map(int, s.split())) for s in args.sizes.split(";")] if args.sizes else [tuple(args.size)]
    timer = Timer(torch.device("cuda"), args.iters, warmup=3)
    print(f"{torch.cuda.get_device_name()}  median of {args.iters}, interleaved, L2 flushed (partials included)")
    for M, N in sizes:
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            measure(name, dtype, M, N, timer, args.walks)


if __name__ == "__main__":
    main()
