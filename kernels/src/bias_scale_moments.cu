// The statistics half of the fp32-exact interim path: after an SGEMM wrote acc, apply bias and scale
// and write the same per-tile partials the fused epilogue writes.
#include "gemmbn/api.h"
#include "gemmbn/elementwise.cuh"
#include "gemmbn/moments.cuh"

namespace gemmbn {
namespace {

constexpr int kThreads = 256;
constexpr int kLanesPerRow = 32;                       // one float4 each: 128 columns per block
constexpr int kRowsPerPass = kThreads / kLanesPerRow;  // 8
constexpr int kCols = kLanesPerRow * 4;

// Block (column chunk, tile t): y[m, n] = (acc[m, n] + b[n]) s[n] for the tile's rows, and
//   partial_mean[t, n], partial_m2[t, n] = mean and sum of squared deviations of y[m, n] over them
// (each thread shifts by its first value, then threads are Chan-merged in a fixed order).
__global__ void __launch_bounds__(kThreads) bias_scale_moments_kernel(BiasScaleMomentsArgs p) {
  __shared__ float merged[3][kRowsPerPass][kCols];
  const int lane = threadIdx.x % kLanesPerRow, row_in_pass = threadIdx.x / kLanesPerRow;
  const int col = blockIdx.x * kCols + lane * 4;
  const int64_t row_begin = int64_t(blockIdx.y) * p.tile_rows;
  const int64_t row_end = min(int64_t(p.M), row_begin + p.tile_rows);

  float shift[4] = {}, sum1[4] = {}, sum2[4] = {}, count = 0.f;
  if (col < p.N) {
    float b[4], s[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) b[i] = p.bias ? p.bias[col + i] : 0.f, s[i] = p.scale ? p.scale[col + i] : 1.f;
    for (int64_t r = row_begin + row_in_pass; r < row_end; r += kRowsPerPass) {
      const float4 a4 = *reinterpret_cast<const float4*>(p.acc + r * p.N + col);
      const float v[4] = {(a4.x + b[0]) * s[0], (a4.y + b[1]) * s[1], (a4.z + b[2]) * s[2], (a4.w + b[3]) * s[3]};
      if (count == 0.f) {
#pragma unroll
        for (int i = 0; i < 4; ++i) shift[i] = v[i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float d = v[i] - shift[i];
        sum1[i] += d;
        sum2[i] = fmaf(d, d, sum2[i]);
      }
      count += 1.f;
      *reinterpret_cast<float4*>(p.y + r * p.N + col) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float mean_offset = count > 0.f ? sum1[i] / count : 0.f;
    merged[0][row_in_pass][lane * 4 + i] = count;
    merged[1][row_in_pass][lane * 4 + i] = count > 0.f ? shift[i] + mean_offset : 0.f;
    merged[2][row_in_pass][lane * 4 + i] = fmaxf(fmaf(-sum1[i], mean_offset, sum2[i]), 0.f);
  }
  __syncthreads();
  if (threadIdx.x < kCols) {
    const int c = threadIdx.x, column = blockIdx.x * kCols + c;
    float n = merged[0][0][c], mean = merged[1][0][c], m2 = merged[2][0][c];
    for (int r = 1; r < kRowsPerPass; ++r) chan_merge(n, mean, m2, merged[0][r][c], merged[1][r][c], merged[2][r][c]);
    if (column < p.N) {
      const int64_t at = int64_t(blockIdx.y) * p.N + column;
      p.partial_mean[at] = mean;
      p.partial_m2[at] = m2;
    }
  }
  if (p.batches_tracked && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.batches_tracked += 1;
}

}  // namespace

Status bias_scale_moments(const BiasScaleMomentsArgs& a, cudaStream_t stream) {
  if (a.M < 1 || a.N < 1 || a.tile_rows < 1) return Status::invalid("M, N and tile_rows must be positive");
  if (a.N % 4 != 0) return Status::invalid("N must be a multiple of 4 (16-byte rows)");
  if (!a.acc || !a.y || !a.partial_mean || !a.partial_m2) return Status::invalid("acc, y and partials are required");
  if (!is_aligned16(a.acc) || !is_aligned16(a.y)) return Status::invalid("acc and y must be 16-byte aligned");
  const int64_t tiles = (int64_t(a.M) + a.tile_rows - 1) / a.tile_rows;
  if (tiles > 65535) return Status::invalid("too many row tiles for one launch (M / tile_rows > 65535)");
  dim3 grid((a.N + kCols - 1) / kCols, static_cast<unsigned>(tiles));
  bias_scale_moments_kernel<<<grid, kThreads, 0, stream>>>(a);
  return Status::from_cuda(cudaGetLastError(), "launching bias_scale_moments");
}

}  // namespace gemmbn
