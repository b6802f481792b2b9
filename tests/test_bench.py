"""perf/bench.py and perf/report.py on the CPU: the tiny set runs and the CSV and table hold what they claim.

The harness runs as a subprocess (as a user runs it) with --device cpu, so this is the same quick
smoke test on a GPU machine. Timings themselves are not checked, only their consistency.
"""

from __future__ import annotations

import csv
import datetime
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PERF = REPO / "perf"
# Spelled out, not imported: renaming a column must fail here (report.py and users parse them).
COLUMNS = ["set", "M", "K", "N", "provider", "dtype", "precision", "mode", "median_ms", "min_ms", "max_ms",
           "tflops", "gbps", "speedup_vs_eager", "speedup_vs_compile", "note"]  # fmt: skip
METADATA = {"gpu", "driver", "cuda", "torch", "gemmbn_commit", "date", "device", "timing", "iters", "warning"}
CONFIGS = {("float32", "highest"): "fp32", ("float32", "high"): "tf32", ("bfloat16", "-"): "bf16",
           ("float16", "-"): "fp16"}  # fmt: skip
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
M, K, N = 128, 1024, 512  # the tiny set
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _run(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PERF / script), *args], check=False, capture_output=True, text=True, timeout=120,
        env=env,
    )  # fmt: skip


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"perf_{name}", PERF / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_csv(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "tiny.csv"
    result = _run("bench.py", "--set", "tiny", "--quick", "--device", "cpu", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not comparable" in result.stdout.lower()
    assert "16/16" in result.stderr  # the progress bar reached the end
    return out


def _parse(path: Path) -> tuple[dict[str, str], list[str], list[dict[str, str]]]:
    lines = path.read_text().splitlines()
    leading = [line for line in lines if line.startswith("# ")]
    assert lines[: len(leading)] == leading, "metadata lines must come first"
    meta = dict(line[2:].split(": ", 1) for line in leading)
    reader = csv.DictReader(lines[len(leading) :])
    return meta, reader.fieldnames, list(reader)


def test_csv_metadata_and_columns(bench_csv):
    meta, header, _ = _parse(bench_csv)
    assert METADATA <= meta.keys()
    assert header == COLUMNS
    assert meta["device"] == "cpu" and meta["gpu"] == "none (CPU run)"
    assert "not comparable" in meta["warning"].lower()
    assert meta["iters"] == "10"
    date = datetime.datetime.fromisoformat(meta["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.timezone.utc) - date) < datetime.timedelta(minutes=10)
    assert meta["gemmbn_commit"]


def test_csv_rows_are_complete_and_consistent(bench_csv):
    _, _, rows = _parse(bench_csv)
    # CPU: eager and gemmbn, each config, train and eval: 2 x 4 x 2.
    keys = {(r["provider"], CONFIGS[(r["dtype"], r["precision"])], r["mode"]) for r in rows}
    assert len(rows) == len(keys) == 16
    assert {k[0] for k in keys} == {"eager", "gemmbn"} and {k[2] for k in keys} == {"train", "eval"}
    assert {k[1] for k in keys} == set(CONFIGS.values())
    eager = {(r["dtype"], r["precision"], r["mode"]): float(r["median_ms"]) for r in rows if r["provider"] == "eager"}
    for row in rows:
        assert (row["set"], int(row["M"]), int(row["K"]), int(row["N"])) == ("tiny", M, K, N)
        median, low, high = (float(row[c]) for c in ("median_ms", "min_ms", "max_ms"))
        for value in (median, low, high, float(row["tflops"]), float(row["gbps"])):
            assert math.isfinite(value) and value > 0, row
        assert low <= median <= high
        assert float(row["tflops"]) == pytest.approx(2 * M * N * K / median / 1e9, rel=1e-4)
        moved = (M * K + N * K + M * N) * ITEMSIZE[row["dtype"]]
        assert float(row["gbps"]) == pytest.approx(moved / median / 1e6, rel=1e-4)
        expected = eager[(row["dtype"], row["precision"], row["mode"])] / median
        assert float(row["speedup_vs_eager"]) == pytest.approx(expected, rel=1e-3)
        assert row["speedup_vs_compile"] == ""  # no compile on the CPU
        if row["provider"] == "gemmbn":
            assert row["note"].startswith("fallback: x is on cpu")
        else:
            assert row["note"] == ""


def test_report_table_matches_csv(bench_csv, tmp_path):
    table_path = tmp_path / "table.md"
    result = _run("report.py", str(bench_csv), "--readme-table", str(table_path), "--no-plot")
    assert result.returncode == 0, result.stderr
    table = table_path.read_text()
    assert table.strip() == result.stdout.strip()
    assert "none (CPU run)" in table and "NOT comparable" in table
    _, _, rows = _parse(bench_csv)
    median = {(r["provider"], CONFIGS[(r["dtype"], r["precision"])], r["mode"]): float(r["median_ms"]) for r in rows}
    lines = [line for line in table.splitlines() if line.startswith(f"| {M}×{K}→{N} |")]
    assert len(lines) == 8  # 4 configs x (train, eval)
    seen = set()
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        _, config, mode, gemmbn, eager, compile_, autotune, cublas, gemm_only, ratio, tflops = cells
        seen.add((config, mode))
        assert gemmbn == f"{median[('gemmbn', config, mode)]:.3f} †"  # † = fallback ran
        assert eager == f"{median[('eager', config, mode)]:.3f}"
        assert compile_ == autotune == cublas == gemm_only == "—"
        best_over_gemmbn = median[("eager", config, mode)] / median[("gemmbn", config, mode)]
        assert ratio == f"{best_over_gemmbn:.2f}x"
        assert float(tflops) == pytest.approx(2 * M * N * K / median[("gemmbn", config, mode)] / 1e9, rel=0.01)
    assert seen == {(c, m) for c in CONFIGS.values() for m in ("train", "eval")}


def test_report_marks_lines_whose_unchanging_providers_moved(bench_csv, tmp_path):
    """--earlier-run: a line whose eager median is 2x the earlier run's gets ‡ and leaves the summary's count; with
    the run as its own earlier run nothing is marked."""
    same = _run("report.py", str(bench_csv), "--no-plot", "--earlier-run", str(bench_csv))
    assert same.returncode == 0, same.stderr
    assert "‡" not in "".join(line for line in same.stdout.splitlines() if line.startswith("|"))
    assert "of 4 undisturbed pairs." in same.stdout  # 4 configs, training forward
    text = bench_csv.read_text().splitlines()
    header = next(i for i, line in enumerate(text) if line.startswith("set,"))
    fields = text[header].split(",")
    for i in range(header + 1, len(text)):
        row = dict(zip(fields, text[i].split(",")))
        if (row["provider"], row["dtype"], row["precision"], row["mode"]) == ("eager", "bfloat16", "-", "train"):
            row["median_ms"] = str(float(row["median_ms"]) / 2)  # the earlier run's eager twice as fast
            text[i] = ",".join(row[f] for f in fields)
    earlier = tmp_path / "earlier.csv"
    earlier.write_text("\n".join(text) + "\n")
    result = _run("report.py", str(bench_csv), "--no-plot", "--earlier-run", str(earlier))
    assert result.returncode == 0, result.stderr
    marked = [line for line in result.stdout.splitlines() if line.startswith("|") and "‡" in line]
    assert [line.split("|")[2:4] for line in marked] == [[" bf16 ", " train "]]
    assert "of 3 undisturbed pairs; disturbed: 128×1024→512 bf16 (eager 2.00x)." in result.stdout


def test_report_gemm_only_column_takes_the_lines_own_group():
    """The GEMM-only column of a train line shows the plain GEMM timed in the train group, of an eval line the one
    timed in the eval group (bench.py times it in both, perf/NOTES.md v26); a run from before that has one "gemm"
    row, shown on both lines."""
    report = _load("report")

    def row(provider, mode, ms):
        return {"M": "256", "K": "512", "N": "128", "dtype": "bfloat16", "precision": "-", "provider": provider,
                "mode": mode, "median_ms": str(ms), "note": "", "tflops": "1.0"}  # fmt: skip

    def gemm_only_cells(rows):
        table = report.markdown({}, rows).splitlines()
        lines = [line.split("|") for line in table if line.startswith("| 256×512→128 ")]
        return {cells[3].strip(): cells[9].strip() for cells in lines}  # mode -> the GEMM-only cell

    timed = [row("gemmbn", "train", 3.0), row("gemmbn", "eval", 2.5), row("eager", "train", 4.0),
             row("eager", "eval", 3.5), row("gemmbn-gemm-only", "train", 1.25), row("gemmbn-gemm-only", "eval", 2.0)]
    assert gemm_only_cells(timed) == {"train": "1.250", "eval": "2.000"}
    earlier_method = timed[:4] + [row("gemmbn-gemm-only", "gemm", 1.5)]
    assert gemm_only_cells(earlier_method) == {"train": "1.500", "eval": "1.500"}


def test_report_finds_the_latest_earlier_run_of_the_same_kind(bench_csv, tmp_path):
    """--earlier-run auto: the newest CSV with the same GPU, sets, timing and torch dated before the run, nothing
    else."""
    report = _load("report")
    meta, _ = report.read(bench_csv)
    text = bench_csv.read_text()

    def write(name: str, date: str, **changed: str) -> Path:
        path = tmp_path / name
        body = text.replace(f"# date: {meta['date']}", f"# date: {date}")
        for key, value in changed.items():
            assert f"# {key}: {meta[key]}" in body
            body = body.replace(f"# {key}: {meta[key]}", f"# {key}: {value}")
        path.write_text(body)
        return path

    assert report.latest_earlier_run(meta, tmp_path) is None
    older = write("older.csv", "2000-01-01T00:00:00+00:00")
    write("oldest.csv", "1999-01-01T00:00:00+00:00")
    write("later.csv", "2999-01-01T00:00:00+00:00")
    write("other-torch.csv", "2001-01-01T00:00:00+00:00", torch="0.0")
    write("other-sets.csv", "2001-01-01T00:00:00+00:00", sets="sweep")
    write("other-timing.csv", "2001-01-01T00:00:00+00:00", timing="another method")
    write("other-gpu.csv", "2001-01-01T00:00:00+00:00", gpu="another GPU")
    # A run of gemmbn alone (an A/B, say) is no reference: nothing in it can show a disturbed device.
    gemmbn_only = write("gemmbn-only.csv", "2001-01-01T00:00:00+00:00")
    lines = gemmbn_only.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("set,"))
    provider = lines[header].split(",").index("provider")
    kept = [line for line in lines[header + 1:] if line.split(",")[provider] == "gemmbn"]
    assert kept and len(kept) < len(lines) - header - 1
    gemmbn_only.write_text("\n".join(lines[: header + 1] + kept) + "\n")
    assert report.latest_earlier_run(meta, tmp_path) == older


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (make installs it: the perf extra)")
def test_report_png(bench_csv, tmp_path):
    png = tmp_path / "speedup.png"
    result = _run("report.py", str(bench_csv), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_matplotlib_says_so(bench_csv, tmp_path):
    """Where matplotlib is missing (here: a module of that name that fails to import, first on the path) the
    table is still written and the exit status says the plot is not."""
    blocker = tmp_path / "no_matplotlib"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('matplotlib is blocked by the test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))}
    result = _run("report.py", str(bench_csv), "--readme-table", str(tmp_path / "t.md"), env=env)
    assert result.returncode == 1
    assert "matplotlib is not installed" in result.stderr
    assert (tmp_path / "t.md").read_text().count("| 128×1024→512 |") == 8  # the table is still written


def test_bench_refuses_large_sets_on_cpu():
    result = _run("bench.py", "--set", "kernelbench", "--device", "cpu", "--quick")
    assert result.returncode != 0
    assert "only --set tiny" in result.stderr


def test_shape_sets():
    shapes = _load("shapes")
    assert shapes.SETS["kernelbench"] == [(16384, 4096, 4096)]
    assert shapes.SETS["large_n"] == [(1024, 8192, 8192)]
    assert shapes.SETS["tiny"] == [(M, K, N)]
    sweep = shapes.SETS["sweep"]
    assert 15 <= len(sweep) <= 25 and len(set(sweep)) == len(sweep)
    assert {s.M for s in sweep} == {256, 1024, 4096, 16384, 65536}
    assert all(s.K in (512, 1024, 2048, 4096, 8192) and s.N in (512, 1024, 2048, 4096, 8192) for s in sweep)
    assert [name for name, _ in shapes.resolve("all")][:3] == ["kernelbench", "large_n", "tiny"]
    assert len(shapes.resolve("tiny,sweep")) == 1 + len(sweep)
    # short_k picks short-K shapes of the sweep (K <= 1024), for a quick run of select_config's short-K rule.
    assert shapes.SETS["short_k"] and all(s.K <= 1024 and s in sweep for s in shapes.SETS["short_k"])
    with pytest.raises(ValueError, match="unknown shape set"):
        shapes.resolve("huge")
    # --sizes (bench.py and the other perf tools): "M K N;..." in order, empty entries skipped, anything else refused.
    assert shapes.parse_sizes("256 8192 8192; 4096 2048 8192;") == [(256, 8192, 8192), (4096, 2048, 8192)]
    for bad in ("256 8192", "256 8192 8192 1", "a b c"):
        with pytest.raises(ValueError, match="M K N"):
            shapes.parse_sizes(bad)


def test_host_overhead_measures_the_gap_before_the_first_event():
    """host_overhead.py --launch's measure: the time from a call's start to the first matching profiler event
    inside it. A call that sleeps 2 ms before its matrix product must measure at least that, and well under the
    call's period (a gap read against the wrong call would be ~0 or a whole period off)."""
    sys.path.insert(0, str(PERF))  # host_overhead imports perf/models.py
    try:
        host_overhead = _load("host_overhead")
    finally:
        sys.path.remove(str(PERF))
    import time

    import torch
    from torch.profiler import ProfilerActivity

    a = torch.randn(32, 32)

    def call():
        time.sleep(0.002)
        return torch.mm(a, a)

    gap = host_overhead.call_to_first_event_us(call, 20, lambda name: name == "aten::mm", (ProfilerActivity.CPU,))
    assert 2000 <= gap < 50000, gap


@pytest.mark.parametrize("precision", ["high", "highest"])
def test_host_path_reaches_the_stubbed_operators_on_both_float32_routes(precision):
    """perf/host_path.py on the CPU (gemmbn's operators stubbed) runs every row on the TF32 and the fp32-faithful
    route. The script stops unless each timed call reached the stubs exactly as its row expects (one weight split per
    SGD update on the split route, none elsewhere once cached): a row that fell back to the reference, or a cache that
    missed where it should hit, fails here (v23: its eval row had failed unnoticed)."""
    result = _run("host_path.py", "--calls", "200", "--size", "16", "8", "8", "--precision", precision)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        if line.endswith(" us/call"):
            label, us = line.removesuffix(" us/call").rsplit(None, 1)
            rows[label.strip()] = float(us)
    expected = {"module forward, train", "module forward, eval", "fused.train_forward", "forward + backward, train",
                "+ SGD update", "backward alone, train"}  # fmt: skip
    assert expected <= set(rows), result.stdout
    assert all(us > 0 for us in rows.values()), rows


def test_cuda_facts_report_the_device_or_name_the_cuda_error():
    """perf/cuda_facts.py (cuda-python, the perf extra that make installs): on a GPU its facts agree with torch's
    (SM count, L2 size) and the DRAM peak follows from clock and bus; without one every query raises the CUDA
    error by name instead of returning garbage."""
    cuda_facts = _load("cuda_facts")
    import torch

    if torch.cuda.is_available():
        facts = cuda_facts.device_facts(0)
        props = torch.cuda.get_device_properties(0)
        assert facts["sm_count"] == props.multi_processor_count
        assert facts["l2_bytes"] == props.L2_cache_size
        expected_gbs = 2 * facts["memory_clock_khz"] * 1e3 * facts["memory_bus_bits"] / 8 / 1e9
        assert facts["peak_bandwidth_gbs"] == pytest.approx(expected_gbs)
        with cuda_facts.profiled():
            torch.ones(1, device="cuda").add_(1)
    else:
        with pytest.raises(RuntimeError, match=r"cudaDeviceGetAttribute\(sm_count\) failed: cudaError"):
            cuda_facts.device_facts(0)
        with pytest.raises(RuntimeError, match="cudaProfilerStart failed: cudaError"):
            with cuda_facts.profiled():
                pass


def test_sync_step_times_every_rank_on_the_cpu(tmp_path):
    """perf/sync_step.py --spawn 2 (gloo ranks on the CPU, the GPU-only providers left out): a row per (mode,
    provider) with the world size, positive medians, the slowest rank's median at least rank 0's, and the ratio to
    the unsynchronized layer computed from the slowest ranks."""
    import csv

    sys.path.insert(0, str(PERF))  # sync_step imports perf/train_step.py; the spawned ranks import sync_step
    try:
        sync_step = importlib.import_module("sync_step")
        assert sync_step.main(["--spawn", "2", "--sizes", "24 16 8", "--configs", "fp32", "--iters", "2",
                               "--out", str(tmp_path / "sync.csv")]) == 0  # fmt: skip
    finally:
        sys.path.remove(str(PERF))
    with open(tmp_path / "sync.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    assert {(r["mode"], r["provider"]) for r in rows} == {
        (mode, provider) for mode in ("fwd", "fwd_bwd") for provider in ("gemmbn-single", "gemmbn-sync")}
    single = {r["mode"]: float(r["slowest_rank_median_ms"]) for r in rows if r["provider"] == "gemmbn-single"}
    for r in rows:
        assert r["world"] == "2" and float(r["median_ms"]) > 0
        assert float(r["slowest_rank_median_ms"]) >= float(r["median_ms"])
        expected = float(r["slowest_rank_median_ms"]) / single[r["mode"]]
        assert abs(float(r["over_gemmbn_single"]) - expected) <= 1e-3 * expected + 1e-3


def test_sass_diff_hashes_each_kernel_without_its_addresses(monkeypatch, capsys):
    sass_diff = _load("sass_diff")
    listings = {
        "a.so": "\tcode for sm_90a\n\t\tFunction : kernel_one\n        /*0000*/   MOV R1, c[0x0][0x28] ;\n"
                "\t\tFunction : kernel_two\n        /*0000*/   EXIT ;\n",
        # kernel_one at other addresses (the same code placed elsewhere), kernel_two changed
        "b.so": "\tcode for sm_90a\n\t\tFunction : kernel_one\n        /*0a30*/   MOV R1, c[0x0][0x28] ;\n"
                "\t\tFunction : kernel_two\n        /*0000*/   BRA 0x10 ;\n",
    }  # fmt: skip

    def fake_run(command, **_):
        return subprocess.CompletedProcess(command, 0, stdout=listings[command[-1]], stderr="")

    monkeypatch.setattr(sass_diff.subprocess, "run", fake_run)
    a, b = sass_diff.kernel_listings("a.so"), sass_diff.kernel_listings("b.so")
    assert set(a) == set(b) == {"kernel_one", "kernel_two"}
    assert a["kernel_one"][0] == b["kernel_one"][0] and a["kernel_two"][0] != b["kernel_two"][0]
    monkeypatch.setattr(sys, "argv", ["sass_diff.py", "a.so", "b.so"])
    assert sass_diff.main() == 1
    monkeypatch.setattr(sys, "argv", ["sass_diff.py", "a.so", "a.so"])
    assert sass_diff.main() == 0
    # --counts: kernel_two's instructions in each build (1 in a.so, 2 once b.so's has an EXIT more), and the totals
    listings["b.so"] += "        /*0010*/   EXIT ;\n"
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["sass_diff.py", "--counts", "a.so", "b.so"])
    assert sass_diff.main() == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 / 2 kernels; 2 in both, 1 with identical SASS"
    assert lines[2].split() == ["1", "2", "2.00", "kernel_two"]
    assert lines[3].split()[:3] == ["2", "3", "1.50"]


def test_sass_regions_cuts_the_samples_by_instruction_index(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("perf_sass_regions", PERF / "ncu" / "sass_regions.py")
    sass_regions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass_regions)
    # ncu's page: a line naming the kernel, then the header; "(Not Issued)" columns are not stall reasons of their own.
    page = tmp_path / "gemm.sass.csv"
    page.write_text(
        '"Kernel Name","device_kernel"\n'
        '"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_mio",'
        '"stall_barrier (Not Issued)"\n'
        '"0x00","      ULDC R1, c[0x0][0x28]","2","0","0","0"\n'
        '"0x10","      HGMMA.64x128x16.F32.BF16 R88, gdesc[UR12], R88","10","2","8","2"\n'
        '"0x20","@!P1   BRA 0x7f00","4","4","0","4"\n'
        '"0x30","      FADD R1, R2, R3","4","0","0","0"\n'
    )  # fmt: skip
    rows = sass_regions.read_sass(page)
    assert [sass_regions.opcode(r["Source"]) for r in rows] == ["ULDC", "HGMMA", "BRA", "FADD"]
    head, body, tail = sass_regions.regions(rows, [1, 3])
    assert (head.start, head.end, head.samples, head.share) == (0, 1, 2, 0.1)  # of 20 samples
    assert (body.start, body.end, body.samples, body.share) == (1, 3, 14, 0.7)
    assert body.stalls == [("mio", 8), ("barrier", 6)] and body.opcodes == [("HGMMA", 10), ("BRA", 4)]
    assert (tail.samples, tail.share) == (4, 0.2)
    with pytest.raises(ValueError, match="cuts must increase"):
        sass_regions.regions(rows, [3, 1])
    assert sass_regions.main([str(page), "--cuts", "1,3", "--top", "2"]) == 0
    printed = capsys.readouterr().out
    assert "4 instructions, 20 samples" in printed and " 70.0% of samples (14)" in printed


def test_flow_order_walks_cutlass_order():
    # The persistent order (CUTLASS's sm90 get_work_idx_m_and_n) worked by hand for row 0 at 4096x8192->2048: along N
    # in bands of 8 clusters x 2 = 16 row tiles, column tile by column tile inside a band.
    flow_order = _load("flow_order")
    order, raster, group = flow_order.tile_order(32, 16, 2, 1, "H", 8)
    assert (raster, group) == ("N", 8) and len(order) == 512 and len(set(order)) == 512  # every tile once
    assert order[:3] == [(0, 0), (1, 0), (2, 0)] and order[16] == (0, 1) and order[256] == (16, 0)
    r = flow_order.model(4096, 2048, 128, 128, 2, 1, "H", 8)
    # 512 tiles on 132 CTAs; column tile n of the second band is stored at tile 256 + 16 (n + 1) - 1, so columns 0-7
    # (tiles up to 383) are complete when the last wave starts at tile 396.
    assert abs(r["waves"] - 512 / 132) < 1e-9 and r["early"] == 0.5 and (r["rows"], r["columns"]) == (16, 9)
    # Along M, swizzle 1, with the x-sharing cluster: pairs of column tiles, all 128 row tiles each.
    order, raster, group = flow_order.tile_order(128, 4, 1, 2, "M", 1)
    assert (raster, group) == ("M", 1) and order[:3] == [(0, 0), (0, 1), (1, 0)] and order[256] == (0, 2)
    # A swizzle that pads: 4 column tiles rounded up to 4 x 2 = 8 (configs.h unpadded_swizzle's "cliff").
    assert flow_order.model(16384, 512, 128, 128, 1, 2, "N", 8)["waves"] == 2 * 512 / 132


def test_ab_summary_takes_the_min_of_round_medians(tmp_path, capsys, monkeypatch):
    ab_summary = _load("ab_summary")
    header = ",".join(COLUMNS) + "\n"
    medians = {("a", 0): 2.0, ("a", 1): 1.0, ("b_x", 0): 0.9, ("b_x", 1): 1.2}
    for (side, round_), median in medians.items():
        (tmp_path / f"bench_{side}_{round_}.csv").write_text(
            f"# gpu: test\n{header}sizes,64,32,16,gemmbn,bfloat16,-,train,{median},0,0,0,0,,,\n")
    files = [str(tmp_path / f"bench_{side}_{r}.csv") for side, r in medians]
    monkeypatch.setattr(sys, "argv", ["ab_summary.py", *files, "--out", str(tmp_path / "all.csv"), "--note", "n"])
    ab_summary.main()
    line = [row for row in capsys.readouterr().out.splitlines() if row.startswith("| 64×32→16")][0]
    assert line == "| 64×32→16 | bfloat16 | train | 1.0000 | 0.9000 | -10.0% |"
    rows = (tmp_path / "all.csv").read_text().splitlines()
    assert rows[0] == "# n" and rows[1].startswith("side,round,set,M") and len(rows) == 2 + 4


def test_ab_runs_every_side_in_turn_with_its_package_and_switches(tmp_path):
    # ab.sh in a copy of the tree's layout (perf/ab.sh, python/gemmbn with an _operators.so), a script that reports
    # what it ran with; sides: two switch sides on this tree's package and one folder holding only an _operators.so.
    (tmp_path / "perf").mkdir()
    (tmp_path / "perf" / "ab.sh").write_text((PERF / "ab.sh").read_text())
    package = tmp_path / "python" / "gemmbn"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_operators.so").write_text("tree")
    (tmp_path / "variant").mkdir()
    (tmp_path / "variant" / "_operators.so").write_text("variant")
    (tmp_path / "report.py").write_text(
        "import os, sys, pathlib, gemmbn\n"
        "so = pathlib.Path(gemmbn.__file__).with_name('_operators.so').read_text()\n"
        "print(sys.argv[1], os.environ.get('GEMMBN_X', '-'), os.environ.get('GEMMBN_Y', '-'), so)\n")
    out = tmp_path / "out"
    command = ["bash", str(tmp_path / "perf" / "ab.sh"), str(out), "one:GEMMBN_X=1", "two:GEMMBN_X=2,GEMMBN_Y=3",
               str(tmp_path / "variant"), "2", "--", str(tmp_path / "report.py"), "{side}-{round}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line for line in result.stdout.splitlines() if not line.startswith("==")]
    assert ran == ["one-0 1 - tree", "two-0 2 3 tree", "variant-0 - - variant",
                   "one-1 1 - tree", "two-1 2 3 tree", "variant-1 - - variant"]  # fmt: skip
    assert (out / "two_1.txt").read_text().splitlines()[-1] == "two-1 2 3 tree"
    refused = subprocess.run(command[:3] + ["one:GEMMBN_X=1", "one:GEMMBN_X=2", "1", "--", "x.py"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "two sides named one" in refused.stderr
