"""perf/ab.sh's bench.py runs side by side: one table, one CSV.

    python perf/ab_summary.py OUT_DIR/bench_{side}_{round}.csv ... [--out combined.csv] [--note "what ran"]

Each file is one bench.py run of one side and round (ab.sh's "{side}" and "{round}" in its --out name, as
bench_<side>_<round>.csv; the side may hold underscores, the round is the last field). Per (shape, precision, mode) and
side it prints the minimum over rounds of bench.py's median, and each side's ratio to the first side named (the
sides in the order of the files given): the min of the round medians, as perf/NOTES.md's A/B tables take it. The eval
rows are the controls where a switch touches only the training forward. --out writes every row with its side and
round in front, the bench.py columns after, and --note as a leading comment.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402  (its reader of bench.py's CSVs)

NAME = re.compile(r"bench_(?P<side>.+)_(?P<round>\d+)\.csv$")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    sides: list[str] = []
    rows: list[tuple[str, str, dict[str, str]]] = []
    for path in args.files:
        match = NAME.search(path.name)
        if match is None:
            raise SystemExit(f"{path}: not bench_<side>_<round>.csv")
        side = match["side"]
        if side not in sides:
            sides.append(side)
        rows += [(side, match["round"], row) for row in report.read(path)[1]]
    best: dict[tuple, dict[str, float]] = {}
    for side, _, row in rows:
        if not row.get("median_ms"):
            continue  # a measurement that raised: bench.py's row carries the error in its note
        key = (int(row["M"]), int(row["K"]), int(row["N"]), row["dtype"], row["precision"], row["mode"])
        times = best.setdefault(key, {})
        times[side] = min(times.get(side, float("inf")), float(row["median_ms"]))
    if args.out:
        with args.out.open("w", newline="") as f:
            if args.note:
                f.write(f"# {args.note}\n")
            columns = list(rows[0][2].keys()) if rows else []
            writer = csv.writer(f)
            writer.writerow(["side", "round", *columns])
            for side, round_, row in rows:
                writer.writerow([side, round_, *(row.get(c, "") for c in columns)])
    ratio_heads = [f"{s} / {sides[0]}" for s in sides[1:]]
    print("| M×K→N | dtype | mode | " + " | ".join(sides + ratio_heads) + " |")
    print("|---|---|---|" + "---:|" * (2 * len(sides) - 1))
    for (M, K, N, dtype, precision, mode), times in best.items():
        label = dtype if precision in ("-", "") else f"{dtype} {precision}"
        cells = [f"{times[s]:.4f}" if s in times else "—" for s in sides]
        base = times.get(sides[0])
        ratios = [f"{times[s] / base - 1:+.1%}" if base and s in times else "—" for s in sides[1:]]
        print(f"| {M}×{K}→{N} | {label} | {mode} | " + " | ".join(cells + ratios) + " |")

if __name__ == "__main__":
    main()
