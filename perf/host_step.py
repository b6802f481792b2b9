"""Host time of a training step, piece by piece: where a host-bound step (small shapes) spends its CPU time.

    python perf/host_step.py [--size M K N] [--config fp32|tf32|bf16|fp16] [--providers gemmbn,eager]
                             [--modes fwd_bwd,step] [--steps 60] [--profile]

Per provider and mode (perf/train_step.py's models, step and modes: `step` adds its SGD-with-momentum update):
- back to back: host microseconds per step (the loop's time before the final synchronize) and wall time per step;
  host ≈ wall means the host is the bottleneck;
- synchronized (the GPU idle before each step, as a caller reading its loss sees it): host time of the forward call,
  of backward() and of the optimizer's step, medians;
- gemmbn only: the host time of each call into gemmbn.fused (each native operator with its Python wrapper), of
  backward.linear_scale_bn_backward and of the fp32-faithful GEMM's weight split (weight_cache.split_now: made again
  after every update of W, so once a step in `step` mode and never in `fwd_bwd`), medians per call, within those
  synchronized steps.
Wall-clock timing (time.perf_counter), no profiler: torch.profiler's per-op times on a slow host were skewed by its
first profiled step (perf/NOTES.md v17). --profile adds, per provider and mode, torch.profiler's CPU ops over the same
synchronized steps after warm-up steps (self and total host time per step, most first): which op a mode's extra
host time sits in, where the wall-clock medians only say which call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from train_step import CONFIGS, MODES, _problem, _step, sgd

from gemmbn import backward, fused, weight_cache

TIMED = {fused: ("train_forward", "batch_norm_backward", "split_matmul", "transpose_with_maxima", "matmul"),
         backward: ("linear_scale_bn_backward",), weight_cache: ("split_now",)}  # fmt: skip


def _timed_calls(times: dict[str, list[float]]) -> None:
    """Wraps TIMED's functions so that each call's host time lands in times[module.name]."""
    for module, names in TIMED.items():
        for name in names:
            original = getattr(module, name)

            def timed(*args, _original=original, _label=f"{module.__name__}.{name}", **kwargs):
                start = time.perf_counter()
                result = _original(*args, **kwargs)
                times[_label].append(time.perf_counter() - start)
                return result

            setattr(module, name, timed)


def _median_us(times: list[float]) -> str:
    return f"{1e6 * statistics.median(times):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=[4096, 1024, 1024], metavar=("M", "K", "N"))
    parser.add_argument("--config", default="fp32", choices=list(CONFIGS))
    parser.add_argument("--providers", default="gemmbn,eager")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--profile", action="store_true", help="also torch.profiler's CPU ops per step")
    args = parser.parse_args()
    M, K, N = args.size
    models, x, dout = _problem(M, K, N, args.config, args.providers.split(","))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {M}x{K}->{N} {args.config}, host time in us")
    calls: dict[str, list[float]] = defaultdict(list)
    _timed_calls(calls)
    for mode in args.modes.split(","):
        for provider, module in models.items():
            optimizer = sgd(module, mode)
            step = _step(module, x, dout, optimizer)
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            host = time.perf_counter() - start
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
            print(f"\n{provider}, {mode}: back to back {1e6 * host / args.steps:.1f} host, "
                  f"{1e6 * wall / args.steps:.1f} wall per step")  # fmt: skip
            calls.clear()
            forward, backward_, update = [], [], []

            def synchronized_step() -> None:
                module.zero_grad(set_to_none=True)
                x.grad = None
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = module(x)
                t1 = time.perf_counter()
                out.backward(dout)
                t2 = time.perf_counter()
                if optimizer is not None:
                    optimizer.step()
                    update.append(time.perf_counter() - t2)
                forward.append(t1 - t0)
                backward_.append(t2 - t1)

            for _ in range(args.steps):
                synchronized_step()
            torch.cuda.synchronize()
            print(f"  synchronized: forward {_median_us(forward)}, backward {_median_us(backward_)}"
                  + (f", optimizer step {_median_us(update)}" if update else ""))  # fmt: skip
            for label, times in sorted(calls.items()):
                print(f"    {label:40s} {_median_us(times):>8s} per call, {len(times) / args.steps:g} calls per step")
            if args.profile:
                _profile(synchronized_step, args.steps)


def _profile(synchronized_step, steps: int, warmup: int = 3) -> None:
    """torch.profiler's CPU ops over `steps` synchronized steps, after `warmup` unrecorded ones (perf/NOTES.md v17: the
    first profiled step skews the rest), per step, most self time first."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cycles = []  # the profiler clears its events when the active steps end: take them then
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=warmup, active=steps),
                 on_trace_ready=lambda prof: cycles.append(prof.key_averages())) as prof:  # fmt: skip
        for _ in range(warmup + steps):
            synchronized_step()
            prof.step()
    torch.cuda.synchronize()
    events = sorted(cycles[0] if cycles else [], key=lambda e: e.self_cpu_time_total, reverse=True)
    print(f"    torch.profiler, per step over {steps} steps: self us, total us, calls, op")
    for event in events[:24]:
        print(f"    {event.self_cpu_time_total / steps:9.1f} {event.cpu_time_total / steps:9.1f} "
              f"{event.count / steps:6g}  {event.key}")


if __name__ == "__main__":
    main()
