// The split GEMM's operands: W's scaled fp16 pairs (once per weight version, python/gemmbn/weight_cache.py),
// x's per-row scales (every call, from gemm_scale_stats; with x's own pairs on presplit rows) and the backward's
// pairs of a transposed operand.
#include <cuda_fp16.h>

#include "gemmbn/api.h"
#include "gemmbn/elementwise.cuh"
#include "gemmbn/f16_split.cuh"

namespace gemmbn {
namespace {

constexpr int kThreads = 256;
constexpr int kVectorsPerTile = split::kTileK / 4;  // float4 loads per k-tile of a row

// The mainloop's register order (split_f16x3_mainloop.hpp): columns 4q..4q+3 of a slice sit at positions
// 2q, 2q+1 (first pair) and 2q+8, 2q+9 (second pair).
constexpr bool pairs_follow_slice_order() {
  for (int q = 0; q < 4; ++q) {
    for (int j = 0; j < 2; ++j) {
      if (split::slice_column(2 * q + j) != 4 * q + j || split::slice_column(2 * q + 8 + j) != 4 * q + 2 + j) {
        return false;
      }
    }
  }
  return true;
}
static_assert(pairs_follow_slice_order(), "split_weight's pairs and split::slice_column disagree");

__device__ float block_max(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, scratch[w]);
  return v;
}

// 2^e t[0, K) -> (hi, lo) pairs in the mainloop's order into out (split_columns(K) fp16), a k-slice (16 columns: hi
// words 8 s' .. 8 s' + 7 of its k-tile, lo 16 words on) per thread: it trades half its words with its lane partner, the
// tile's other slice, so that each store instruction writes whole 32-byte sectors (faster than a float4 per thread
// with 4-byte stores: perf/NOTES.md v41).
__device__ void split_by_slices(const float* row, int K, float scale, uint4* out) {
  static_assert(split::kSlices == 2 && split::kSliceK == 16, "a lane pair holds one k-tile, a float4 quad per slice");
  const int vectors = K / 4;
  const int slices = static_cast<int>(split::split_columns(K) / split::kSliceK / 2);  // k-tiles x kSlices
  const bool second = threadIdx.x % 2;  // the tile's second slice; its partner is lane ^ 1
  // Block-uniform trips: every lane of a warp shuffles the same number of times.
  for (int base = 0; base < slices; base += kThreads) {
    const int i = base + threadIdx.x;  // slice, so k-tile i / 2; the pair's lanes are in or out together
    uint32_t hi[8], lo[8];  // words 8 (i % 2) + w of the tile: columns 4q, 4q + 1 at w = q, 4q + 2, 4q + 3 at q + 4
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int vector = 4 * i + q;
      const float4 v = i < slices && vector < vectors ? reinterpret_cast<const float4*>(row)[vector]
                                                      : make_float4(0.f, 0.f, 0.f, 0.f);
      split::split_pair(v.x * scale, v.y * scale, hi[q], lo[q]);
      split::split_pair(v.z * scale, v.w * scale, hi[q + 4], lo[q + 4]);
    }
    // Each lane keeps the four words of each half it stores itself and sends its partner the four that lane stores:
    // uint4 j of a half holds words 4j .. 4j + 3, the first slice's 0-3 and 4-7 at j = 0, 1, the second's at 2, 3.
    uint32_t hi_kept[4], lo_kept[4], hi_got[4], lo_got[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      hi_kept[w] = second ? hi[w + 4] : hi[w];  // selects, not a computed index: the arrays stay in registers
      lo_kept[w] = second ? lo[w + 4] : lo[w];
      hi_got[w] = __shfl_xor_sync(0xffffffff, second ? hi[w] : hi[w + 4], 1);
      lo_got[w] = __shfl_xor_sync(0xffffffff, second ? lo[w] : lo[w + 4], 1);
    }
    if (i >= slices) continue;
    uint4* tile = out + (i / 2) * 8;  // 8 uint4 per k-tile: hi words 0-15, lo words 16-31
    const uint4 hi_own = make_uint4(hi_kept[0], hi_kept[1], hi_kept[2], hi_kept[3]);
    const uint4 hi_partner = make_uint4(hi_got[0], hi_got[1], hi_got[2], hi_got[3]);
    const uint4 lo_own = make_uint4(lo_kept[0], lo_kept[1], lo_kept[2], lo_kept[3]);
    const uint4 lo_partner = make_uint4(lo_got[0], lo_got[1], lo_got[2], lo_got[3]);
    // The pair writes uint4s 0, 1 (the first slice's words) then 2, 3: one 32-byte sector per store instruction.
    tile[second] = second ? hi_partner : hi_own;
    tile[2 + second] = second ? hi_own : hi_partner;
    tile[4 + second] = second ? lo_partner : lo_own;
    tile[6 + second] = second ? lo_own : lo_partner;
  }
}

// One block's row t[0, K): s = 2^e from max_k |t[k]|, then 2^e t -> (hi, lo) pairs in the mainloop's order into
// out (split_columns(K) fp16); returns s and 1/s to every thread.
__device__ void split_row(const float* row, int K, __half* out_row, float* scratch, float& scale, float& unscale) {
  const int vectors = K / 4;
  float max_abs = 0.f;
  for (int i = threadIdx.x; i < vectors; i += kThreads) {
    const float4 v = reinterpret_cast<const float4*>(row)[i];
    max_abs = fmaxf(max_abs, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  split::pow2_scale(block_max(max_abs, scratch), scale, unscale);
  split_by_slices(row, K, scale, reinterpret_cast<uint4*>(out_row));
}

// One block per row n: weight_unscale[n] = 2^-b[n] and 2^b[n] W[n, :] as pairs (split_row).
__global__ void __launch_bounds__(kThreads) split_weight_kernel(SplitWeightArgs a) {
  __shared__ float scratch[kThreads / 32];
  const int n = blockIdx.x;
  float scale, unscale;
  split_row(a.weight + static_cast<int64_t>(n) * a.K, a.K,
            static_cast<__half*>(a.weight_split) + n * split::split_columns(a.K), scratch, scale, unscale);
  if (threadIdx.x == 0) a.weight_unscale[n] = unscale;
}

// One block per row m of row_scale_count(M): x_scale[m] = 2^a[m] and 2^a[m] x[m, :] as pairs (split_row); 1 on the
// padding rows.
__global__ void __launch_bounds__(kThreads) split_rows_kernel(RowScalesArgs a) {
  __shared__ float scratch[kThreads / 32];
  const int m = blockIdx.x;
  if (m >= a.M) {
    if (threadIdx.x == 0) a.x_scale[m] = 1.f;
    return;
  }
  float scale, unscale;
  split_row(a.x + static_cast<int64_t>(m) * a.K, a.K,
            static_cast<__half*>(a.x_split) + m * split::split_columns(a.K), scratch, scale, unscale);
  if (threadIdx.x == 0) a.x_scale[m] = scale;
}

constexpr int kRowsPerBlock = kThreads / 32;  // a warp per row
constexpr int kRowUnroll = 4;                  // float4 loads in flight per lane

// x_scale[m] as row_scales_kernel makes it, from maxima already known (transpose_padded's).
__global__ void __launch_bounds__(kThreads) scales_of_maxima_kernel(RowScalesArgs a) {
  const int64_t m = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (m >= split::row_scale_count(a.M)) return;
  float scale = 1.f, unscale;
  if (m < a.M) split::pow2_scale(__uint_as_float(a.row_max_bits[m]), scale, unscale);
  a.x_scale[m] = scale;
}

// x_scale[m] = 2^a[m] with max_k |x[m, k]| 2^a in [2^14, 2^15) (split::pow2_scale); 1 on the padding rows.
__global__ void __launch_bounds__(kThreads) row_scales_kernel(RowScalesArgs a) {
  const int64_t m = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (m >= split::row_scale_count(a.M)) return;
  if (m >= a.M) {
    if (lane == 0) a.x_scale[m] = 1.f;
    return;
  }
  const float4* row = reinterpret_cast<const float4*>(a.x + m * a.K);
  const int vectors = a.K / 4;
  float max_abs = 0.f;
  for (int i0 = lane; i0 < vectors; i0 += 32 * kRowUnroll) {
    float4 v[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int i = i0 + 32 * u;
      v[u] = i < vectors ? row[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      max_abs = fmaxf(max_abs, fmaxf(fmaxf(fabsf(v[u].x), fabsf(v[u].y)), fmaxf(fabsf(v[u].z), fabsf(v[u].w))));
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffff, max_abs, offset));
  float scale, unscale;
  split::pow2_scale(max_abs, scale, unscale);
  if (lane == 0) a.x_scale[m] = scale;
}

// Pass 1 of split_columns: bits[c] = max over this block's rows of |t[r, c]| (max of bits: non-negative floats order
// as their bits; fmaxf drops NaN, as split_weight's block_max does). Block: 32 float4 column groups x 8 row phases.
constexpr int kMaxColumns = 128, kMaxRowsPerBlock = 128, kMaxPhases = kThreads / 32;
__global__ void __launch_bounds__(kThreads) column_max_kernel(SplitColumnsArgs a) {
  __shared__ float partial[kMaxPhases][kMaxColumns];
  const int c = blockIdx.y * kMaxColumns + 4 * threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.x) * kMaxRowsPerBlock;
  float4 m = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c < a.C) {
#pragma unroll 4
    for (int i = threadIdx.y; i < kMaxRowsPerBlock; i += kMaxPhases) {
      if (r0 + i >= a.R) break;
      const float4 v = *reinterpret_cast<const float4*>(a.t + (r0 + i) * a.C + c);
      m = make_float4(fmaxf(m.x, fabsf(v.x)), fmaxf(m.y, fabsf(v.y)), fmaxf(m.z, fabsf(v.z)), fmaxf(m.w, fabsf(v.w)));
    }
  }
  *reinterpret_cast<float4*>(&partial[threadIdx.y][4 * threadIdx.x]) = m;
  __syncthreads();
  const int column = threadIdx.y * 32 + threadIdx.x;  // this thread's column of the block for the merge
  if (column >= kMaxColumns || blockIdx.y * kMaxColumns + column >= a.C) return;
  float v = partial[0][column];
  for (int p = 1; p < kMaxPhases; ++p) v = fmaxf(v, partial[p][column]);
  atomicMax(a.column_max_bits + blockIdx.y * kMaxColumns + column, __float_as_uint(v));
}

// Word w < 16 of a split row's k-tile holds hi of its k-positions k0, k0 + 1 (word 16 + w their lo): the inverse of
// split_weight_kernel's order. Generic in the integer type: an unsigned w spares the signed divisions' fix-ups.
template <class Int>
__host__ __device__ constexpr Int word_k0(Int w) { return 4 * (4 * (w / 8) + w % 4) + 2 * ((w / 4) % 2); }

// The split kernels' column scales 2^b[c0 + col] for a tile's `Columns` columns into shared memory (1 past C), and
// unscale = 2^-b from the first row tile's blocks; loaded with the tile: read after the barrier, they were a second
// round trip to memory per block (perf/NOTES.md, v16).
template <int Columns>
__device__ __forceinline__ void load_column_scales(SplitColumnsArgs const& a, int c0, float (&column_scale)[Columns]) {
  static_assert(Columns <= kThreads, "a thread per column");
  const int col = threadIdx.x;
  if (col >= Columns) return;
  float scale = 1.f, unscale;
  if (c0 + col < a.C) {
    split::pow2_scale(__uint_as_float(a.column_max_bits[c0 + col]), scale, unscale);
    if (blockIdx.x == 0) a.unscale[c0 + col] = unscale;
  }
  column_scale[col] = scale;
}

// Pass 2: a 32-row (one k-tile of the split) x 128-column tile of t through shared memory, written as the k-tile of
// 128 rows of split_weight's output (word_k0's order). Four float4 loads per thread, all issued before the tile's
// shared-memory stores; a job per (output row, quad q) writes words 4q..4q+3 (hi, then lo) as two 16-byte stores,
// which 64-column tiles with 4-byte loads and stores were too slow for (perf/NOTES.md v17).
constexpr int kSplitTileColumns = 128;
constexpr int kSplitTileStride = kSplitTileColumns + 4;  // float4 rows stay 16-byte aligned
__global__ void __launch_bounds__(kThreads) split_columns_kernel(SplitColumnsArgs a) {
  __shared__ __align__(16) float tile[split::kTileK][kSplitTileStride];
  __shared__ float column_scale[kSplitTileColumns];
  const int64_t r0 = int64_t(blockIdx.x) * split::kTileK;
  const int c0 = blockIdx.y * kSplitTileColumns;
  load_column_scales(a, c0, column_scale);
  constexpr int kVectorsPerRow = kSplitTileColumns / 4, kRowsPerStep = kThreads / kVectorsPerRow;
  const int vector = threadIdx.x % kVectorsPerRow;
  float4 v[split::kTileK / kRowsPerStep];
#pragma unroll
  for (int i = 0; i < split::kTileK / kRowsPerStep; ++i) {
    const int64_t r = r0 + threadIdx.x / kVectorsPerRow + i * kRowsPerStep;
    const int c = c0 + 4 * vector;  // C % 4 == 0: a vector is wholly inside or outside
    v[i] = r < a.R && c < a.C ? *reinterpret_cast<const float4*>(a.t + r * a.C + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int i = 0; i < split::kTileK / kRowsPerStep; ++i) {
    *reinterpret_cast<float4*>(&tile[threadIdx.x / kVectorsPerRow + i * kRowsPerStep][4 * vector]) = v[i];
  }
  __syncthreads();
  const int64_t words_per_row = split::split_columns(a.R) / 2;
  constexpr int kWords = split::kTileK / 2;  // hi words per row and k-tile
#pragma unroll
  for (int job = threadIdx.x; job < kSplitTileColumns * 4; job += kThreads) {
    const int j = job / 4, q = job % 4;  // row c0 + j of the output, its words 4q .. 4q + 3
    if (c0 + j >= a.C) continue;
    const float scale = column_scale[j];
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const unsigned k0 = word_k0(4u * q + t);
      split::split_pair(tile[k0][j] * scale, tile[k0 + 1][j] * scale, hi[t], lo[t]);
    }
    uint32_t* row = static_cast<uint32_t*>(a.split) + (c0 + j) * words_per_row + int64_t(blockIdx.x) * split::kTileK;
    *reinterpret_cast<uint4*>(row + 4 * q) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(row + kWords + 4 * q) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
}

// word_k0 inverts split_weight_kernel's placement of columns 4 i + 2 p (+1).
constexpr bool split_columns_follows_split_weight() {
  for (int i = 0; i < kVectorsPerTile; ++i) {
    for (int p = 0; p < 2; ++p) {
      const int w = (i / 4) * split::kSliceK / 2 + i % 4 + 4 * p;  // split_weight_kernel's hi_at within the tile
      if (word_k0(w) != 4 * i + 2 * p) return false;
    }
  }
  return true;
}
static_assert(split_columns_follows_split_weight(), "split_columns and split_weight order a k-tile differently");

}  // namespace

int64_t split_weight_columns(int K) { return split::split_columns(K); }
int64_t row_scale_count(int M) { return split::row_scale_count(M); }

Status row_scales(const RowScalesArgs& a, cudaStream_t stream) {
  if (a.M < 1 || a.K < 1) return Status::invalid("M and K must be positive");
  if (a.K % 4 != 0) return Status::invalid("K must be a multiple of 4 (16-byte rows of float32)");
  if (!a.x || !a.x_scale) return Status::invalid("x and x_scale are required");
  if (!is_aligned16(a.x) || !is_aligned16(a.x_scale)) return Status::invalid("x and x_scale must start on a 16-byte boundary");
  if (a.x_split && !is_aligned16(a.x_split)) return Status::invalid("x_split must start on a 16-byte boundary");
  const int64_t rows = split::row_scale_count(a.M);
  if (a.x_split) {
    split_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(a);
    return Status::from_cuda(cudaGetLastError(), "launching row_scales (x split too)");
  }
  if (a.row_max_bits) {
    scales_of_maxima_kernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
    return Status::from_cuda(cudaGetLastError(), "launching row_scales (known maxima)");
  }
  row_scales_kernel<<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, stream>>>(a);
  return Status::from_cuda(cudaGetLastError(), "launching row_scales");
}

Status split_columns(const SplitColumnsArgs& a, cudaStream_t stream) {
  if (a.R < 1 || a.C < 1) return Status::invalid("R and C must be positive");
  if (a.C % 4 != 0) return Status::invalid("C must be a multiple of 4 (16-byte rows of float32)");
  if (!a.t || !a.column_max_bits || !a.split || !a.unscale) return Status::invalid("t, column_max_bits, split and unscale are required");
  if (!is_aligned16(a.t) || !is_aligned16(a.split)) return Status::invalid("t and split must start on a 16-byte boundary");
  if (cudaError_t e = cudaMemsetAsync(a.column_max_bits, 0, sizeof(unsigned) * a.C, stream); e != cudaSuccess) {
    return Status::from_cuda(e, "zeroing split_columns's column maxima");
  }
  const dim3 max_grid((a.R + kMaxRowsPerBlock - 1) / kMaxRowsPerBlock, (a.C + kMaxColumns - 1) / kMaxColumns);
  column_max_kernel<<<max_grid, dim3(32, kMaxPhases), 0, stream>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return Status::from_cuda(e, "launching column_max");
  const unsigned row_tiles = static_cast<unsigned>((a.R + split::kTileK - 1) / split::kTileK);
  split_columns_kernel<<<dim3(row_tiles, (a.C + kSplitTileColumns - 1) / kSplitTileColumns), kThreads, 0, stream>>>(a);
  return Status::from_cuda(cudaGetLastError(), "launching split_columns");
}

Status split_weight(const SplitWeightArgs& a, cudaStream_t stream) {
  if (a.N < 1 || a.K < 1) return Status::invalid("N and K must be positive");
  if (a.K % 4 != 0) return Status::invalid("K must be a multiple of 4 (16-byte rows of float32)");
  if (!a.weight || !a.weight_split || !a.weight_unscale) return Status::invalid("weight, weight_split and weight_unscale are required");
  if (!is_aligned16(a.weight) || !is_aligned16(a.weight_split)) return Status::invalid("weight and weight_split must start on a 16-byte boundary");
  split_weight_kernel<<<a.N, kThreads, 0, stream>>>(a);
  return Status::from_cuda(cudaGetLastError(), "launching split_weight");
}

}  // namespace gemmbn
