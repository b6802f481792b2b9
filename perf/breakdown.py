"""Where the time of one fused forward goes: each native launch timed alone, next to cuBLAS.

    python perf/breakdown.py [--size M K N]

Times (CUDA events, median of --iters after warm-up, inputs resident; ms):
  gemm+stats   gemm_scale_stats with the statistics epilogue (fp32 "highest": the split GEMM)
  gemm         the same kernel with the statistics node switched off (the epilogue's cost)
  finish       finish_normalize in place over y
  forward      the module's whole training forward (Python + both launches)
  cublas       torch.addmm (GEMM + bias) in the same precision, the floor a user knows
"""

from __future__ import annotations

import argparse
import statistics

import torch

from gemmbn import GemmScaleBatchNorm, debug
from gemmbn.debug import gemm_workspace


def _time(fn, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def breakdown(M: int, K: int, N: int, dtype: torch.dtype, precision: str, iters: int) -> dict[str, float]:
    C = debug
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    x = torch.rand(M, K, device="cuda", dtype=dtype)
    model = GemmScaleBatchNorm(K, N, (N,), precision=precision).to("cuda", dtype)
    w, b, s = model.gemm.weight.detach(), model.gemm.bias.detach(), model.scale.detach()
    split = dtype == torch.float32 and precision == "highest"  # the fp32-faithful GEMM
    tile_m, _ = C.gemm_config(name, M, N, K, split=split)
    tiles = -(-M // tile_m)
    y = torch.empty(M, N, device="cuda", dtype=dtype)
    partials = torch.empty(2, tiles, N, device="cuda")
    save = torch.empty(2, N, device="cuda")
    extra = {"workspace": gemm_workspace(x, N, K, split=split)}  # stream-K rows only, else None
    if split:
        extra.update(debug.split_gemm_arguments(w, M))
    rm, rv = model.bn.running_mean, model.bn.running_var
    gamma, beta = model.bn.weight.detach(), model.bn.bias.detach()
    times = {
        "gemm+stats": _time(lambda: C.gemm_scale_stats(x, w, y, b, s, None, None, partials[0], partials[1], None,
                                                       **extra), iters),
        "gemm": _time(lambda: C.gemm_scale_stats(x, w, y, b, s, None, None, None, None, None, **extra),
                      iters),
    }
    C.gemm_scale_stats(x, w, y, b, s, None, None, partials[0], partials[1], None, **extra)
    times["finish"] = _time(lambda: C.finish_normalize(y, y, partials[0], partials[1], tile_m, gamma, beta,
                                                       rm, rv, None, 0.1, 1e-5, save[0], save[1]), iters)
    with torch.no_grad():
        times["forward"] = _time(lambda: model(x), iters)
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            times["cublas"] = _time(lambda: torch.addmm(b, x, w.t()), iters)
        finally:
            torch.set_float32_matmul_precision(previous)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(16384, 4096, 4096), metavar=("M", "K", "N"))
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    M, K, N = args.size
    print(f"{torch.cuda.get_device_name()}  {M}x{K}->{N}  median of {args.iters}, ms")
    names = ["gemm+stats", "gemm", "finish", "forward", "cublas"]
    print(f"  {'config':<10}" + "".join(f"{n:>12}" for n in names))
    for label, dtype, precision in (("fp32", torch.float32, "highest"), ("tf32", torch.float32, "high"),
                                    ("bf16", torch.bfloat16, "high"), ("fp16", torch.float16, "high")):
        t = breakdown(M, K, N, dtype, precision, args.iters)
        print(f"  {label:<10}" + "".join(f"{t[n]:>12.3f}" for n in names))


if __name__ == "__main__":
    main()
