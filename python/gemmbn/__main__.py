"""python -m gemmbn: check the drop-in against the reference model, then time them side by side.

On an sm90 GPU with the extension built: 16384x4096 -> 4096 (KernelBench level 2 problem 39) for fp32
"highest", fp32 "high" (TF32) and a bf16 model; gemmbn vs eager vs torch.compile. Elsewhere: the PyTorch
fallback's check at a small size, and a timing against eager that says nothing about the fused kernels.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from dataclasses import dataclass

import torch

from . import fallback
from . import precision as precision_mod
from ._native import fused_unavailable_reason
from .kernelbench import batch_size, in_features, out_features
from .modules import GemmScaleBatchNorm
from .reference import ReferenceModel, float64_forward
from .timing import flush_buffer, interleaved_ms
from .tolerances import output_tolerance, relative_error

_SMALL_SIZE = (256, 512, 256)  # without Hopper: quick on a CPU
_SEED = 0


@dataclass(frozen=True)
class Config:
    label: str
    dtype: torch.dtype
    precision: str  # float32 matmul precision (bf16 ignores it)


_CONFIGS = (
    Config("fp32 highest", torch.float32, "highest"),
    Config("fp32 high/TF32", torch.float32, "high"),
    Config("bf16", torch.bfloat16, "highest"),
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gemmbn", description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=3, type=int, metavar=("M", "K", "N"), help="x [M, K], weight [N, K]")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per measurement (median; >= 10)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = parser.parse_args(argv)
    args.iters = max(args.iters, 10)
    return args


def _build_pair(config: Config, K: int, N: int, device: torch.device) -> tuple[ReferenceModel, GemmScaleBatchNorm]:
    """The reference Model and the drop-in, built from one seed (identical parameters)."""
    torch.manual_seed(_SEED)
    reference = ReferenceModel(K, N, (N,)).to(device, config.dtype)
    torch.manual_seed(_SEED)
    drop_in = GemmScaleBatchNorm(K, N, (N,), precision=config.precision).to(device, config.dtype)
    return reference, drop_in


def _check(config: Config, reference, drop_in, x) -> bool:
    """One training step, then eval, against a float64 reference; prints errors, the path and PASS/FAIL."""
    tolerance = output_tolerance(config.dtype, config.precision)
    passed = True
    for training in (True, False):
        reference.train(training)
        drop_in.train(training)
        out64, bn64 = float64_forward(drop_in, x)
        with precision_mod.float32_matmul_precision(config.precision), torch.no_grad():
            eager = reference(x)
        fallback.reset()
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always", fallback.GemmBnFallbackWarning)
            out = drop_in(x)
        path = "fused" if not caught else "fallback"
        errors = {"out": relative_error(out, out64)}
        if training:
            errors["running_mean"] = relative_error(drop_in.bn.running_mean, bn64.running_mean)
            errors["running_var"] = relative_error(drop_in.bn.running_var, bn64.running_var)
        ok = all(error <= tolerance.limit for error in errors.values())
        passed = passed and ok
        measured = ", ".join(f"{name} {error:.1e}" for name, error in errors.items())
        print(
            f"  {config.label:15s} {'train' if training else 'eval ':5s} [{path}] rel. error vs fp64: {measured} "
            f"(eager out {relative_error(eager, out64):.1e}) <= {tolerance.limit:.0e}: {'PASS' if ok else 'FAIL'}"
        )
    print(f"    tolerance: {tolerance.reason}")
    return passed


def _time(config: Config, reference, drop_in, x, iters: int, compile_too: bool) -> dict[str, float]:
    """Median ms of a training-mode forward (no_grad) of gemmbn, eager and (optionally) torch.compile."""
    reference.train()
    drop_in.train()
    times = {}
    with precision_mod.float32_matmul_precision(config.precision), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", fallback.GemmBnFallbackWarning)
        candidates = {"gemmbn": lambda: drop_in(x), "eager": lambda: reference(x)}
        if compile_too:
            compiled = torch.compile(reference)
            compiled(x)  # compile outside the timed rounds
            candidates["compile"] = lambda: compiled(x)
        samples = interleaved_ms(list(candidates.values()), x.device, iters, flush=flush_buffer(x.device))
        times = {name: statistics.median(s) for name, s in zip(candidates, samples)}
    return times


def _print_table(rows: list[tuple[str, dict[str, float]]], header: str) -> None:
    print(header)
    baselines = [name for name in ("eager", "compile") if name in rows[0][1]]
    titles = "".join(f" {name + ' ms':>11s} {name + '/gemmbn':>15s}" for name in baselines)
    print(f"  {'config':15s} {'gemmbn ms':>10s}{titles}")
    for label, times in rows:
        cells = "".join(f" {times[name]:11.3f} {times[name] / times['gemmbn']:14.2f}x" for name in baselines)
        print(f"  {label:15s} {times['gemmbn']:10.3f}{cells}")


def main(argv: list[str] | None = None) -> int:
    """Run the check and the timing table; returns 0 when every check passes."""
    args = _parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reason = fused_unavailable_reason(torch.empty(0, device=device))
    if reason is None:
        M, K, N = args.size or (batch_size, in_features, out_features)
        configs, compile_too = _CONFIGS, not args.no_compile
        print(f"gemmbn: fused kernels on {torch.cuda.get_device_name(device)}")
    else:
        M, K, N = args.size or _SMALL_SIZE
        configs, compile_too = _CONFIGS[:1], False
        print(f"gemmbn: fused kernels unavailable: {reason}.")
        print("        Checking the PyTorch fallback (eager PyTorch's math) at a small size instead; its timing")
        print("        against eager says nothing about the fused kernels.")
    print(f"size: x [{M}, {K}] -> out [{M}, {N}]; seed {_SEED}; checks against a float64 reference")
    passed, rows = True, []
    for config in configs:
        reference, drop_in = _build_pair(config, K, N, device)
        x = torch.rand(M, K, device=device, dtype=config.dtype)
        passed = _check(config, reference, drop_in, x) and passed
        rows.append((config.label, _time(config, reference, drop_in, x, args.iters, compile_too)))
    header = (f"forward, training mode, no_grad; median of {args.iters} calls after 3 warm-up calls, timed "
              "interleaved" + (", L2 flushed before each" if device.type == "cuda" else ""))
    if reason is not None:
        header += "\n  (gemmbn here is the PyTorch fallback, not the fused kernels)"
    _print_table(rows, header)
    print("all checks PASS" if passed else "some checks FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
