"""Kernel-by-kernel anatomy of one training forward: gemmbn vs torch.compile vs eager, same inputs.

    python perf/anatomy.py [--size M K N] [--dtype float32|bfloat16] [--iters 10]

torch.profiler records `iters` forwards of each (after warm-up, L2 flushed before each forward as in
perf/bench.py); prints each provider's kernels with their median device time, so a gap between two
providers can be read off kernel by kernel instead of guessed.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch
from gemmbn import timing
from models import reference_drop_in_compiled
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(16384, 4096, 4096), metavar=("M", "K", "N"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    M, K, N = args.size
    dtype = getattr(torch, args.dtype)
    reference, drop_in, compiled, x = reference_drop_in_compiled(M, K, N, dtype)
    flush = timing.flush_buffer(torch.device("cuda"))
    providers = {"gemmbn": lambda: drop_in(x), "compile": lambda: compiled(x), "eager": lambda: reference(x)}
    with torch.no_grad():
        for fn in providers.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        print(f"{torch.cuda.get_device_name()}  {M}x{K}->{N} {args.dtype} (TF32 for float32), training forward, "
              f"median over {args.iters} forwards, L2 flushed before each")
        for name, fn in providers.items():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    flush.zero_()
                    fn()
                torch.cuda.synchronize()
            per_kernel = defaultdict(list)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA and "zero_" not in event.name \
                        and "FillFunctor" not in event.name:
                    per_kernel[event.name].append(event.device_time / 1e3)
            total = sum(statistics.median(v) * len(v) / args.iters for v in per_kernel.values())
            print(f"\n{name}: {total:.3f} ms of kernels per forward")
            for kernel, times in sorted(per_kernel.items(), key=lambda kv: -statistics.median(kv[1])):
                print(f"  {statistics.median(times):8.3f} ms x{len(times) / args.iters:g}  {kernel[:110]}")


if __name__ == "__main__":
    main()
