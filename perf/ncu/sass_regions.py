"""Where a kernel's warp-state samples sit: Nsight Compute's SASS source page (perf/ncu/profile.sh's *.sass.csv) cut
into regions of consecutive instructions, each with its share of the samples, its stall reasons and its opcodes.

    python perf/ncu/sass_regions.py OUT/gemm.sass.csv [--cuts 301,430,11280] [--top 12]

Without --cuts the whole kernel is one region; the hottest instructions are listed with their indices either way, to
choose cuts from. In our CUTLASS kernels the consumers' mainloop starts a few instructions before the first HGMMA and
ends at the wait on the last wgmma (WARPGROUP.DEPBAR), their epilogue follows, and the producer warp's code comes last
(perf/NOTES.md v60 cut row 16's kernel at 301, 430 and 11280).
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys
from pathlib import Path
from typing import NamedTuple

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_sass(path: str | Path) -> list[dict[str, str]]:
    """The page's instruction rows (ncu writes a line naming the kernel before the header)."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        raise ValueError(f"{path}: no header row starting with \"Address\" (not ncu's --page source --csv output?)")
    return list(csv.DictReader(lines[start:]))


def samples(row: dict[str, str]) -> int:
    return int(row.get(SAMPLES) or 0)


def opcode(source: str) -> str:
    """The instruction's opcode without its predicate and modifiers: '@!P1 BRA 0x...' -> 'BRA'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


class Region(NamedTuple):
    start: int  # first instruction index
    end: int  # one past the last
    samples: int
    share: float  # of the kernel's samples
    stalls: list[tuple[str, int]]  # reason (without "stall_"), samples; most first
    opcodes: list[tuple[str, int]]


def regions(rows: list[dict[str, str]], cuts: list[int], top: int = 6) -> list[Region]:
    """The regions [0, c1), [c1, c2), ..., [cn, len(rows)) of the rows, cut at the given indices."""
    bounds = [0, *cuts, len(rows)]
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cuts must increase strictly inside (0, {len(rows)}): {cuts}")
    stall_columns = [c for c in (rows[0] if rows else {}) if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(samples(r) for r in rows) or 1
    out = []
    for start, end in zip(bounds, bounds[1:]):
        stalls, ops = collections.Counter(), collections.Counter()
        for row in rows[start:end]:
            ops[opcode(row["Source"])] += samples(row)
            for column in stall_columns:
                stalls[column.removeprefix("stall_")] += int(row[column] or 0)
        n = sum(samples(r) for r in rows[start:end])
        out.append(Region(start, end, n, n / total, stalls.most_common(top), ops.most_common(top)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sass_csv")
    parser.add_argument("--cuts", default="", help="instruction indices where regions start, comma-separated")
    parser.add_argument("--top", type=int, default=12, help="hottest instructions to list")
    args = parser.parse_args(argv)
    rows = read_sass(args.sass_csv)
    cuts = [int(c) for c in args.cuts.split(",") if c.strip()]
    total = sum(samples(r) for r in rows)
    print(f"{args.sass_csv}: {len(rows)} instructions, {total} samples")
    for region in regions(rows, cuts):
        stalls = ", ".join(f"{name} {n / max(region.samples, 1):.0%}" for name, n in region.stalls if n)
        ops = ", ".join(f"{name} {n / max(region.samples, 1):.0%}" for name, n in region.opcodes if n)
        print(f"[{region.start}, {region.end}): {region.share:6.1%} of samples ({region.samples})")
        print(f"    stalls: {stalls}\n    opcodes: {ops}")
    print(f"hottest {args.top}:")
    hottest = sorted(range(len(rows)), key=lambda i: -samples(rows[i]))[: args.top]
    for i in hottest:
        print(f"  {i:6d} {samples(rows[i]):8d}  {rows[i]['Source'].strip()[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
