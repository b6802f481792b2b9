"""Host (CPU) time per training (or, with --eval, eval) forward at a small shape, where the host sets the pace.

    python perf/host_overhead.py [--size M K N] [--dtype float32|bfloat16] [--precision high|highest] [--calls 2000]
                                 [--profile] [--launch] [--mark] [--api] [--eval] [--grad] [--no-compile]

For gemmbn, eager and torch.compile: wall time of `calls` forwards issued back to back with one
synchronization at the end, divided by `calls`. While the GPU work per forward is shorter than the
host's, this is the host cost per forward (the GPU time per forward is printed beside it, from CUDA
events around the whole loop, to show which side bounds it). --profile adds gemmbn's cProfile table
(the operators are not Python functions to cProfile: their time shows in their callers' tottime) and the host
time of the forward's operator call alone, beside the single-kernel calls (gemmbn.debug) it replaces.
--launch adds each provider's host time from a call's start to its first kernel launch, every call starting on an
idle GPU (issue 17's "call to the GEMM's launch"): the median gap between a torch.profiler mark around the call and
the first CUDA launch API call inside it. The profiler's own cost per recorded op inflates it (eager's ops and
gemmbn's allocations are recorded), so it is an upper bound.
--mark adds, with no profiler, where gemmbn's host time goes before its GEMM runs: the native side notes
CLOCK_MONOTONIC at three points (gemmbn.debug.host_mark_ns: the operator entered, the GEMM's checks done, the GEMM
enqueued) and the call's start and return are read on the same clock; medians over calls that each start on an idle
GPU (synchronized: KernelBench's case, issue 17's ≤ 15 µs target) and over calls back to back. Beside them, the same
clock around eager's whole call and around a bare torch.mm of the same operands (one dispatcher call and one cuBLAS
launch): the floor this host sets for any library's first launch.
--api (training): the CUDA runtime and driver API calls inside a synchronized call of the module and of its operator
alone, each with its offset from the call's start and its duration (torch.profiler; the profiler's cost per recorded op
inflates the offsets).
--grad: the calls record autograd's graph, as a training loop's forward does (the parameters require grad; the outputs
are dropped); without it every call runs under torch.no_grad().
--eval: every module in eval mode (running statistics; gemmbn's fold cached by eval_fold_cache), and --profile's
native calls are the eval operators: eval_forward (fold inside), eval_affine and eval_forward_folded.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import cProfile
import pstats
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from gemmbn import _native, debug
from gemmbn.debug import gemm_workspace
from models import FLOAT32_MATMULS, add_precision_option, reference_drop_in_compiled


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


def module_parameters(drop_in) -> tuple[torch.Tensor, ...]:
    """(weight, bias, scale, gamma, beta) of the drop-in module, detached (the operators take plain tensors)."""
    return (drop_in.gemm.weight.detach(), drop_in.gemm.bias.detach(), drop_in.scale.detach(),
            drop_in.bn.weight.detach(), drop_in.bn.bias.detach())  # fmt: skip


def print_native_calls(candidates: dict, calls: int, width: int) -> None:
    """Host and GPU us per call of each labelled native call, back to back."""
    print("  native calls alone:")
    for label, fn in candidates.items():
        host, device = per_call_us(fn, calls)
        print(f"    {label:{width}s} host {host:7.1f} us/call   GPU {device:7.1f} us/call")


def eval_operator_calls(drop_in, x: torch.Tensor, calls: int) -> None:
    """Host us per call of the eval operators: the one-call eval_forward, and the cached route's two halves."""
    ops = _native.operators()
    weight, bias, scale, gamma, beta = module_parameters(drop_in)
    folded = (bias, scale, gamma, beta, drop_in.bn.running_mean, drop_in.bn.running_var, drop_in.bn.eps)
    affine = ops.eval_affine(x, weight, *folded)
    print_native_calls({
        "eval_forward": lambda: ops.eval_forward(x, weight, *folded, None, None),
        "eval_affine": lambda: ops.eval_affine(x, weight, *folded),
        "eval_forward_folded": lambda: ops.eval_forward_folded(x, weight, affine, None, None),
    }, calls, width=20)


def operator_calls(drop_in, x: torch.Tensor, calls: int) -> None:
    """Host us per call of the training forward's operator alone, and of the two single-kernel calls that do its
    launches into buffers allocated beforehand."""
    ops = _native.operators()
    weight, bias, scale, gamma, beta = module_parameters(drop_in)
    (M, K), N = x.shape, weight.shape[0]
    name = str(x.dtype).removeprefix("torch.")
    tile_rows, _ = debug.gemm_config(name, M, N, K)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    partial_means, partial_m2s = torch.empty(2, -(-M // tile_rows), N, device=x.device)
    save_mean, save_invstd = torch.empty(2, N, device=x.device)
    workspace = gemm_workspace(x, N, K)  # stream-K rows only, else None
    candidates = {
        # What the forward calls: checks, plan, allocations, stream, both launches in C++.
        "operator": lambda: ops.train_forward(x, weight, bias, scale, gamma, beta, None, None, None, 0.1, 1e-5,
                                              None, None, False),
        "gemm_scale_stats": lambda: debug.gemm_scale_stats(x, weight, y, bias, scale, None, None, partial_means,
                                                           partial_m2s, None, workspace=workspace),
        "finish_normalize": lambda: debug.finish_normalize(y, y, partial_means, partial_m2s, tile_rows, gamma, beta,
                                                           None, None, None, 0.1, 1e-5, save_mean, save_invstd),
    }
    print_native_calls(candidates, calls, width=18)


_CALL_MARK = "host_overhead.call"
# The CUDA runtime's and driver's launch calls as torch.profiler names them (cudaLaunchKernel, cudaLaunchKernelExC:
# CUTLASS's, cuLaunchKernelEx: Triton's, and their versioned names).
LAUNCH_API_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel")


def profiled_calls(fn, calls: int, activities=(ProfilerActivity.CPU, ProfilerActivity.CUDA)):
    """(torch.profiler's events, the sorted (start, end) of each call) of `calls` calls of fn, after 5 untimed ones,
    each starting after a synchronization and marked by a _CALL_MARK range."""
    for _ in range(5):
        fn()
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    synchronize()
    with profile(activities=list(activities)) as prof:
        for _ in range(calls):
            synchronize()
            with record_function(_CALL_MARK):
                fn()
        synchronize()
    events = prof.events()
    return events, sorted((e.time_range.start, e.time_range.end) for e in events if e.name == _CALL_MARK)


def call_to_first_event_us(fn, calls: int, is_first, activities=(ProfilerActivity.CPU, ProfilerActivity.CUDA)):
    """Median host us from the start of a call of fn to the start of the first profiler event inside it for which
    is_first(name) holds, over `calls` calls that each start after a synchronization."""
    events, calls_at = profiled_calls(fn, calls, activities)
    firsts = sorted(e.time_range.start for e in events if e.name != _CALL_MARK and is_first(e.name))
    gaps = []
    for start, end in calls_at:
        index = bisect.bisect_left(firsts, start)
        if index < len(firsts) and firsts[index] <= end:
            gaps.append(firsts[index] - start)
    if len(gaps) < calls // 2:
        raise RuntimeError(f"only {len(gaps)} of {calls} calls had a matching event inside them")
    return statistics.median(gaps)


def runtime_api_calls(fn, calls: int) -> list[tuple[str, float, float]]:
    """(name, median us from the call's start, median us of its duration) of each CUDA runtime or driver API call
    made inside a call of fn, in their order, over `calls` calls that each start on an idle GPU (torch.profiler's
    CUPTI records: the profiler's cost per recorded op adds to the offsets, not to the API calls' durations)."""
    events, calls_at = profiled_calls(fn, calls)
    api = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                 if e.name.startswith(("cuda", "cu")) and e.device_type == torch.autograd.DeviceType.CPU)  # fmt: skip
    sequences = []
    for start, end in calls_at:
        inside = []
        for a, b, name in api[bisect.bisect_left(api, (start,)):]:
            if a > end:
                break
            inside.append((name, a - start, b - a))
        sequences.append(inside)
    names = statistics.mode(tuple(name for name, _, _ in seq) for seq in sequences)  # the usual sequence
    usual = [seq for seq in sequences if tuple(name for name, _, _ in seq) == names]
    return [(name, statistics.median(seq[i][1] for seq in usual), statistics.median(seq[i][2] for seq in usual))
            for i, name in enumerate(names)]  # fmt: skip


def host_marks_us(fn, calls: int, synchronized: bool) -> list[float]:
    """Median host us from the start of a call of fn to each of debug.HOST_MARKS and to its return, over `calls`
    calls, each started on an idle GPU if synchronized, else back to back."""
    for _ in range(5):
        fn()
    gaps = []
    for _ in range(calls):
        if synchronized:
            torch.cuda.synchronize()
        start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        fn()
        end = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        marks = [debug.host_mark_ns(mark) for mark in debug.HOST_MARKS]
        if not start <= marks[0] <= marks[-1] <= end:
            raise RuntimeError("the call did not pass every host mark (the fused path was not taken?)")
        gaps.append([(point - start) / 1e3 for point in (*marks, end)])
    torch.cuda.synchronize()
    return [statistics.median(column) for column in zip(*gaps)]


def call_us(fn, calls: int) -> float:
    """Median host us of a call of fn that starts on an idle GPU (from its start to its return)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def print_host_marks(drop_in, reference, x, calls: int) -> None:
    """--mark's table: gemmbn's host path split at its marks, beside eager's call and a bare torch.mm."""
    print("  gemmbn's host path, us from the call's start (median; no profiler):")
    print(f"    {'':28s} {'operator':>9s} {'GEMM checks':>12s} {'GEMM':>9s} {'return':>9s}")
    print(f"    {'':28s} {'entered':>9s} {'done':>12s} {'enqueued':>9s} {'':>9s}")
    for label, synchronized in (("synchronized", True), ("back to back", False)):
        marks = host_marks_us(lambda: drop_in(x), calls, synchronized)
        print(f"    {label:28s} {marks[0]:9.1f} {marks[1]:12.1f} {marks[2]:9.1f} {marks[3]:9.1f}")
    if not drop_in.training:
        return print_bare_calls(reference, x, calls)
    # The module's operator called straight from Python: its "entered" is the dispatcher's part of the module's, the
    # rest of which is gemmbn's Python.
    for label, synchronized in (("operator alone, synchronized", True), ("operator alone, back to back", False)):
        marks = host_marks_us(training_operator_alone(drop_in, x), calls, synchronized)
        print(f"    {label:28s} {marks[0]:9.1f} {marks[1]:12.1f} {marks[2]:9.1f} {marks[3]:9.1f}")
    print_bare_calls(reference, x, calls)


def training_operator_alone(drop_in, x):
    """A call of the training forward's operator with the module's tensors (TF32 for float32), as the module makes."""
    weight, bias, scale, gamma, beta = module_parameters(drop_in)
    bn = drop_in.bn
    operator = _native.operators().train_forward
    return lambda: operator(x, weight, bias, scale, gamma, beta, bn.running_mean, bn.running_var, bn.num_batches_tracked,
                            bn.momentum, bn.eps, None, None, False)  # fmt: skip


def print_runtime_api_calls(drop_in, x, calls: int) -> None:
    """--api's table: the CUDA API calls inside a synchronized call of the module and of its operator alone."""
    for label, fn in (("module", lambda: drop_in(x)), ("operator alone", training_operator_alone(drop_in, x))):
        print(f"  CUDA API calls inside a synchronized call of the {label} (torch.profiler, medians of {calls} calls):")
        for name, offset, duration in runtime_api_calls(fn, calls):
            print(f"    {name:36s} at {offset:7.1f} us, {duration:6.1f} us")


def print_bare_calls(reference, x, calls: int) -> None:
    """Eager's whole call and a bare torch.mm, synchronized: the floor this host sets."""
    weight_t = reference.gemm.weight.detach().t()
    print(f"  synchronized call, start to return: eager {call_us(lambda: reference(x), calls):.1f} us, "
          f"bare torch.mm(x, W^T) {call_us(lambda: torch.mm(x, weight_t), calls):.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(128, 1024, 512), metavar=("M", "K", "N"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    add_precision_option(parser)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--launch", action="store_true", help="host us from a call to its first kernel launch")
    parser.add_argument("--mark", action="store_true", help="gemmbn's host path split at its native marks")
    parser.add_argument("--eval", action="store_true", help="the eval forward (modules in eval mode)")
    parser.add_argument("--grad", action="store_true", help="record autograd's graph (a training loop's forward)")
    parser.add_argument("--api", action="store_true", help="the CUDA API calls inside a training forward (profiler)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (its compile takes ~30 s)")
    args = parser.parse_args()
    M, K, N = args.size
    dtype = getattr(torch, args.dtype)
    reference, drop_in, compiled, x = reference_drop_in_compiled(M, K, N, dtype, args.precision)
    if args.eval:  # the compiled reference is the same module: it recompiles for eval in its warm-up calls
        reference.eval(), drop_in.eval()
    mode = "eval" if args.eval else "training"
    matmuls = FLOAT32_MATMULS[args.precision]
    print(f"{torch.cuda.get_device_name()}  {M}x{K}->{N} {args.dtype} ({matmuls} for float32), {mode} forward, "
          f"{'grad enabled' if args.grad else 'no_grad'}, {args.calls} calls back to back")
    with contextlib.nullcontext() if args.grad else torch.no_grad():
        providers = {"gemmbn": lambda: drop_in(x), "eager": lambda: reference(x), "compile": lambda: compiled(x)}
        if args.no_compile:
            del providers["compile"]
        for name, fn in providers.items():
            host, device = per_call_us(fn, args.calls)
            print(f"  {name:8s} host {host:7.1f} us/call   GPU {device:7.1f} us/call")
        if args.launch:
            print("  from a call's start to its first kernel launch (synchronized calls, torch.profiler: an upper bound)")
            for name, fn in providers.items():
                gap = call_to_first_event_us(fn, 200, lambda event: event.startswith(LAUNCH_API_PREFIXES))
                print(f"    {name:8s} {gap:7.1f} us")
        if args.mark:
            print_host_marks(drop_in, reference, x, 500)
        if args.api and not args.eval:
            print_runtime_api_calls(drop_in, x, 200)
        if args.profile:
            print_profile(lambda: drop_in(x), args.calls, rows=15)
            torch.cuda.synchronize()
            (eval_operator_calls if args.eval else operator_calls)(drop_in, x, args.calls)


if __name__ == "__main__":
    main()
