"""Kernel-by-kernel anatomy of one training forward: gemmbn vs torch.compile vs eager, same inputs.

    python perf/anatomy.py [--size M K N] [--dtype float32|bfloat16] [--precision high|highest] [--iters 10] [--sync]

torch.profiler records `iters` forwards of each (after warm-up, L2 flushed before each forward as in
perf/bench.py); prints each provider's kernels with their median device time, so a gap between two
providers can be read off kernel by kernel instead of guessed. The timeline line beside it says where
the rest of a forward's span goes: the GPU idle between the flush's end and the forward's first kernel
(the host still preparing the launch) and between its kernels (medians, us). Kernels of a forward are
told apart by the flush kernel that precedes each. --sync waits for the GPU after each flush, as a synchronized
caller (KernelBench's harness) does: the idle after the flush is then the host's whole path to the first launch, and
the kernels' times say whether the GPU itself runs the forward slower than back to back.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch
from gemmbn import timing
from models import FLOAT32_MATMULS, add_precision_option, reference_drop_in_compiled
from torch.profiler import ProfilerActivity, profile


def _is_flush(kernel_name: str) -> bool:
    return "zero_" in kernel_name or "FillFunctor" in kernel_name


def _timeline(kernels) -> str:
    """Median span of a forward (first kernel's start to last kernel's end) and the GPU's idle time in it."""
    spans, idle_first, idle_between, previous_end, forward = [], [], [], None, []

    def close(forward):
        if forward:
            spans.append(forward[-1].time_range.end - forward[0].time_range.start)
            idle_between.append(sum(max(0.0, b.time_range.start - a.time_range.end) for a, b in zip(forward, forward[1:])))

    for event in kernels:  # sorted by start
        if _is_flush(event.name):
            close(forward)
            forward, previous_end = [], event.time_range.end
            continue
        if not forward and previous_end is not None:
            idle_first.append(max(0.0, event.time_range.start - previous_end))
        forward.append(event)
    close(forward)
    median = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    return (f"span {median(spans):.1f} us, idle after the flush {median(idle_first):.1f} us, "
            f"idle between kernels {median(idle_between):.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(16384, 4096, 4096), metavar=("M", "K", "N"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    add_precision_option(parser)
    parser.add_argument("--sync", action="store_true", help="synchronize after each flush (a synchronized caller)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--providers", default="gemmbn,compile,eager", help="comma-separated subset")
    args = parser.parse_args()
    M, K, N = args.size
    dtype = getattr(torch, args.dtype)
    reference, drop_in, compiled, x = reference_drop_in_compiled(M, K, N, dtype, args.precision)
    flush = timing.flush_buffer(torch.device("cuda"))
    providers = {"gemmbn": lambda: drop_in(x), "compile": lambda: compiled(x), "eager": lambda: reference(x)}
    providers = {name: providers[name] for name in args.providers.split(",")}
    with torch.no_grad():
        for fn in providers.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        matmuls = FLOAT32_MATMULS[args.precision]
        print(f"{torch.cuda.get_device_name()}  {M}x{K}->{N} {args.dtype} ({matmuls} for float32), training forward, "
              f"median over {args.iters} forwards, L2 flushed before each"
              + (", the GPU idle (synchronized) before each" if args.sync else ", back to back"))
        for name, fn in providers.items():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    flush.zero_()
                    if args.sync:
                        torch.cuda.synchronize()
                    fn()
                torch.cuda.synchronize()
            per_kernel = defaultdict(list)
            kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                             key=lambda e: e.time_range.start)
            for event in kernels:
                if not _is_flush(event.name):
                    per_kernel[event.name].append(event.device_time / 1e3)
            total = sum(statistics.median(v) * len(v) / args.iters for v in per_kernel.values())
            print(f"\n{name}: {total:.3f} ms of kernels per forward; {_timeline(kernels)}")
            for kernel, times in sorted(per_kernel.items(), key=lambda kv: -statistics.median(kv[1])):
                print(f"  {statistics.median(times):8.3f} ms x{len(times) / args.iters:g}  {kernel[:110]}")


if __name__ == "__main__":
    main()
