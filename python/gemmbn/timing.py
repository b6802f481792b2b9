"""Timing of callables side by side: CUDA events on the GPU, perf_counter on the CPU.

One method serves the main job and perf/bench.py: candidates are timed interleaved (round i times each
once), so that clock drift under sustained load (power, heat) falls on all of them alike, and each round
starts one candidate later than the last, so that no candidate always follows the same neighbour (a
kernel's clocks depend on the power drawn just before it); on the GPU an
optional buffer is overwritten before every timed call (outside the events) to evict the operands
from L2, and the host never waits between calls unless ``synchronize`` asks it to (KernelBench's harness
does: then the host's time before the first launch is part of each call).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence

import torch

FLUSH_BYTES = 256 << 20  # over four times the H100/H200 L2


def flush_buffer(device: torch.device) -> torch.Tensor | None:
    """A buffer whose overwrite evicts the L2 (None off the GPU)."""
    return torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if device.type == "cuda" else None


def _rotated_rounds(iters: int, count: int) -> Iterator[tuple[int, int]]:
    """(round, candidate index) in timing order: every round times each candidate once, starting one later."""
    for round_index in range(iters):
        for position in range(count):
            yield round_index, (round_index + position) % count


def interleaved_ms(fns: Sequence[Callable[[], object]], device: torch.device, iters: int = 10, warmup: int = 3,
                   flush: torch.Tensor | None = None, synchronize: bool = False) -> list[list[float]]:
    """Milliseconds of each of ``iters`` calls of every fn, after ``warmup`` untimed calls of each; with
    ``synchronize`` the GPU is idle when each call starts."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    if device.type != "cuda":
        times = [[] for _ in fns]
        for _, index in _rotated_rounds(iters, len(fns)):
            start = time.perf_counter()
            fns[index]()
            times[index].append((time.perf_counter() - start) * 1e3)
        return times
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
              for _ in fns]  # fmt: skip
    torch.cuda.synchronize(device)
    for round_index, index in _rotated_rounds(iters, len(fns)):
        start, end = events[index][round_index]
        if flush is not None:
            flush.zero_()
        if synchronize:
            torch.cuda.synchronize(device)
        start.record()
        fns[index]()
        end.record()
    torch.cuda.synchronize(device)  # (without ``synchronize``, the only one: no host gap forced between calls)
    return [[start.elapsed_time(end) for start, end in fn_events] for fn_events in events]


def median_ms(fn: Callable[[], object], device: torch.device, iters: int = 10, warmup: int = 3,
              flush: torch.Tensor | None = None) -> float:
    """Median over ``iters`` calls of fn's time in milliseconds, after ``warmup`` untimed calls."""
    return statistics.median(interleaved_ms([fn], device, iters, warmup, flush)[0])
