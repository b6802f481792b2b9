// The GEMMs' operands where the reduction runs down the columns (the backward's dW = dz^T x in fp32 "highest" and
// TF32): a tiled transpose through shared memory, so that both the reads and the writes are coalesced (PyTorch's
// strided copy of a transposed view ran at about a third of the bandwidth; perf/NOTES.md v13). The split GEMM's row
// scales of dz and dz^T come with it (the rows' and columns' maxima), instead of two passes of their own (v16).
#include <utility>

#include "gemmbn/api.h"

namespace gemmbn {
namespace {

constexpr int kTile = 32;                 // a 32 x 32 tile per block pass
constexpr int kThreads = 256;             // 32 columns x 8 rows of threads (a warp per tile row),
constexpr int kWarps = kThreads / kTile;
constexpr int kRowsPerThread = kTile / kWarps;  // 4 rows each
constexpr int kGroup = 4;  // a block walks kGroup x kGroup tiles: one atomic per row and per column of the group

// out[c, r] = in[r, c] for r < rows, 0 for rows <= r < out_columns (the zero padding); with the maxima, the bits of
// max_c |in[r, c]| and max_r |in[r, c]| (fmaxf: NaN dropped, as row_scales and split_weight drop it). A thread keeps
// the maxima of the in column it loads and of the in row it stores in registers; the 8 warps' are merged through
// shared memory once per column tile and once per group (atomics per tile, or shuffles per tile, cost more than
// the transpose itself: perf/NOTES.md, v16).
__global__ void __launch_bounds__(kThreads) transpose_padded_kernel(TransposePaddedArgs a) {
  __shared__ float tile[kTile][kTile + 1];  // +1: the transposed reads fall in distinct banks
  __shared__ float warp_maxima[kGroup][kWarps][kTile];
  const int tx = static_cast<int>(threadIdx.x) % kTile, ty = static_cast<int>(threadIdx.x) / kTile;
  const bool maxima = a.row_max_bits != nullptr;  // with column_max_bits (transpose_padded checks)
  const int64_t row_tiles = (a.out_columns + kTile - 1) / kTile, col_tiles = (a.cols + kTile - 1) / kTile;
  const int64_t row_groups = (row_tiles + kGroup - 1) / kGroup, col_groups = (col_tiles + kGroup - 1) / kGroup;
  for (int64_t g = blockIdx.x; g < row_groups * col_groups; g += gridDim.x) {  // uniform across the block
    const int64_t first_row_tile = g % row_groups * kGroup, first_col_tile = g / row_groups * kGroup;
    float row_max[kGroup] = {};  // of in row (first_row_tile + i) 32 + tx over the group's columns
    for (int j = 0; j < kGroup && first_col_tile + j < col_tiles; ++j) {
      const int64_t c0 = (first_col_tile + j) * kTile;
      float column_max = 0.f;  // of in column c0 + tx over the group's rows
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        if (first_row_tile + i >= row_tiles) break;  // uniform
        const int64_t r0 = (first_row_tile + i) * kTile;
        float v[kRowsPerThread];
#pragma unroll
        for (int k = 0; k < kRowsPerThread; ++k) {
          const int64_t r = r0 + ty + k * kWarps, c = c0 + tx;
          v[k] = r < a.rows && c < a.cols ? a.in[r * a.cols + c] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < kRowsPerThread; ++k) {
          tile[ty + k * kWarps][tx] = v[k];
          column_max = fmaxf(column_max, fabsf(v[k]));
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kRowsPerThread; ++k) {
          const int64_t c = c0 + ty + k * kWarps, r = r0 + tx;
          const float w = tile[tx][ty + k * kWarps];
          row_max[i] = fmaxf(row_max[i], fabsf(w));
          if (c < a.cols && r < a.out_columns) a.out[c * a.out_columns + r] = w;
        }
        __syncthreads();  // the tile is refilled by the next pass
      }
      if (maxima) {  // the column tile's maxima over the group's rows: the 8 warps merged
        warp_maxima[0][ty][tx] = column_max;
        __syncthreads();
        if (ty == 0 && c0 + tx < a.cols) {
          float m = warp_maxima[0][0][tx];
          for (int w = 1; w < kWarps; ++w) m = fmaxf(m, warp_maxima[0][w][tx]);
          atomicMax(a.column_max_bits + c0 + tx, __float_as_uint(m));
        }
        __syncthreads();
      }
    }
    if (maxima) {  // the group's rows' maxima over its columns: warp ty merges row tile ty's
#pragma unroll
      for (int i = 0; i < kGroup; ++i) warp_maxima[i][ty][tx] = row_max[i];
      __syncthreads();
      const int64_t r = (first_row_tile + ty) * kTile + tx;
      if (ty < kGroup && first_row_tile + ty < row_tiles && r < a.rows) {
        float m = warp_maxima[ty][0][tx];
        for (int w = 1; w < kWarps; ++w) m = fmaxf(m, warp_maxima[ty][w][tx]);
        atomicMax(a.row_max_bits + r, __float_as_uint(m));
      }
      __syncthreads();
    }
  }
}

}  // namespace

Status transpose_padded(const TransposePaddedArgs& a, cudaStream_t stream) {
  if (a.rows < 1 || a.cols < 1) return Status::invalid("rows and cols must be positive");
  if (a.out_columns < a.rows) return Status::invalid("out_columns must be at least rows");
  if (!a.in || !a.out) return Status::invalid("in and out are required");
  if ((a.row_max_bits == nullptr) != (a.column_max_bits == nullptr)) {
    return Status::invalid("row_max_bits and column_max_bits go together");
  }
  for (auto [maxima, count] : {std::pair{a.row_max_bits, a.rows}, std::pair{a.column_max_bits, a.cols}}) {
    if (!maxima) continue;
    if (cudaError_t e = cudaMemsetAsync(maxima, 0, sizeof(unsigned) * count, stream); e != cudaSuccess) {
      return Status::from_cuda(e, "zeroing transpose_padded's maxima");
    }
  }
  const int64_t row_groups = ((a.out_columns + kTile - 1) / kTile + kGroup - 1) / kGroup;
  const int64_t groups = row_groups * (((a.cols + kTile - 1) / kTile + kGroup - 1) / kGroup);
  const unsigned blocks = static_cast<unsigned>(groups < (1 << 20) ? groups : (1 << 20));
  transpose_padded_kernel<<<blocks, kThreads, 0, stream>>>(a);
  return Status::from_cuda(cudaGetLastError(), "launching transpose_padded");
}

}  // namespace gemmbn
