"""Kernel-by-kernel anatomy of one training step (zero grads, forward, backward): where its GPU time goes.

    python perf/step_anatomy.py [--size M K N] [--config fp32|tf32|bf16|fp16] [--providers gemmbn,eager]
                                [--mode fwd_bwd|step] [--iters 5]

torch.profiler records `iters` steps of each provider (perf/train_step.py's step in `mode`: `step` adds the SGD
update; after warm-up, back to back) and prints each kernel's total device time per step (summed over its launches in
a step) and its launches per step, largest first, with the step's kernel total: the budget a faster step must cut
from, read off kernel by kernel.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile
from train_step import CONFIGS, MODES, _problem, _step, sgd


def _kernels_per_step(fn, iters: int) -> dict[str, tuple[float, float]]:
    """kernel name -> (device ms per step, launches per step) over `iters` profiled calls of fn."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            totals[event.name] += event.device_time / 1e3
            counts[event.name] += 1
    return {name: (totals[name] / iters, counts[name] / iters) for name in totals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=[65536, 1024, 1024], metavar=("M", "K", "N"))
    parser.add_argument("--config", default="fp32", choices=list(CONFIGS))
    parser.add_argument("--providers", default="gemmbn,eager")
    parser.add_argument("--mode", default="fwd_bwd", choices=MODES)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    M, K, N = args.size
    models, x, dout = _problem(M, K, N, args.config, args.providers.split(","))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {M}x{K}->{N} {args.config}, training step "
          f"({args.mode})")
    for provider, module in models.items():
        kernels = _kernels_per_step(_step(module, x, dout, sgd(module, args.mode)), args.iters)
        total = sum(ms for ms, _ in kernels.values())
        print(f"\n{provider}: kernels {total:.3f} ms per step")
        for name, (ms, launches) in sorted(kernels.items(), key=lambda item: -item[1][0]):
            print(f"  {ms:8.3f} ms  x{launches:<4g} {name[:110]}")


if __name__ == "__main__":
    main()
