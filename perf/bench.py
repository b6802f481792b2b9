"""Side-by-side benchmark of gemmbn against eager PyTorch, torch.compile and cuBLAS, one process.

    python perf/bench.py --set kernelbench|large_n|sweep|tiny|all|<a,b,...> [--providers ...]
                         [--configs fp32,tf32,bf16,fp16] [--iters N] [--out CSV] [--no-compile]
                         [--quick] [--max-minutes M] [--device auto|cpu|cuda] [--sync]

Forward pass under torch.no_grad(); BatchNorm in training mode (batch statistics, running statistics
updated) and, for gemmbn and eager, also in eval mode. Writes one CSV row per shape x config x
provider x mode (see perf/README.md), then prints perf/report.py's table.

GPU: CUDA events around each call; before every timed call a 256 MB buffer is written (outside the
events) so that no operand is left in the 60 MB L2; --sync also waits for the GPU to go idle before each timed
call (KernelBench's harness: a single call's latency, the host's time before the first launch included). CPU: time.perf_counter, eager and the gemmbn
fallback only, tiny set only; such numbers are not comparable with GPU ones.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # shapes.py, report.py
try:
    import gemmbn  # an installed build (with its extension) wins
except ImportError:
    sys.path.insert(1, str(REPO / "python"))
    import gemmbn

import report
import shapes
from gemmbn import _native, debug, fallback, timing
from gemmbn import precision as precision_mod
from gemmbn.debug import gemm_workspace

COLUMNS = ["set", "M", "K", "N", "provider", "dtype", "precision", "mode", "median_ms", "min_ms", "max_ms",
           "tflops", "gbps", "speedup_vs_eager", "speedup_vs_compile", "note"]  # fmt: skip
PROVIDERS = ("gemmbn", "eager", "compile", "compile-max-autotune", "cublas", "gemmbn-gemm-only")
COMPILE_PROVIDERS = {"compile": None, "compile-max-autotune": "max-autotune"}  # provider -> torch.compile mode
# max-autotune costs about a minute per compile: by default only the named problems, TF32 and bf16.
AUTOTUNE_SETS, AUTOTUNE_CONFIGS = {"kernelbench", "large_n"}, {"tf32", "bf16"}
SEED = 0


@dataclass(frozen=True)
class Config:
    name: str
    dtype: torch.dtype
    precision: str  # torch.set_float32_matmul_precision for float32; "-" for 16-bit data


CONFIGS = {
    "fp32": Config("fp32", torch.float32, "highest"),
    "tf32": Config("tf32", torch.float32, "high"),
    "bf16": Config("bf16", torch.bfloat16, "-"),
    "fp16": Config("fp16", torch.float16, "-"),
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", default="kernelbench", help="shape set(s), comma-separated, or 'all'")
    parser.add_argument("--sizes", help='"M K N;M K N;...": these shapes (set name "sizes") instead of --set')
    providers_help = f"comma-separated subset of {','.join(PROVIDERS)} (default: all that apply; "
    providers_help += "compile-max-autotune only for kernelbench and large_n in tf32 and bf16)"
    parser.add_argument("--providers", help=providers_help)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of fp32,tf32,bf16,fp16")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per measurement (at least 10)")
    parser.add_argument("--out", type=Path, help="CSV path (default perf/results/<sets>-<device>.csv)")
    parser.add_argument("--no-compile", action="store_true", help="skip both torch.compile providers")
    parser.add_argument("--quick", action="store_true", help="10 timed calls after 2 warm-up calls")
    parser.add_argument("--max-minutes", type=float, help="start no torch.compile measurement after this long")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--sync", action="store_true", help="synchronize before each timed call (KernelBench's method)")
    args = parser.parse_args(argv)
    if args.sizes:
        args.set = "sizes"  # the set name the rows, the metadata and the default CSV name carry
    args.iters = 10 if args.quick else max(args.iters, 10)
    args.warmup = 2 if args.quick else 3  # cudagraph trees (max-autotune) replay from the third call
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


# --- timing -------------------------------------------------------------------------------------


class Timer:
    """gemmbn.timing's method with this run's settings: candidates timed interleaved (clock drift under
    sustained load falls on all alike; a first block was seen ~10% faster than a later block of the same
    kernel on the H200), L2 flushed before every timed call, no host sync between calls unless ``synchronize``."""

    def __init__(self, device: torch.device, iters: int, warmup: int, synchronize: bool = False) -> None:
        self.device, self.iters, self.warmup, self.synchronize = device, iters, warmup, synchronize
        self.flush = timing.flush_buffer(device)

    def __call__(self, fn) -> list[float]:
        return self.interleaved([fn])[0]

    def interleaved(self, fns: list) -> list[list[float]]:
        return timing.interleaved_ms(fns, self.device, self.iters, self.warmup, self.flush, self.synchronize)


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line every 10 s in a log."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start, self.last = total, 0, time.monotonic(), 0.0
        self.tty = sys.stderr.isatty()

    def show(self, label: str, advance: int = 0) -> None:
        self.done += advance
        now = time.monotonic()
        elapsed = now - self.start
        eta = f" eta {elapsed / self.done * (self.total - self.done):4.0f}s" if self.done else ""
        filled = 30 * self.done // max(self.total, 1)
        line = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {elapsed:4.0f}s{eta}  {label}"
        if self.tty:
            sys.stderr.write("\r" + line[:150] + "\x1b[K")
        elif now - self.last >= 10 or self.done == self.total:
            sys.stderr.write(line + "\n")
            self.last = now
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


# --- metadata -----------------------------------------------------------------------------------


def _command(*cmd: str) -> str | None:
    try:
        result = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=20, cwd=REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _commit() -> str:
    """$GEMMBN_COMMIT if set (a copied tree's .git can be stale), else short HEAD (+"-dirty"), else "unknown"."""
    if os.environ.get("GEMMBN_COMMIT"):
        return os.environ["GEMMBN_COMMIT"]
    head = _command("git", "rev-parse", "--short", "HEAD")
    if head is None:
        return os.environ.get("GEMMBN_COMMIT", "unknown")
    return head + ("-dirty" if _command("git", "status", "--porcelain", "--untracked-files=no") else "")


def metadata(device: torch.device, args: argparse.Namespace) -> dict[str, str]:
    meta: dict[str, str] = {}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        index = str(device.index or 0)
        driver = _command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", index)
        l2 = getattr(props, "L2_cache_size", 0)
        meta.update(gpu=props.name, driver=driver or "unknown", cuda=torch.version.cuda or "unknown",
                    sms=str(props.multi_processor_count), l2_mb=f"{l2 / 2**20:.0f}" if l2 else "unknown",
                    timing=f"CUDA events; providers of a shape timed interleaved; L2 flushed before every timed "
                    f"call by writing {timing.FLUSH_BYTES >> 20} MB (not timed)"
                    + ("; the GPU idle (synchronized) before each timed call" if args.sync else "; back to back"))  # fmt: skip
    else:
        meta.update(gpu="none (CPU run)", driver="n/a", cuda=torch.version.cuda or "none",
                    timing="time.perf_counter on the CPU, providers interleaved, no cache flush",
                    warning="CPU numbers (PyTorch fallback): NOT comparable with GPU results")  # fmt: skip
    meta.update(torch=torch.__version__, python=platform.python_version(), gemmbn_commit=_commit(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=device.type, sets=args.set, iters=str(args.iters), warmup=str(args.warmup),
                forward="torch.no_grad(); BatchNorm training mode unless mode=eval",
                gemmbn_fused=_fused_reason(device) or "yes")  # fmt: skip
    return meta


def _fused_reason(device: torch.device) -> str | None:
    return _native.fused_unavailable_reason(torch.empty(0, device=device))


# --- providers ----------------------------------------------------------------------------------


def plan(args: argparse.Namespace, device: torch.device) -> list[tuple[str, shapes.Shape, Config, list]]:
    """[(set, shape, config, [(provider, mode), ...])] in run order; shapes repeated across sets run once."""
    configs = [CONFIGS[name.strip()] for name in args.configs.split(",")]
    chosen = PROVIDERS if args.providers is None else tuple(p.strip() for p in args.providers.split(","))
    unknown = set(chosen) - set(PROVIDERS)
    if unknown:
        raise SystemExit(f"unknown provider(s) {sorted(unknown)}; choose from {', '.join(PROVIDERS)}")
    if device.type == "cpu":
        extra = set(chosen) - {"gemmbn", "eager"} if args.providers else set()
        if extra:
            raise SystemExit(f"without CUDA only the providers gemmbn and eager run, not {sorted(extra)}")
        chosen = ("gemmbn", "eager")
    if args.no_compile:
        chosen = tuple(p for p in chosen if p not in COMPILE_PROVIDERS)
    native = _fused_reason(device) is None
    try:
        chosen_shapes = [(args.set, s) for s in shapes.parse_sizes(args.sizes)] if args.sizes else shapes.resolve(args.set)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    work, seen = [], set()
    for set_name, shape in chosen_shapes:
        if device.type == "cpu" and set_name != "tiny":
            raise SystemExit("without CUDA only --set tiny runs (the other sets would take hours on a CPU)")
        if shape in seen:
            continue
        seen.add(shape)
        for config in configs:
            # gemmbn's plain GEMM is timed in both groups below (its rows carry the group's mode), so each line's
            # GEMM-only time was taken interleaved with it: across groups, minutes apart under a power-limited
            # clock, eval looked 3-7% over it at long K where interleaved they match (perf/NOTES.md v26).
            jobs = [("eager", "train"), ("eager", "eval"), ("gemmbn", "train"), ("gemmbn", "eval"),
                    ("compile", "train"), ("compile-max-autotune", "train"), ("cublas", "gemm"),
                    ("gemmbn-gemm-only", "train"), ("gemmbn-gemm-only", "eval")]  # fmt: skip
            jobs = [(p, m) for p, m in jobs if p in chosen]
            if args.providers is None and (set_name not in AUTOTUNE_SETS or config.name not in AUTOTUNE_CONFIGS):
                jobs = [(p, m) for p, m in jobs if p != "compile-max-autotune"]
            if not native:
                jobs = [(p, m) for p, m in jobs if p != "gemmbn-gemm-only"]
            work.append((set_name, shape, config, jobs))
    return work


def _gemmbn_path(module, x: torch.Tensor, config: Config) -> str:
    """One call of the gemmbn module; "path: <gemm kind>" or "fallback: <reason>" for the note column."""
    fallback.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fallback.GemmBnFallbackWarning)
        module(x)
    reasons = [str(w.message) for w in caught if issubclass(w.category, fallback.GemmBnFallbackWarning)]
    if reasons:
        return "fallback: " + reasons[0].split("fused kernels: ", 1)[-1]
    precision = config.precision if config.dtype == torch.float32 else None
    return "path: " + precision_mod.resolve(config.dtype, precision)


def _callable(provider: str, mode: str, model, drop_in, x: torch.Tensor, config: Config):
    """(fn, note) for one measurement; compiles (untimed) where the provider needs it."""
    model.train(mode != "eval")
    drop_in.train(mode != "eval")
    # Detached: DLPack (the gemm-only call) refuses tensors that require grad, even under no_grad.
    w, b, s = model.gemm.weight.detach(), model.gemm.bias.detach(), model.scale.detach()
    if provider == "eager":
        return (lambda: model(x)), ""
    if provider == "gemmbn":
        return (lambda: drop_in(x)), _gemmbn_path(drop_in, x, config)
    if provider in COMPILE_PROVIDERS:
        compiled = torch.compile(model, mode=COMPILE_PROVIDERS[provider], dynamic=False)
        compiled(x)
        graphs = ", CUDA graphs" if COMPILE_PROVIDERS[provider] else ""
        return (lambda: compiled(x)), f"torch.compile mode={COMPILE_PROVIDERS[provider] or 'default'}{graphs}"
    if provider == "cublas":
        return (lambda: torch.addmm(b, x, w.t())), "torch.addmm: GEMM + bias"
    if provider == "gemmbn-gemm-only":
        C = debug
        y = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)
        note = "gemm_scale_stats without the statistics node: y = (xW^T + b) s"
        split = {}
        if config.name == "fp32":  # the fp32-faithful GEMM; its weight split once, untimed (as the module caches it)
            split = debug.split_gemm_arguments(w, x.shape[0])
            note += ", split fp32 GEMM (row_scales + GEMM)"
        # stream-K rows only; the row chosen for a launch without partials
        workspace = gemm_workspace(x, w.shape[0], x.shape[1], split=bool(split), statistics=False)
        return (lambda: C.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, workspace=workspace,
                                           **split)), note
    raise ValueError(provider)


def _row(set_name: str, shape: shapes.Shape, config: Config, provider: str, mode: str) -> dict[str, str]:
    row = dict.fromkeys(COLUMNS, "")
    row.update(set=set_name, M=str(shape.M), K=str(shape.K), N=str(shape.N), provider=provider,
               dtype=str(config.dtype).removeprefix("torch."), precision=config.precision, mode=mode)  # fmt: skip
    return row


def _fill(row: dict, times: list[float], shape: shapes.Shape, itemsize: int) -> None:
    median = statistics.median(times)
    moved = (shape.M * shape.K + shape.N * shape.K + shape.M * shape.N) * itemsize  # x, W, out once
    row.update(median_ms=f"{median:.6g}", min_ms=f"{min(times):.6g}", max_ms=f"{max(times):.6g}",
               tflops=f"{shape.flops() / median / 1e9:.6g}", gbps=f"{moved / median / 1e6:.6g}")  # fmt: skip


def _add_speedups(rows: list[dict]) -> None:
    """speedup = baseline ms / this row's ms; baseline in the same mode ("gemm" rows: train)."""
    medians = {(r["provider"], r["mode"]): float(r["median_ms"]) for r in rows if r["median_ms"]}
    for row in rows:
        if not row["median_ms"]:
            continue
        mode = "train" if row["mode"] == "gemm" else row["mode"]
        for column, baseline in (("speedup_vs_eager", "eager"), ("speedup_vs_compile", "compile")):
            if (baseline, mode) in medians:
                row[column] = f"{medians[(baseline, mode)] / float(row['median_ms']):.4g}"


def _note_error(row: dict, error: Exception, shape: shapes.Shape, config: Config) -> None:
    row["note"] = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    sys.stderr.write(f"\n{shape.label()} {config.name} {row['provider']} {row['mode']}: {row['note']}\n")


def run_config(set_name, shape, config, jobs, timer, device, progress, deadline, skipped) -> list[dict]:
    """Every (provider, mode) of one shape and config; rows with speedups filled in."""
    torch.manual_seed(SEED)
    with torch.device(device):
        model = gemmbn.ReferenceModel(shape.K, shape.N, (shape.N,)).to(config.dtype)
    precision = config.precision if config.dtype == torch.float32 else None
    drop_in = gemmbn.GemmScaleBatchNorm.from_module(model, precision=precision)  # shares the tensors
    x = torch.rand(shape.M, shape.K, device=device, dtype=config.dtype)
    context = precision_mod.float32_matmul_precision(precision) if precision else contextlib.nullcontext()
    rows, timed = [], []  # timed: (row, fn) of every provider ready to time
    with context, torch.no_grad():
        torch._dynamo.reset()  # fresh caches: no recompile limit across shapes, no stale cudagraph trees
        for provider, mode in jobs:  # prepare (and compile) everything first, untimed
            progress.show(f"{shape.label()} {config.name} {provider} {mode} (prepare)")
            row = _row(set_name, shape, config, provider, mode)
            rows.append(row)
            if provider in COMPILE_PROVIDERS and deadline is not None and time.monotonic() > deadline:
                skipped.append(f"{set_name} {shape.label()} {config.name} {provider}")
                row["note"] = "skipped: --max-minutes"
                continue
            try:
                fn, row["note"] = _callable(provider, mode, model, drop_in, x, config)
                timed.append((row, fn))
            except Exception as error:  # noqa: BLE001 - one failing provider must not end the run
                _note_error(row, error, shape, config)
        # Then time them interleaved, so that clock drift under load falls on all providers alike; one
        # group per module mode, set once: flipping the modules between train and eval between calls
        # slowed torch.compile's forward (H200, TF32, 16384x4096->4096: 1.798 ms flipped, 1.673 grouped).
        for mode in ("train", "eval"):
            group = [(row, fn) for row, fn in timed if (row["mode"] == "eval") == (mode == "eval")]
            if not group:
                continue
            model.train(mode == "train")
            drop_in.train(mode == "train")
            progress.show(f"{shape.label()} {config.name}: timing {len(group)} {mode} providers interleaved")
            try:
                for (row, _), times in zip(group, timer.interleaved([fn for _, fn in group])):
                    _fill(row, times, shape, x.element_size())
            except Exception:  # noqa: BLE001 - a provider that fails only when timed: time each alone
                for row, fn in group:
                    try:
                        _fill(row, timer(fn), shape, x.element_size())
                    except Exception as error:  # noqa: BLE001
                        _note_error(row, error, shape, config)
        timed.clear()
        progress.show("", advance=len(jobs))
    del model, drop_in, x
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    _add_speedups(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    work = plan(args, device)
    meta = metadata(device, args)
    gpu_slug = "cpu" if device.type == "cpu" else meta["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    out = args.out or HERE / "results" / f"{args.set.replace(',', '+')}{'-sync' if args.sync else ''}-{gpu_slug}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    if device.type == "cpu":
        print("NOTE: no CUDA: timing the PyTorch fallback and eager on the CPU; not comparable with GPU numbers.")
    timer = Timer(device, args.iters, args.warmup, args.sync)
    progress = Progress(sum(len(jobs) for *_, jobs in work))
    deadline = None if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes
    all_rows, skipped = [], []
    with open(out, "w", newline="") as file, warnings.catch_warnings():
        # Reported per row in the note column instead; and inductor's TF32 hint for fp32 "highest".
        warnings.simplefilter("ignore", fallback.GemmBnFallbackWarning)
        warnings.filterwarnings("ignore", message=".*TensorFloat32 tensor cores.*")
        file.writelines(f"# {key}: {value}\n" for key, value in meta.items())
        writer = csv.DictWriter(file, COLUMNS)
        writer.writeheader()
        for set_name, shape, config, jobs in work:
            rows = run_config(set_name, shape, config, jobs, timer, device, progress, deadline, skipped)
            writer.writerows(rows)
            file.flush()  # a run cut short keeps every finished row
            all_rows += rows
        if skipped:
            file.write(f"# skipped after --max-minutes {args.max_minutes}: {'; '.join(skipped)}\n")
    progress.close()
    print(report.markdown(meta, all_rows))
    if skipped:
        print(f"\n{len(skipped)} torch.compile measurements skipped after --max-minutes {args.max_minutes}.")
    errors = sum(row["note"].startswith("error") for row in all_rows)
    print(f"\n{len(all_rows)} rows ({errors} errors) -> {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
