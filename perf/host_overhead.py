"""Host (CPU) time per training forward at a small shape, where the host, not the GPU, sets the pace.

    python perf/host_overhead.py [--size M K N] [--dtype float32|bfloat16] [--calls 2000] [--profile]

For gemmbn, eager and torch.compile: wall time of `calls` forwards issued back to back with one
synchronization at the end, divided by `calls`. While the GPU work per forward is shorter than the
host's, this is the host cost per forward (the GPU time per forward is printed beside it, from CUDA
events around the whole loop, to show which side bounds it). --profile adds gemmbn's cProfile table
(the extension's functions are not Python functions to cProfile: their time shows in their callers'
tottime) and the host time of each gemmbn._C call a forward makes, alone, with its DLPack capsules.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from gemmbn import _native
from gemmbn.fused import gemm_workspace
from models import reference_drop_in_compiled
from torch.utils.dlpack import to_dlpack


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


def print_profile(fn, calls: int, rows: int) -> None:
    """cProfile's table (by own time, `rows` lines) of `calls` calls of fn."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(rows)


def binding_calls(drop_in, x: torch.Tensor, calls: int) -> None:
    """Host us per call of the training forward's operator alone, and of the gemmbn._C functions that did its
    work before (capsules included)."""
    C, ops = _native.extension(), _native.operators()
    weight, bias, scale = drop_in.gemm.weight.detach(), drop_in.gemm.bias.detach(), drop_in.scale.detach()
    gamma, beta = drop_in.bn.weight.detach(), drop_in.bn.bias.detach()
    (M, K), N = x.shape, weight.shape[0]
    name = str(x.dtype).removeprefix("torch.")
    tile_rows, _ = C.gemm_config(name, M, N, K)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    partials = torch.empty(2, -(-M // tile_rows), N, device=x.device)
    partial_means, partial_m2s = partials
    save_mean, save_invstd = torch.empty(2, N, device=x.device)
    stream = torch.cuda.current_stream().cuda_stream
    workspace = gemm_workspace(x, N, K)  # stream-K rows only, else None
    d = to_dlpack
    candidates = {
        "10 x to_dlpack": lambda: [d(t) for t in (x, weight, y, bias, scale, partial_means, partial_m2s, y, y, y)],
        "gemm_config": lambda: C.gemm_config(name, M, N, K),
        "gemm_scale_stats": lambda: C.gemm_scale_stats(d(x), d(weight), d(y), d(bias), d(scale), None, None,
                                                       d(partial_means), d(partial_m2s), None, stream,
                                                       workspace=workspace),
        "finish_normalize": lambda: C.finish_normalize(d(y), d(y), d(partial_means), d(partial_m2s), tile_rows,
                                                       d(gamma), d(beta), None, None, None, 0.1, 1e-5,
                                                       d(save_mean), d(save_invstd), stream),
        # What the forward calls: the operator (checks, plan, allocations, stream, both launches in C++).
        "operator": lambda: ops.train_forward(x, weight, bias, scale, gamma, beta, None, None, None, 0.1, 1e-5,
                                              None, None, False),
        # The same through the nanobind binding, its allocations made beforehand, one capsule per array.
        "_C.train_forward": lambda: C.train_forward(d(x), d(weight), d(y), None, d(bias), d(scale), d(gamma), d(beta),
                                                 None, None, None, d(partials), 0.1, 1e-5, d(save_mean),
                                                 d(save_invstd), stream, workspace=workspace),
    }
    print("  native calls alone (gemmbn._C: capsules made in the call):")
    for label, fn in candidates.items():
        host, device = per_call_us(fn, calls)
        print(f"    {label:18s} host {host:7.1f} us/call   GPU {device:7.1f} us/call")


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
            print_profile(lambda: drop_in(x), args.calls, rows=15)
            torch.cuda.synchronize()
            binding_calls(drop_in, x, args.calls)


if __name__ == "__main__":
    main()
