"""Summarize a perf/bench.py CSV: a Markdown table (for the README) and a PNG of gemmbn's speedup.

    python perf/report.py RESULTS.csv [--readme-table OUT.md] [--plot OUT.png | --no-plot]
                          [--earlier-run EARLIER.csv]

The table has one line per shape, config and mode (train, eval) in which gemmbn ran. The plot shows,
per shape, best PyTorch / gemmbn for the training forward, where best PyTorch is the fastest of
eager, compile and compile-max-autotune that was measured; one series per config. Without
matplotlib the table is still written and the exit status is 1.

With --earlier-run, a line whose eager, torch.compile or cuBLAS median is more than DISTURBED off the earlier run's
of the same shape, config and mode is marked ‡: none of them changes with gemmbn's commits (under the same torch), so
such a line timed a disturbed device (perf/NOTES.md v24: the device's host ran eager and cuBLAS 1.3-4x slow at times).
The summary line counts the training forward ahead of the best PyTorch path with those lines apart. `--earlier-run
auto` takes the newest CSV in perf/results with the same sets, timing and torch and an earlier date.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

BASELINES = ("eager", "compile", "compile-max-autotune")
# Providers that gemmbn's commits cannot change (the same torch), and how far off an earlier run's median marks a
# line disturbed: v24's undisturbed reruns stayed within ~10%, its disturbed ones were 1.3-4x off.
UNCHANGING = (("eager", None), ("compile", None), ("cublas", "gemm"))
DISTURBED = 1.25
COLUMNS = (  # (provider, mode or None = the line's own mode, title)
    ("gemmbn", None, "gemmbn"),
    ("eager", None, "eager"),
    ("compile", None, "compile"),
    ("compile-max-autotune", None, "max-autotune"),
    ("cublas", "gemm", "cuBLAS GEMM+bias"),
    ("gemmbn-gemm-only", None, "gemmbn GEMM only"),  # runs before v26's: one "gemm" row for both lines
)


def _cell_row(group: dict, provider: str, fixed_mode: str | None, mode: str) -> dict[str, str] | None:
    """The row a line's column shows: the provider's in the column's mode, else in the line's, else its "gemm" row."""
    return group.get((provider, fixed_mode or mode)) or group.get((provider, "gemm"))


def read(path: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(metadata from the '# key: value' lines, rows as dicts of strings)."""
    meta, lines = {}, []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line.lstrip("# ").partition(": ")
            meta[key] = value
        elif line.strip():
            lines.append(line)
    return meta, list(csv.DictReader(lines))


def config_name(row: dict[str, str]) -> str:
    """fp32 (IEEE "highest"), tf32 ("high"), tf32-medium, bf16, fp16."""
    if row["dtype"] == "float32":
        return {"highest": "fp32", "high": "tf32"}.get(row["precision"], f"tf32-{row['precision']}")
    return {"bfloat16": "bf16", "float16": "fp16"}.get(row["dtype"], row["dtype"])


def _groups(rows: list[dict[str, str]]) -> dict[tuple, dict[tuple[str, str], dict[str, str]]]:
    """{(M, K, N, config): {(provider, mode): row}} over rows with a time, in first-seen order."""
    groups: dict[tuple, dict] = {}
    for row in rows:
        if row["median_ms"]:
            key = (int(row["M"]), int(row["K"]), int(row["N"]), config_name(row))
            groups.setdefault(key, {})[(row["provider"], row["mode"])] = row
    return groups


def speedups(rows: list[dict[str, str]], mode: str = "train") -> dict[tuple, float]:
    """{(M, K, N, config): best PyTorch ms / gemmbn ms} for ``mode``, where both were measured."""
    result = {}
    for key, group in _groups(rows).items():
        base = [float(group[(p, mode)]["median_ms"]) for p in BASELINES if (p, mode) in group]
        if ("gemmbn", mode) in group and base:
            result[key] = min(base) / float(group[("gemmbn", mode)]["median_ms"])
    return result


RESULTS = Path(__file__).resolve().parent / "results"


def latest_earlier_run(meta: dict[str, str], directory: Path = RESULTS) -> Path | None:
    """The newest bench CSV in ``directory`` timed like ``meta``'s run (same GPU, sets, timing and torch) before it,
    among those that timed a provider our commits cannot change (runs of gemmbn alone, A/B runs, cannot mark
    anything). Another GPU's run is no reference: an H100's times are not an H200's."""
    same = ("gpu", "sets", "timing", "torch")
    unchanging = {provider for provider, _ in UNCHANGING}
    candidates = []
    for path in directory.glob("*.csv"):
        other, rows = read(path)
        if (all(other.get(key) == meta.get(key) for key in same) and other.get("date", "") < meta.get("date", "")
                and any(row.get("provider") in unchanging for row in rows)):
            candidates.append((other["date"], path))
    return max(candidates)[1] if candidates else None


def disturbed(rows: list[dict[str, str]], earlier: list[dict[str, str]]) -> dict[tuple, list[str]]:
    """{(M, K, N, config, mode): ["eager 1.9x", ...]} where an unchanging provider's median is more than DISTURBED
    off ``earlier``'s (either way) on a line both runs measured."""
    before, result = _groups(earlier), {}
    for key, group in _groups(rows).items():
        for mode in ("train", "eval"):
            off = []
            for provider, fixed_mode in UNCHANGING:
                now = group.get((provider, fixed_mode or mode))
                then = before.get(key, {}).get((provider, fixed_mode or mode))
                if now and then:
                    ratio = float(now["median_ms"]) / float(then["median_ms"])
                    if max(ratio, 1 / ratio) > DISTURBED:
                        off.append(f"{provider} {ratio:.2f}x")
            if off:
                result[(*key, mode)] = off
    return result


def markdown(meta: dict[str, str], rows: list[dict[str, str]], earlier: list[dict[str, str]] | None = None,
             earlier_name: str = "") -> str:
    """The README table: median ms per provider, gemmbn's speedup over the best PyTorch, its TFLOP/s; with an
    earlier run, ‡ on the lines that look disturbed and a summary of the training forward."""
    lines = [
        (
            f"{meta.get('gpu', '?')}, driver {meta.get('driver', '?')}, CUDA {meta.get('cuda', '?')}, "
            f"torch {meta.get('torch', '?')}, gemmbn {meta.get('gemmbn_commit', '?')}, {meta.get('date', '?')}. "
            f"Forward under no_grad, median ms of {meta.get('iters', '?')} calls; {meta.get('timing', '')}."
        ),
    ]
    if meta.get("warning"):
        lines.append(f"**{meta['warning']}.**")
    titles = [title for *_, title in COLUMNS]
    lines += ["", "| M×K→N | config | mode | " + " | ".join(titles) + " | best PyTorch / gemmbn | gemmbn TFLOP/s |",
              "|---|---|---|" + "---:|" * (len(titles) + 2)]  # fmt: skip
    fallback_seen, ratios = False, {mode: speedups(rows, mode) for mode in ("train", "eval")}
    off = disturbed(rows, earlier) if earlier is not None else {}
    for (M, K, N, config), group in _groups(rows).items():
        for mode in ("train", "eval"):
            if ("gemmbn", mode) not in group:
                continue
            cells = []
            for provider, fixed_mode, _ in COLUMNS:
                row = _cell_row(group, provider, fixed_mode, mode)
                cell = f"{float(row['median_ms']):.3f}" if row else "—"
                if row and row["note"].startswith("fallback"):
                    cell, fallback_seen = cell + " †", True
                cells.append(cell)
            ratio = ratios[mode].get((M, K, N, config))
            cells.append((f"{ratio:.2f}x" if ratio else "—") + (" ‡" if (M, K, N, config, mode) in off else ""))
            tflops = float(group[("gemmbn", mode)]["tflops"])
            cells.append(f"{tflops:.0f}" if tflops >= 100 else f"{tflops:.3g}")
            lines.append(f"| {M}×{K}→{N} | {config} | {mode} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("cuBLAS times the GEMM + bias alone (with the train lines; the same on eval lines), GEMM-only "
                 "gemmbn's GEMM with bias and scale, timed interleaved with each line.")
    if fallback_seen:
        lines.append("† the PyTorch fallback ran, not the fused kernels (see the CSV's note column).")
    if earlier is not None:
        lines.append(summary(ratios["train"], off, earlier_name))
    return "\n".join(lines)


def summary(train: dict[tuple, float], off: dict[tuple, list[str]], earlier_name: str) -> str:
    """One sentence: training pairs at or ahead of the best PyTorch path, the disturbed ones apart."""
    clean = {key: ratio for key, ratio in train.items() if (*key, "train") not in off}
    flagged = sorted(f"{M}×{K}→{N} {config} ({', '.join(off[(M, K, N, config, 'train')])})"
                     for M, K, N, config in train if (M, K, N, config, "train") in off)  # fmt: skip
    text = (f"‡ eager, torch.compile or cuBLAS more than {DISTURBED}x off {earlier_name or 'the earlier run'}: "
            f"a disturbed device, not a comparison. Training forward at or ahead of the best PyTorch path: "
            f"{sum(r >= 1 for r in clean.values())} of {len(clean)} undisturbed pairs")
    return text + (f"; disturbed: {'; '.join(flagged)}." if flagged else ".")


def plot(rows: list[dict[str, str]], path: Path, title: str) -> None:
    """PNG of best PyTorch / gemmbn per shape (training forward), one series per config."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a GPU box
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    ratios = speedups(rows, "train")
    shapes = sorted({key[:3] for key in ratios}, key=lambda s: (s[0] * s[1] * s[2], s))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(shapes) + 2), 4.5))
    for config in dict.fromkeys(key[3] for key in ratios):  # first-seen order
        points = [(i, ratios[(*s, config)]) for i, s in enumerate(shapes) if (*s, config) in ratios]
        ax.plot(*zip(*points), marker="o", linestyle="-", label=config)
    ax.axhline(1.0, color="gray", linewidth=1)
    ax.set_yscale("log")
    times = FuncFormatter(lambda value, _: f"{value:g}x")
    ax.yaxis.set_major_formatter(times)
    ax.yaxis.set_minor_formatter(times)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xticks(range(len(shapes)), [f"{M}×{K}→{N}" for M, K, N in shapes], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("best PyTorch / gemmbn (>1: gemmbn faster)", fontsize=9)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path)
    parser.add_argument("--readme-table", type=Path, help="also write the Markdown table here")
    parser.add_argument("--plot", type=Path, help="PNG path (default: the CSV's path with .png)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--earlier-run", help="a bench CSV of the same shapes, or auto; marks disturbed lines (‡)")
    args = parser.parse_args(argv)
    meta, rows = read(args.csv)
    earlier_path = None
    if args.earlier_run == "auto":
        earlier_path = latest_earlier_run(meta)
        if earlier_path is None:
            print("report.py: no earlier run of the same GPU, sets, timing and torch in perf/results", file=sys.stderr)
    elif args.earlier_run:
        earlier_path = Path(args.earlier_run)
    earlier = read(earlier_path)[1] if earlier_path else None
    table = markdown(meta, rows, earlier, earlier_path.name if earlier_path else "")
    print(table)
    if args.readme_table:
        args.readme_table.write_text(table + "\n")
    if args.no_plot:
        return 0
    path = args.plot or args.csv.with_suffix(".png")
    try:
        plot(rows, path, f"gemmbn training forward, {meta.get('gpu', '?')}, gemmbn {meta.get('gemmbn_commit', '?')}")
    except ImportError as error:
        print(f"report.py: no plot written: matplotlib is not installed ({error}); "
              "install it or pass --no-plot", file=sys.stderr)  # fmt: skip
        return 1
    print(f"plot -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
