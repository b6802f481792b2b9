"""Which split scheme can make a tensor-core GEMM fp32-faithful: a CPU model of their operand errors.

    python perf/split_accuracy_model.py [--size M K N] [--seed S]

Each scheme splits x and W into parts of a narrow format, drops the products of the two low parts, and
sums the rest exactly (float64), so what is left is the error of the split alone: a floor no
accumulation scheme gets under. Printed next to NumPy's float32 matmul (a blocked SGEMM) on three
inputs: KernelBench's (rand x, nn.Linear init), values spanning 1e-3..1e3, and x = 100 + N(0, 1)
(every column of y has |mean| >> std, which BatchNorm's normalization turns into a large output error).
Columns: relative Frobenius error of x @ W^T, and of the normalized output.

What it showed (2026-12-01, the default size), and why gemmbn's fp32 GEMM splits into fp16:
- bf16x3 (8-bit parts: 16 bits kept) errs ~3.9e-6 on the GEMM, 6.5e-6 on the output: over the 5e-6
  budget before any accumulation error, and 8x SGEMM's on the mean-heavy input.
- 3xTF32 (11-bit parts) and scaled fp16x3 (11-bit parts, power-of-two scales per row of W and per row
  and 32-column k-tile of x, as the kernel does) both err ~6e-8: 6x under SGEMM. fp16 runs at bf16's
  tensor-core rate, twice TF32's, so fp16x3 costs what bf16x3 costs (floor 1.7 ms at 16384x4096->4096
  vs 3.3 ms for 3xTF32).
"""

from __future__ import annotations

import argparse

import numpy as np


def _round_bits(a: np.ndarray, dropped: int) -> np.ndarray:
    """float32 -> a format keeping 24 - dropped significand bits (round to nearest even), as float32."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    half = (1 << (dropped - 1)) - 1
    rounded = ((bits + half + ((bits >> dropped) & 1)) >> dropped) << dropped
    return rounded.astype(np.uint32).view(np.float32)


def bf16(a):
    return _round_bits(a, 16)


def tf32(a):
    return _round_bits(a, 13)


def fp16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def _split(a, rounding):
    hi = rounding(a)
    lo = rounding((a - hi).astype(np.float32))  # the difference is exact in float32
    return hi.astype(np.float64), lo.astype(np.float64)


def _three_products(x, w, rounding):
    xh, xl = _split(x, rounding)
    wh, wl = _split(w, rounding)
    return xh @ wh.T + xl @ wh.T + xh @ wl.T


def _pow2_scale(block):
    """Per-row 2^(14 - floor(log2 max|.|)): the row maximum lands in [2^14, 2^15), as in f16_split.cuh."""
    peak = np.abs(block).max(axis=1, keepdims=True)
    return np.exp2(14 - np.floor(np.log2(np.where(peak > 0, peak, 1.0))))


def _scaled_fp16(x, w, k_tile=32):
    w_scale = _pow2_scale(w)
    w_scaled = (w * w_scale).astype(np.float32)
    acc = np.zeros((x.shape[0], w.shape[0]))
    for k0 in range(0, x.shape[1], k_tile):
        block = x[:, k0:k0 + k_tile]
        x_scale = _pow2_scale(block)
        acc += _three_products((block * x_scale).astype(np.float32), w_scaled[:, k0:k0 + k_tile], fp16) / x_scale
    return acc / w_scale.T


SCHEMES = {
    "sgemm (numpy float32)": lambda x, w: (x @ w.T).astype(np.float64),
    "bf16x3": lambda x, w: _three_products(x, w, bf16),
    "3xtf32": lambda x, w: _three_products(x, w, tf32),
    "fp16x3, scaled": _scaled_fp16,
}


def _normalized(y):
    return (y - y.mean(0)) / np.sqrt(y.var(0) + 1e-5)


def _relative(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", nargs=3, type=int, default=(1024, 4096, 256), metavar=("M", "K", "N"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    M, K, N = args.size
    rng = np.random.default_rng(args.seed)
    w = rng.uniform(-(K**-0.5), K**-0.5, (N, K)).astype(np.float32)
    b, s = rng.uniform(-(K**-0.5), K**-0.5, N), rng.standard_normal(N)
    inputs = {
        "rand x (KernelBench)": rng.random((M, K), dtype=np.float32),
        "x in +-1e-3..1e3": (np.exp(rng.uniform(np.log(1e-3), np.log(1e3), (M, K)))
                             * rng.choice([-1.0, 1.0], (M, K))).astype(np.float32),
        "x = 100 + N(0, 1)": (100 + rng.standard_normal((M, K))).astype(np.float32),
    }  # fmt: skip
    print(f"{M}x{K}->{N}, relative Frobenius error against float64 (GEMM | normalized output)")
    for label, x in inputs.items():
        acc64 = x.astype(np.float64) @ w.astype(np.float64).T
        out64 = _normalized((acc64 + b) * s)
        print(f"\n{label}")
        for name, scheme in SCHEMES.items():
            acc = scheme(x, w)
            out = _normalized((acc + b) * s)
            print(f"  {name:<22} {_relative(acc, acc64):9.2e} | {_relative(out, out64):9.2e}")


if __name__ == "__main__":
    main()
