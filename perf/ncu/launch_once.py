"""Launch each native kernel once at a given size, for Nsight Compute to profile.

    python perf/ncu/launch_once.py [--dtype float32|bfloat16|float16] [--split] [--size M K N] [--no-stats] [--cublas]
                                   [--config ROW] [--raster R --swizzle S] [--module]

The forward's launches run once as a warm-up (module loading, the shared-memory attribute), then once more inside
cudaProfilerStart/Stop (perf/cuda_facts.py, cuda-python): with `ncu --profile-from-start off` (perf/ncu/profile.sh)
the profile holds exactly that second forward's kernels.
--split: the fp32-faithful split GEMM (float32 data; its weight split first, by its own kernel; the
GEMM launch runs row_scales, then the GEMM: ncu's kernel filter picks the GEMM).
--config / --raster / --swizzle: that table row and tile order (perf/tune_gemm.py's) instead of the rule's.
--cublas: torch.addmm(b, x, W^T) instead (cuBLAS's GEMM + bias, the baseline our GEMM is compared with), same operands
(float32 data: TF32, as our float32 GEMM without --split).
--module: the drop-in module's training forward under no_grad (float32 data: TF32), so the operator's own rules and
GEMMBN_STATISTICS_SOURCE / GEMMBN_TRAIN_PRODUCT pick the route: with GEMMBN_STATISTICS_SOURCE=y the finish kernel
profiled is the pass over y.
"""

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuda_facts import profiled  # noqa: E402

from gemmbn import debug  # noqa: E402
from gemmbn.debug import gemm_workspace  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
parser.add_argument("--size", nargs=3, type=int, default=(16384, 4096, 4096), metavar=("M", "K", "N"))
parser.add_argument("--no-stats", action="store_true", help="GEMM without the statistics node")
parser.add_argument("--split", action="store_true", help="the fp32-faithful split GEMM (float32 only)")
parser.add_argument("--cublas", action="store_true", help="cuBLAS's GEMM + bias (torch.addmm) on the same operands")
parser.add_argument("--config", type=int, default=-1, help="the table row (default: the rule's)")
parser.add_argument("--raster", type=int, default=-1, help="0 CUTLASS's heuristic, 1 along M, 2 along N")
parser.add_argument("--swizzle", type=int, default=-1, help="1, 2, 4 or 8 (default: the row's rule)")
parser.add_argument("--module", action="store_true", help="the drop-in module's training forward (its own route)")
args = parser.parse_args()
if args.module and (args.split or args.cublas or args.no_stats or args.config >= 0):
    parser.error("--module takes the operator's own route: no --split, --cublas, --no-stats or --config")
if args.split and args.dtype != "float32":
    parser.error("--split takes float32 data")

C = debug
torch.set_float32_matmul_precision("high")  # float32 matmuls on TF32: cuBLAS's, and the module's route
dtype = getattr(torch, args.dtype)
M, K, N = args.size
x = torch.rand(M, K, device="cuda").to(dtype)
w = ((torch.rand(N, K, device="cuda") * 2 - 1) / math.sqrt(K)).to(dtype)
b, s = torch.randn(N, device="cuda").to(dtype), torch.randn(N, device="cuda").to(dtype)
gamma, beta = torch.ones(N, device="cuda", dtype=dtype), torch.zeros(N, device="cuda", dtype=dtype)
tile_m, _ = C.gemm_config(args.dtype, M, N, K, config=args.config, split=args.split)
order = {"config": args.config, "raster": args.raster, "swizzle": args.swizzle}
partials = torch.empty(2, -(-M // tile_m), N, device="cuda")
save = torch.empty(2, N, device="cuda")
y = torch.empty(M, N, device="cuda", dtype=dtype)
stats = (None, None) if args.no_stats else (partials[0], partials[1])
split = {"workspace": gemm_workspace(x, N, K, split=args.split)}  # stream-K rows only, else None
if args.split:
    split.update(debug.split_gemm_arguments(w, M))


if args.module:
    from models import reference_drop_in_compiled  # noqa: E402

    _, drop_in, _, module_x = reference_drop_in_compiled(M, K, N, dtype)


def forward():
    if args.module:
        with torch.no_grad():
            drop_in(module_x)
        return
    if args.cublas:
        torch.addmm(b, x, w.t())  # as bench.py's cublas provider (no out=: the bias epilogue path)
        return
    C.gemm_scale_stats(x, w, y, b, s, None, None, *stats, None, **split, **order)
    if not args.no_stats:
        C.finish_normalize(y, y, partials[0], partials[1], tile_m, gamma, beta, None, None, None, 0.1, 1e-5,
                           save[0], save[1])


forward()  # warm-up, outside the capture range
torch.cuda.synchronize()
with profiled():
    forward()
