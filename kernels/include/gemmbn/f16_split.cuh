// The fp32-faithful GEMM's operand format, shared by split_weight (W, once per weight version),
// row_scales (x's per-row scales, every call) and the GEMM mainloop (x, split on the fly). A row of
// values is scaled by a power of two 2^e (exact), then each value v is written as two fp16 parts:
//   2^e v = hi + lo,   hi = fp16(2^e v),   lo = fp16(2^e v - hi),   |2^e v - hi - lo| <= 2^-22 |2^e v|
// fp16 keeps 11 significant bits to bf16's 8, so the pair carries 22 bits where bf16 pairs carry 16
// (perf/split_accuracy_model.py: bf16x3 cannot reach fp32 accuracy whatever the accumulation). fp16's
// narrow range is what the scale is for: e puts the row's largest magnitude in [2^14, 2^15), and a
// value far below it (lo under fp16's normal range) errs by at most 2^-25 absolute, 2^-39 of the
// row maximum: a dot product errs ~2^-22 of sum |x w| either way, as an fp32 one does. The three
// leading products hi hi' + lo hi' + hi lo' then carry ~22 bits.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace gemmbn::split {

inline constexpr int kTileK = 32;          // x columns per k-tile: one scale per row, one fp32 promotion
inline constexpr int kSliceK = 16;         // columns per wgmma (m64nNk16)
inline constexpr int kSlices = kTileK / kSliceK;
inline constexpr int kTargetExponent = 14;  // the scaled row maximum lies in [2^14, 2^15)
inline constexpr int kRowBlock = 128;        // x's rows per GEMM tile: row_scales pads to whole blocks

// Entries of row_scales's output for M rows: whole blocks of kRowBlock.
inline constexpr int64_t row_scale_count(int64_t M) { return (M + kRowBlock - 1) / kRowBlock * kRowBlock; }

// Columns of the split weight for K input features: per k-tile, kTileK hi parts then kTileK lo parts.
inline constexpr int64_t split_columns(int64_t K) { return (K + kTileK - 1) / kTileK * 2 * kTileK; }

// Position p of a wgmma k-slice holds the slice's column slice_column(p). The A registers of lane
// quad q hold positions {2q, 2q+1, 2q+8, 2q+9} (rows g and g+8); under this order they take columns
// 4q..4q+3 of x, one 16-byte shared-memory load per row.
__host__ __device__ constexpr int slice_column(int p) { return 4 * ((p % 8) / 2) + 2 * (p / 8) + p % 2; }

// Power-of-two scale for a row whose largest magnitude is max_abs (>= 0), and its inverse:
//   scale = 2^(141 - E), unscale = 2^(E - 141), E = the biased exponent of max_abs clamped to [15, 254]
// so max_abs * scale lies in [2^14, 2^15) and both factors are normal floats. Rows below 2^-112
// (all zero, or subnormal) get the largest scale, 2^126; infinities and NaN pass through.
__device__ __forceinline__ void pow2_scale(float max_abs, float& scale, float& unscale) {
  int biased = (__float_as_int(max_abs) >> 23) & 0xff;
  biased = min(max(biased, 15), 254);
  scale = __int_as_float((127 + 127 + kTargetExponent - biased) << 23);
  unscale = __int_as_float((biased - kTargetExponent) << 23);
}

// 1 / s for a power of two s = 2^e with |e| <= 126 (pow2_scale's range), exactly: negate the exponent.
__device__ __forceinline__ float inverse_pow2(float s) { return __int_as_float((254 << 23) - __float_as_int(s)); }

// (a, b) -> packed fp16 hi parts and lo parts, low half first.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 back = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - back.x, b - back.y);  // exact differences
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

}  // namespace gemmbn::split
