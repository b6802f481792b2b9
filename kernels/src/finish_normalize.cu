// Finish the batch statistics from the per-tile partials, update the running statistics, normalize.
#include <algorithm>

#include "gemmbn/api.h"
#include "gemmbn/device_info.h"
#include "gemmbn/elementwise.cuh"

namespace gemmbn {
namespace {

constexpr int kThreads = 256;
constexpr int kLanesPerRow = 32;                       // threads across a row, one 16-byte vector each
constexpr int kRowsPerPass = kThreads / kLanesPerRow;  // rows a block touches per pass
constexpr int kUnroll = 4;                             // independent 16-byte loads in flight per thread

template <class T>
struct FinishParams {
  const T* y;
  T* out;
  int64_t M;
  int N;
  const float* partial_mean;
  const float* partial_m2;
  int tiles, tile_rows;
  const T *gamma, *beta;
  T *running_mean, *running_var;
  const int64_t* batches_tracked;
  bool cumulative;
  double momentum, eps;
  float *save_mean, *save_invstd;
  int64_t rows_per_block;
};

// Per column n of the block, from the per-tile partials (n_t rows, mean_t, M2_t) of y:
//   mean_y = sum_t n_t mean_t / M,   var_y = (sum_t M2_t + n_t (mean_t - mean_y)^2) / M     (fp64)
//   alpha[n] = gamma / sqrt(var_y + eps), delta[n] = beta - mean_y alpha
// then out[m, n] = y[m, n] alpha[n] + delta[n] for the block's rows. Blocks of row 0 update running stats.
// NOTES:
// - The second pass is Chan's merge written for all tiles at once (parallel-axis theorem): deviations
//   are taken from the final mean, so nothing cancels, and the iterations are independent (no
//   division chain), so the L2-resident partials stream in.
// - Every block merges its own columns (no second launch, no inter-block dependency); the order is
//   fixed, so all blocks agree bitwise.
template <class T>
__global__ void __launch_bounds__(kThreads) finish_normalize_kernel(FinishParams<T> p) {
  using Vec = Vector16<T>;
  constexpr int kCols = kLanesPerRow * Vec::kSize;  // columns per block
  constexpr int kGroups = kThreads / kCols;         // threads per column, each a range of tiles
  static_assert(kGroups >= 1 && kThreads % kCols == 0, "block shape");
  __shared__ double group_sum[kGroups][kCols];
  __shared__ float alpha_s[kCols], delta_s[kCols];

  const int col0 = blockIdx.x * kCols;
  const int c = threadIdx.x % kCols, group = threadIdx.x / kCols, col = col0 + c;
  const int per_group = (p.tiles + kGroups - 1) / kGroups;
  const int t_begin = group * per_group, t_end = min(p.tiles, t_begin + per_group);
  auto tile_rows = [&](int t) { return static_cast<double>(min(int64_t(p.tile_rows), p.M - int64_t(t) * p.tile_rows)); };

  double sum = 0;
  if (col < p.N) {
#pragma unroll 4
    for (int t = t_begin; t < t_end; ++t) sum += tile_rows(t) * p.partial_mean[int64_t(t) * p.N + col];
  }
  group_sum[group][c] = sum;
  __syncthreads();
  double mean = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) mean += group_sum[g][c];
  mean /= static_cast<double>(p.M);
  __syncthreads();  // group_sum is reused below

  double m2 = 0;
  if (col < p.N) {
#pragma unroll 4
    for (int t = t_begin; t < t_end; ++t) {
      const int64_t at = int64_t(t) * p.N + col;
      const double deviation = p.partial_mean[at] - mean;
      m2 += p.partial_m2[at] + tile_rows(t) * deviation * deviation;
    }
  }
  group_sum[group][c] = m2;
  __syncthreads();
  if (threadIdx.x < kCols) {
    m2 = 0;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) m2 += group_sum[g][c];
    float alpha = 0.f, delta = 0.f;
    if (col < p.N) {
      const double var_y = m2 / static_cast<double>(p.M);
      const double invstd = 1.0 / sqrt(var_y + p.eps);
      const double a = load_or(p.gamma, col, 1.0) * invstd;
      alpha = static_cast<float>(a);
      delta = static_cast<float>(load_or(p.beta, col, 0.0) - mean * a);
      if (blockIdx.y == 0) {
        p.save_mean[col] = static_cast<float>(mean);
        p.save_invstd[col] = static_cast<float>(invstd);
        if (p.running_mean != nullptr) {
          const double f = p.cumulative ? 1.0 / static_cast<double>(*p.batches_tracked) : p.momentum;
          const double unbiased = var_y * static_cast<double>(p.M) / static_cast<double>(p.M - 1);
          p.running_mean[col] = from_float<T>(static_cast<float>((1 - f) * to_float(p.running_mean[col]) + f * mean));
          p.running_var[col] = from_float<T>(static_cast<float>((1 - f) * to_float(p.running_var[col]) + f * unbiased));
        }
      }
    }
    alpha_s[c] = alpha, delta_s[c] = delta;
  }
  __syncthreads();

  const int lane = threadIdx.x % kLanesPerRow, row_in_pass = threadIdx.x / kLanesPerRow;
  const int vector_col = col0 + lane * Vec::kSize;
  if (vector_col >= p.N) return;
  float alpha[Vec::kSize], delta[Vec::kSize];
#pragma unroll
  for (int i = 0; i < Vec::kSize; ++i) alpha[i] = alpha_s[lane * Vec::kSize + i], delta[i] = delta_s[lane * Vec::kSize + i];

  const int64_t row_begin = blockIdx.y * p.rows_per_block;
  const int64_t row_end = min(p.M, row_begin + p.rows_per_block);
  for (int64_t r = row_begin + row_in_pass; r < row_end; r += kRowsPerPass * kUnroll) {
    Vec v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t row = r + u * kRowsPerPass;
      if (row < row_end) v[u].load(p.y + row * p.N + vector_col);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t row = r + u * kRowsPerPass;
      if (row >= row_end) continue;
#pragma unroll
      for (int i = 0; i < Vec::kSize; ++i) v[u].set(i, fmaf(v[u].get(i), alpha[i], delta[i]));
      v[u].store(p.out + row * p.N + vector_col);
    }
  }
}

}  // namespace

Status finish_normalize(const FinishNormalizeArgs& a, cudaStream_t stream) {
  if (a.M < 2) return Status::invalid("batch statistics need M >= 2 rows");
  if (a.N < 1 || a.tile_rows < 1) return Status::invalid("N and tile_rows must be positive");
  if (a.N % (16 / dtype_size(a.dtype)) != 0) return Status::invalid("N must be a multiple of 16 bytes of the dtype");
  if (!a.y || !a.out || !a.partial_mean || !a.partial_m2 || !a.save_mean || !a.save_invstd) {
    return Status::invalid("y, out, partials and save_mean/save_invstd are required");
  }
  if (!is_aligned16(a.y) || !is_aligned16(a.out)) return Status::invalid("y and out must be 16-byte aligned");
  if ((a.running_mean == nullptr) != (a.running_var == nullptr)) {
    return Status::invalid("running_mean and running_var go together");
  }
  if (a.running_mean && a.cumulative && !a.batches_tracked) {
    return Status::invalid("momentum=None needs batches_tracked");
  }
  int device = 0, sm_count = 0;
  if (cudaError_t e = current_device_info(device, sm_count); e != cudaSuccess) {
    return Status::from_cuda(e, "querying the current device");
  }
  return with_element_type(a.dtype, [&](auto element) -> Status {
    using T = decltype(element);
    constexpr int kCols = kLanesPerRow * Vector16<T>::kSize;
    const int64_t blocks_x = (a.N + kCols - 1) / kCols;
    // About 8 blocks per SM in all; at least one pass of rows per block.
    const int64_t row_chunks = std::max<int64_t>(1, std::min<int64_t>((a.M + kRowsPerPass - 1) / kRowsPerPass,
                                                                      (int64_t(sm_count) * 8 + blocks_x - 1) / blocks_x));
    const int64_t step = kRowsPerPass * kUnroll;
    const int64_t rows_per_block = ((a.M + row_chunks - 1) / row_chunks + step - 1) / step * step;
    FinishParams<T> p{static_cast<const T*>(a.y), static_cast<T*>(a.out), a.M, a.N, a.partial_mean, a.partial_m2,
                      static_cast<int>((a.M + a.tile_rows - 1) / a.tile_rows), a.tile_rows, static_cast<const T*>(a.gamma),
                      static_cast<const T*>(a.beta), static_cast<T*>(a.running_mean), static_cast<T*>(a.running_var),
                      a.batches_tracked, a.cumulative, a.momentum, a.eps, a.save_mean, a.save_invstd, rows_per_block};
    dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>((a.M + rows_per_block - 1) / rows_per_block));
    finish_normalize_kernel<T><<<grid, kThreads, 0, stream>>>(p);
    return Status::from_cuda(cudaGetLastError(), "launching finish_normalize");
  });
}

}  // namespace gemmbn
