// Chan's pairwise merge of (count, mean, M2) statistics, shared by the GEMM epilogue node and
// bias_scale_moments (finish_normalize merges all tiles at once, with shifted sums). M2 is the sum of squared deviations from the mean: merging (n, mean, M2)
// pairs never subtracts two large sums, so the variance survives |mean| >> std.
#pragma once

#include <cuda_runtime.h>

namespace gemmbn {

// (n_a, mean_a, m2_a) <- merge with (n_b, mean_b, m2_b):
//   n = n_a + n_b, mean = mean_a + (mean_b - mean_a) n_b / n, M2 = M2_a + M2_b + delta^2 n_a n_b / n
template <class T>
__host__ __device__ __forceinline__ void chan_merge(T& n_a, T& mean_a, T& m2_a, T n_b, T mean_b, T m2_b) {
  T n = n_a + n_b;
  T weight_b = n > T(0) ? n_b / n : T(0);
  T delta = mean_b - mean_a;
  mean_a += delta * weight_b;
  m2_a += m2_b + delta * delta * n_a * weight_b;
  n_a = n;
}

// Same merge with a fast reciprocal: counts are small integers (<= a tile's rows), where it is exact
// to a few ulp, and the epilogue runs it per column per lane.
__device__ __forceinline__ void chan_merge_fast(float& n_a, float& mean_a, float& m2_a, float n_b, float mean_b,
                                                float m2_b) {
  float n = n_a + n_b;
  float weight_b = n > 0.f ? __fdividef(n_b, n) : 0.f;
  float delta = mean_b - mean_a;
  mean_a = fmaf(delta, weight_b, mean_a);
  m2_a += fmaf(delta * delta, n_a * weight_b, m2_b);
  n_a = n;
}

// Two halves of equal count n merged without a division (the epilogue's full tiles: n a power of two, so exact):
//   mean = (mean_a + mean_b) / 2,   M2 = M2_a + M2_b + (mean_b - mean_a)^2 half_count,   half_count = n / 2
__device__ __forceinline__ void chan_merge_equal_halves(float& mean_a, float& m2_a, float mean_b, float m2_b,
                                                        float half_count) {
  const float delta = mean_b - mean_a;
  m2_a = fmaf(delta * delta, half_count, m2_a + m2_b);  // symmetric in (a, b): both lanes of a pair agree
  mean_a = 0.5f * (mean_a + mean_b);
}

}  // namespace gemmbn
