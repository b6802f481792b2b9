"""Host (CPU) time per training forward at a small shape, where the host, not the GPU, sets the pace.

    python perf/host_overhead.py [--size M K N] [--dtype float32|bfloat16] [--calls 2000] [--profile]

For gemmbn, eager and torch.compile: wall time of `calls` forwards issued back to back with one
synchronization at the end, divided by `calls`. While the GPU work per forward is shorter than the
host's, this is the host cost per forward (the GPU time per forward is printed beside it, from CUDA
events around the whole loop, to show which side bounds it). --profile adds gemmbn's cProfile table.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from models import reference_drop_in_compiled


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(host wall us per call, GPU us per call) over `calls` back-to-back calls after warm-up."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.perf_counter()
    start_event.record()
    for _ in range(calls):
        fn()
    end_event.record()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host, start_event.elapsed_time(end_event) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(128, 1024, 512), metavar=("M", "K", "N"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    M, K, N = args.size
    dtype = getattr(torch, args.dtype)
    reference, drop_in, compiled, x = reference_drop_in_compiled(M, K, N, dtype)
    print(f"{torch.cuda.get_device_name()}  {M}x{K}->{N} {args.dtype} (TF32 for float32), training forward, "
          f"no_grad, {args.calls} calls back to back")
    with torch.no_grad():
        for name, fn in (("gemmbn", lambda: drop_in(x)), ("eager", lambda: reference(x)),
                         ("compile", lambda: compiled(x))):  # fmt: skip
            host, device = per_call_us(fn, args.calls)
            print(f"  {name:8s} host {host:7.1f} us/call   GPU {device:7.1f} us/call")
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                drop_in(x)
            profiler.disable()
            torch.cuda.synchronize()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
