// Finish the batch statistics from the per-tile partials, update the running statistics, normalize.
//
// One cooperative launch in two phases separated by a grid-wide barrier (three with partials_from_y):
//   0. partials from y (where the GEMM ran without its statistics node): per work item of phase 2, the item's
//      rows' mean and M2 per column, and num_batches_tracked incremented;
//      (the product variant: the buffer holds x W^T alone, cuBLAS's, and every read of it forms y = (v + b) s
//      rounded to T, the value the training GEMM's epilogue would have stored)
//   1. statistics: each column's partials are merged once (not once per block), in one read, its mean
//      and invstd saved, its running statistics updated and phase 2's factors alpha and delta written;
//   2. normalize: the blocks stream rows of y through out = y * alpha[n] + delta[n], walking their work items
//      statically or, at large launches, claiming them one pass of rows at a time (normalize_rows).
// The training forward may run phases 1 and 2 as the dataflow walk instead (finish_dataflow_kernel): no barrier, each
// column's statistics and each stripe's rows taken as soon as the GEMM running beside it has stored them.
// Phase 1 merges each column once because merging a block's columns in every block (the blocks sharing a column
// stripe each re-reading its tile partials) left DRAM idle during that prologue. Tried and dropped (perf/NOTES.md
// v6-v7, v23, v27): streaming the array flat, a bottom-up sweep of phase 2 to reread the GEMM's last rows from L2, an
// L2 or register prefetch of each block's first rows before phase 1, a programmatic dependent launch. Where the time
// goes against a device copy: perf/finish_patterns.cu.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "gemmbn/api.h"
#include "gemmbn/cooperative_launch.cuh"
#include "gemmbn/device_info.h"
#include "gemmbn/elementwise.cuh"
#include "gemmbn/switches.h"
#include "gemmbn/tile_flow.h"
#include "gemmbn/work_items.h"

namespace gemmbn {
namespace {

namespace cg = cooperative_groups;

constexpr int kUnroll = 8;                             // independent 16-byte loads in flight per thread
// Phase 1 takes a block per group of 16 columns (64 bytes of a tile row), and of fewer where N is small
// enough for 256 groups at most (a block each on an H100/H200: 3 blocks x 132 SMs resident): 8 columns
// (a 32-byte sector) up to N = 2048, 4 up to N = 1024. Phase 1 is latency-bound where a column has many
// tiles (65536x512->512: 1024), so more threads per column means fewer dependent load rounds. The width
// is chosen by N alone, so the summation order (and the bits) do not depend on the device.
constexpr int kMergeBatch = 8;  // tiles per thread per load round (16 takes 113 registers: 2 blocks per SM)
// The dataflow walk's limits: stripes (its blocks keep the stripe queue in shared memory once it is complete) and the
// narrowest column tile (the workspace holds counters for N / 64 column tiles).
constexpr int kMaxFlowStripes = 1024;
constexpr int kMinFlowTileColumns = 64;
inline int merge_columns_for(int N) { return N <= 1024 ? 4 : N <= 2048 ? 8 : 16; }
// The column stripes of N columns of dtype: kLanesPerRow 16-byte vectors each (the host's count; the kernels' is
// FinishParams::stripes).
inline int64_t stripes_for(DType dtype, int64_t N) {
  const int64_t columns = kLanesPerRow * (16 / dtype_size(dtype));
  return (N + columns - 1) / columns;
}
// The normalize items of the claimed and dataflow walks (a pass of rows of a stripe each), and whether a problem fits
// the dataflow walk: its stripes within kMaxFlowStripes, and its items within half of its int item counter (which
// also takes each block's claims that find nothing).
inline int64_t pass_items(DType dtype, int64_t M, int N) {
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  return stripes_for(dtype, N) * ((M + kPassRows - 1) / kPassRows);
}
inline bool fits_dataflow(DType dtype, int64_t M, int N) {
  return stripes_for(dtype, N) <= kMaxFlowStripes && pass_items(dtype, M, N) <= std::numeric_limits<int>::max() / 2;
}

template <class T>
struct FinishParams {
  const T* y;
  T* out;
  int64_t M;
  int N;
  float* partial_mean;  // written by phase 0 in the y-pass variant, read by phase 1
  float* partial_m2;
  int tiles, tile_rows;
  const T *gamma, *beta;
  T *running_mean, *running_var;
  int64_t* batches_tracked;
  bool cumulative;
  double momentum, eps;
  float *save_mean, *save_invstd;
  int merge_columns;       // columns per phase-1 group: merge_columns_for(N)
  int stripes;             // column stripes of kLanesPerRow vectors
  int64_t rows_per_chunk;  // rows of one normalize work item
  int items;               // stripes x row chunks
  // FinishMode::from_ranks: partial row t holds rank t's moments with its own count (partial_count; rows between
  // partial rows: partial_stride elements). FinishMode::moments: this batch's [3, N] moments out.
  const float* partial_count = nullptr;
  int64_t partial_stride = 0;
  float* moments_out = nullptr;
  // The product variant: y holds x W^T; bias (may be null) and scale make y = (y + bias) scale, written to pre_norm
  // (may alias y; null: not kept) by phase 2.
  const T* bias = nullptr;
  const T* scale = nullptr;
  T* pre_norm = nullptr;
  // Phase 1's per-column factors for phase 2 (the workspace): out = y alpha + delta.
  float* alpha = nullptr;
  float* delta = nullptr;
  // Phase 2's items claimed from this counter, last item first (zeroed by block 0 before the grid barrier), instead of
  // walked statically; null: the static walk (finish_claims_items).
  int* claim_counter = nullptr;
  // The y-pass variants' claimed walk (claim_counter set): of the passes of rows of each of phase 0's items, the first
  // claimed_passes are claimed one at a time (normalize_y_pass_claim), after each block has walked the rest of its own
  // items (y_pass_own_rows). 0 without claims: the blocks walk their whole items.
  int claimed_passes = 0;
  // The dataflow walk (finish_dataflow_kernel): the GEMM's flow counters (tile_flow.h) and its column tiles' width.
  int* flow = nullptr;
  int column_tiles = 0, tile_columns = 0;
  int items_first = 0;  // a block's first claim: 0 a statistics job, 1 a normalize item (finish_dataflow_kernel)
  uint64_t flow_limit_ns = 0;  // how long one of its waits lasts before the launch gives up (0: no limit)
};

// y = (v + b) s rounded to T (fp32 arithmetic, as the GEMM epilogue's): what the product variant reads for a stored v.
template <class T>
__device__ __forceinline__ float product_to_y(float v, float b, float s) {
  return to_float(from_float<T>((v + b) * s));
}

// The product variant's b and s of a thread's V columns starting at vector_col (b = 0 without bias).
template <class T, int V>
__device__ __forceinline__ void load_bias_scale(FinishParams<T> const& p, int vector_col, float (&b)[V], float (&s)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    b[i] = static_cast<float>(load_or(p.bias, vector_col + i, 0.0));
    s[i] = to_float(p.scale[vector_col + i]);
  }
}

// What a launch makes: the normalized output (phase 2, the training forward), this batch's per-column moments
// alone (phase 1's statistics, for a collective between ranks), or the output with the statistics of the ranks'
// gathered moments (the synchronized forward's second launch; issue 19, perf/NOTES.md v18).
enum class FinishMode { normalize, moments, from_ranks };

// Where a merge of column statistics puts phase 2's factors (alpha and delta of the columns from first_column on) and
// whether it publishes the statistics (save_mean, save_invstd, the running statistics: once per column and launch). The
// barrier walks: the workspace's factors of every column, published; finish_local_kernel: its block's stripe, in shared
// memory, published by one block per stripe.
struct ColumnFactors {
  float* alpha;
  float* delta;
  int first_column;
  bool publish;
};
template <class T>
__device__ __forceinline__ ColumnFactors workspace_factors(FinishParams<T> const& p) {
  return {p.alpha, p.delta, 0, true};
}

// Phase 0 (the y-pass variant), per work item (phase 2's: a column stripe x a row chunk of rows_per_chunk = tile_rows
// rows): partial_mean[chunk, n], partial_m2[chunk, n] = mean and M2 of y as stored over the chunk's rows, as the
// GEMM's epilogue makes them per tile. Welford's update per thread over its rows (fp32: stable where the first rows
// lie far out), then Chan's merge of a column's kRowsPerPass threads in a fixed order in fp64, rounded to fp32.
template <class T, bool kProduct>
__device__ void partials_of_y(FinishParams<T> const& p) {
  using Vec = Vector16<T>;
  constexpr int V = Vec::kSize, kCols = kLanesPerRow * V;
  __shared__ float thread_mean[kRowsPerPass][kCols], thread_m2[kRowsPerPass][kCols];
  __shared__ int thread_count[kRowsPerPass];
  const int lane = threadIdx.x % kLanesPerRow, row_in_pass = threadIdx.x / kLanesPerRow;
  for (int item = blockIdx.x; item < p.items; item += gridDim.x) {  // uniform across the block
    const int stripe = item % p.stripes;
    const int64_t chunk = item / p.stripes;
    const int vector_col = stripe * kCols + lane * V;
    const int64_t row_begin = chunk * p.rows_per_chunk, row_end = min(p.M, row_begin + p.rows_per_chunk);
    float mean[V] = {}, m2[V] = {};
    int count = 0;
    if (vector_col < p.N) {
      float bias[V], scale[V];
      if constexpr (kProduct) load_bias_scale(p, vector_col, bias, scale);
      for (int64_t r = row_begin + row_in_pass; r < row_end; r += kRowsPerPass * kUnroll) {
        Vec v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (r + u * kRowsPerPass < row_end) v[u].load(p.y + (r + u * kRowsPerPass) * p.N + vector_col);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (r + u * kRowsPerPass >= row_end) continue;
          const float inverse = 1.f / static_cast<float>(++count);
#pragma unroll
          for (int i = 0; i < V; ++i) {
            float value = v[u].get(i);
            if constexpr (kProduct) value = product_to_y<T>(value, bias[i], scale[i]);
            const float delta = value - mean[i];
            mean[i] = fmaf(delta, inverse, mean[i]);
            m2[i] = fmaf(delta, value - mean[i], m2[i]);
          }
        }
      }
    }
    __syncthreads();  // the previous item's reads of the thread arrays are done
#pragma unroll
    for (int i = 0; i < V; ++i) thread_mean[row_in_pass][lane * V + i] = mean[i], thread_m2[row_in_pass][lane * V + i] = m2[i];
    if (lane == 0) thread_count[row_in_pass] = count;
    __syncthreads();
    const int col = stripe * kCols + static_cast<int>(threadIdx.x);
    if (static_cast<int>(threadIdx.x) < kCols && col < p.N) {
      double n = 0, total_mean = 0, total_m2 = 0;  // Chan's merge, threads in order
      for (int t = 0; t < kRowsPerPass; ++t) {
        const double n_t = thread_count[t];
        if (n_t == 0) continue;
        const double delta = double(thread_mean[t][threadIdx.x]) - total_mean, merged = n + n_t;
        total_mean += delta * (n_t / merged);
        total_m2 += double(thread_m2[t][threadIdx.x]) + delta * delta * (n * n_t / merged);
        n = merged;
      }
      p.partial_mean[chunk * p.N + col] = static_cast<float>(total_mean);
      p.partial_m2[chunk * p.N + col] = static_cast<float>(total_m2);
    }
  }
}

// Phase 1, per column n, from the per-tile partials (n_t rows, mean_t, M2_t) of y, in one read, in fp64:
//   S1 = sum_t n_t (mean_t - c),   S2 = sum_t M2_t + n_t (mean_t - c)^2,   c = mean_0 (tile 0's mean)
//   mean_y = c + S1 / M,   var_y = (S2 - S1^2 / M) / M
// The shift c keeps the subtraction harmless: S2 - S1^2/M = M2 loses a factor 1 + (mean_y - c)^2 / var_y
// of fp64's 1e-16, and since M2 >= n_0 (c - mean_y)^2 (tile 0's share of the spread) that factor is at
// most 1 + M / n_0, the number of tiles: 1e-12 at a million tiles, far below the fp32 partials' own
// rounding. (The previous form, deviations from the final mean, read the partials twice: two
// dependent DRAM rounds.)
// Running stats: r <- (1-f) r + f stat, f = momentum or 1/batches_tracked; var unbiased.
// A block takes merge_columns columns; its kThreads / merge_columns threads per column each sum a strided
// set of tiles with kMergeBatch tiles' loads in flight, then one thread per column adds the lanes' sums in
// a fixed order (the same bits on every run).
// lane_s1, lane_s2: kThreads doubles of shared memory each, [tile lane][column offset].
// from_ranks: n_t is rank t's count, M their sum, c the first mean of a rank with rows (a rank without rows adds
// nothing). moments: the launch writes rows, mean_y and M2 = M var_y instead of the statistics' uses.
// kTailFromY (kRaggedTileFromY, api.h, with the GEMM's partials): partials of the M / tile_rows full row blocks alone;
// the rows after them (fewer than tile_rows: the GEMM's ragged last row block) are read from y, each a term of n_t = 1
// and M2_t = 0 in the lane's sums, and c is y's first row where no row block is full.
template <int merge_columns, FinishMode kMode, bool kTailFromY = false, class T>
__device__ void merge_column_group(FinishParams<T> const& p, int group, double* lane_s1, double* lane_s2,
                                   ColumnFactors factors) {
  constexpr bool kRanks = kMode == FinishMode::from_ranks;
  static_assert(!(kTailFromY && kRanks), "the ranks' moments cover every row");
  constexpr int merge_lanes = kThreads / merge_columns;
  const int column_offset = threadIdx.x % merge_columns, tile_lane = threadIdx.x / merge_columns;
  const int64_t stride = kRanks ? p.partial_stride : int64_t(p.N);
  const int full_tiles = kTailFromY ? static_cast<int>(p.M / p.tile_rows) : 0;  // divided once, not per use
  auto partial_tiles = [&] { return kTailFromY ? full_tiles : p.tiles; };  // merged (p.tiles read as before OFF)
  auto tile_rows = [&](int t) { return static_cast<double>(min(int64_t(p.tile_rows), p.M - int64_t(t) * p.tile_rows)); };
  {
    const int col = group * merge_columns + column_offset;
    const bool valid = col < p.N;
    // The column's uses of its statistics (tile lane 0's), loaded before the partials so that their latency hides
    // behind the merge's instead of following it.
    float gamma = 1.f, beta = 0.f, old_mean = 0.f, old_var = 0.f;
    double f = 0;  // the running statistics' factor
    if constexpr (kMode != FinishMode::moments) {
      if (tile_lane == 0 && valid) {
        gamma = static_cast<float>(load_or(p.gamma, col, 1.0)), beta = static_cast<float>(load_or(p.beta, col, 0.0));
        if (p.running_mean != nullptr && factors.publish) {
          old_mean = to_float(p.running_mean[col]), old_var = to_float(p.running_var[col]);
          f = p.cumulative ? 1.0 / static_cast<double>(*p.batches_tracked) : p.momentum;
        }
      }
    }
    double shift = valid ? p.partial_mean[col] : 0.0;
    if constexpr (kTailFromY) {
      if (partial_tiles() == 0) shift = valid ? static_cast<double>(to_float(p.y[col])) : 0.0;  // no full row block
    }
    if constexpr (kRanks) {
      for (int t = 0; valid && t < p.tiles; ++t) {
        if (p.partial_count[t * stride + col] > 0) {
          shift = p.partial_mean[t * stride + col];
          break;
        }
      }
    }
    double s1 = 0, s2 = 0;
    for (int t0 = tile_lane; t0 < partial_tiles(); t0 += merge_lanes * kMergeBatch) {
      float mean_t[kMergeBatch], m2_t[kMergeBatch];
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const int t = t0 + j * merge_lanes;
        const bool in = valid && t < partial_tiles();
        mean_t[j] = in ? p.partial_mean[int64_t(t) * stride + col] : 0.f;
        m2_t[j] = in ? p.partial_m2[int64_t(t) * stride + col] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const int t = t0 + j * merge_lanes;
        if (t >= partial_tiles()) continue;
        const double n_t = kRanks ? double(p.partial_count[int64_t(t) * stride + col]) : tile_rows(t);
        const double deviation = mean_t[j] - shift;
        s1 = fma(n_t, deviation, s1);
        s2 += fma(n_t * deviation, deviation, double(m2_t[j]));
      }
    }
    if constexpr (kTailFromY) {
      for (int64_t r = int64_t(partial_tiles()) * p.tile_rows + tile_lane; valid && r < p.M; r += merge_lanes) {
        const double deviation = static_cast<double>(to_float(p.y[r * p.N + col])) - shift;
        s1 += deviation;
        s2 = fma(deviation, deviation, s2);
      }
    }
    lane_s1[threadIdx.x] = s1;  // threadIdx.x = tile_lane * merge_columns + column_offset
    lane_s2[threadIdx.x] = s2;
    __syncthreads();
    if (tile_lane == 0 && valid) {
      double total1 = 0, total2 = 0;  // fixed order
#pragma unroll
      for (int lane = 0; lane < merge_lanes; ++lane) {
        total1 += lane_s1[lane * merge_columns + column_offset], total2 += lane_s2[lane * merge_columns + column_offset];
      }
      double rows = static_cast<double>(p.M);
      if constexpr (kRanks) {
        rows = 0;
        for (int t = 0; t < p.tiles; ++t) rows += p.partial_count[t * stride + col];  // rank order
      }
      const double mean = shift + total1 / rows;
      const double var_y = fmax(total2 - total1 * (total1 / rows), 0.0) / rows;
      if constexpr (kMode == FinishMode::moments) {
        p.moments_out[col] = static_cast<float>(rows);
        p.moments_out[p.N + col] = static_cast<float>(mean);
        p.moments_out[2 * p.N + col] = static_cast<float>(var_y * rows);
      } else {
        const float mean32 = static_cast<float>(mean), invstd32 = static_cast<float>(1.0 / sqrt(var_y + p.eps));
        // phase 2's factors, from the saved statistics: alpha = gamma invstd, delta = beta - mean alpha (fp32, as
        // PyTorch's BatchNorm forms them)
        const float alpha = gamma * invstd32;
        factors.alpha[col - factors.first_column] = alpha;
        factors.delta[col - factors.first_column] = fmaf(-mean32, alpha, beta);
        if (factors.publish) {
          p.save_mean[col] = mean32;
          p.save_invstd[col] = invstd32;
        }
        if (p.running_mean != nullptr && factors.publish) {
          const double unbiased = var_y * rows / (rows - 1);
          p.running_mean[col] = from_float<T>(static_cast<float>((1 - f) * old_mean + f * mean));
          p.running_var[col] = from_float<T>(static_cast<float>((1 - f) * old_var + f * unbiased));
        }
      }
    }
    __syncthreads();  // lane_s1/lane_s2 are reused by the next group
  }
}

template <int merge_columns, FinishMode kMode, bool kTailFromY, class T>
__device__ void merge_column_statistics(FinishParams<T> const& p, double* lane_s1, double* lane_s2) {
  const int groups = (p.N + merge_columns - 1) / merge_columns;
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {  // uniform across the block
    merge_column_group<merge_columns, kMode, kTailFromY>(p, group, lane_s1, lane_s2, workspace_factors(p));
  }
}

// One column group's statistics by merge_columns (finish_dataflow_kernel's jobs).
template <class T>
__device__ void merge_one_group(FinishParams<T> const& p, int group, double* lane_s1, double* lane_s2) {
  switch (p.merge_columns) {
    case 4: merge_column_group<4, FinishMode::normalize, kRaggedTileFromY>(p, group, lane_s1, lane_s2,
                                                                            workspace_factors(p)); break;
    case 8: merge_column_group<8, FinishMode::normalize, kRaggedTileFromY>(p, group, lane_s1, lane_s2,
                                                                            workspace_factors(p)); break;
    default: merge_column_group<16, FinishMode::normalize, kRaggedTileFromY>(p, group, lane_s1, lane_s2,
                                                                              workspace_factors(p)); break;
  }
}

// Phase 2, per work item (column stripe, row chunk): out[m, n] = y[m, n] alpha[n] + delta[n] (phase 1's factors).
// The item's first pass of y is loaded before its columns' factors, so the two latencies overlap.
// kLastRowsFirst (the y-pass variant): each chunk's rows last first (the walk below takes the items last first), so
// that the first reads find the rows phase 0 read last still in L2 (perf/NOTES.md v18).
// kProduct: y = (v + b) s first (product_to_y), written to pre_norm where kept.
template <class T, bool kLastRowsFirst, bool kProduct>
__device__ __forceinline__ void normalize_span(FinishParams<T> const& p, int stripe, int64_t row_begin, int64_t row_end,
                                               ColumnFactors const& factors) {
  using Vec = Vector16<T>;
  constexpr int V = Vec::kSize, kCols = kLanesPerRow * V;  // columns per stripe
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  const int lane = threadIdx.x % kLanesPerRow, row_in_pass = threadIdx.x / kLanesPerRow;
  const int vector_col = stripe * kCols + lane * V;
  if (vector_col >= p.N || row_begin >= row_end) return;
  const int64_t step = kLastRowsFirst ? -kPassRows : kPassRows;
  const int64_t first = (kLastRowsFirst ? row_begin + (row_end - row_begin - 1) / kPassRows * kPassRows : row_begin) +
                        row_in_pass;
  Vec v[kUnroll];
  auto load_pass = [&](int64_t r) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u * kRowsPerPass < row_end) v[u].load(p.y + (r + u * kRowsPerPass) * p.N + vector_col);
    }
  };
  load_pass(first);
  float alpha[V], delta[V];  // V floats each, 16-byte aligned: vector_col is a multiple of V, alpha and delta of 4
#pragma unroll
  for (int i = 0; i < V; i += 4) {
    const int at = vector_col - factors.first_column + i;
    *reinterpret_cast<float4*>(alpha + i) = *reinterpret_cast<const float4*>(factors.alpha + at);
    *reinterpret_cast<float4*>(delta + i) = *reinterpret_cast<const float4*>(factors.delta + at);
  }
  float bias[V], scale[V];
  if constexpr (kProduct) load_bias_scale(p, vector_col, bias, scale);
  for (int64_t r = first; kLastRowsFirst ? r >= row_begin : r < row_end; r += step) {
    if (r != first) load_pass(r);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t row = r + u * kRowsPerPass;
      if (row >= row_end) continue;
      if constexpr (kProduct) {
#pragma unroll
        for (int i = 0; i < V; ++i) v[u].set(i, product_to_y<T>(v[u].get(i), bias[i], scale[i]));
        if (p.pre_norm != nullptr) v[u].store(p.pre_norm + row * p.N + vector_col);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) v[u].set(i, fmaf(v[u].get(i), alpha[i], delta[i]));
      v[u].store(p.out + row * p.N + vector_col);
    }
  }
}

// Phase 2 on work item `item` (stripe item % stripes, rows of chunk item / stripes), first rows first.
template <class T, bool kProduct>
__device__ __forceinline__ void normalize_item(FinishParams<T> const& p, int item, ColumnFactors const& factors) {
  const int64_t row_begin = item / p.stripes * p.rows_per_chunk;
  normalize_span<T, false, kProduct>(p, item % p.stripes, row_begin, min(p.M, row_begin + p.rows_per_chunk), factors);
}

// The y-pass variants' claimed walk: claim k is pass claimed_passes - 1 - k / items of phase 0's item k % items. So
// the walk takes the last claimed pass of every item first, then the one before: the rows phase 0 read last (every
// block streams its item at once), which are the likeliest still in L2 (perf/NOTES.md v58). A pass past a short last
// chunk's rows is empty.
template <class T, bool kProduct>
__device__ __forceinline__ void normalize_y_pass_claim(FinishParams<T> const& p, int k) {
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  const int item = k % p.items, pass = p.claimed_passes - 1 - k / p.items;
  const int64_t chunk_begin = item / p.stripes * p.rows_per_chunk;
  const int64_t row_begin = chunk_begin + pass * kPassRows;
  const int64_t row_end = min(min(p.M, chunk_begin + p.rows_per_chunk), row_begin + kPassRows);
  normalize_span<T, false, kProduct>(p, item % p.stripes, row_begin, row_end, workspace_factors(p));
}

// The y pass's static walk: each block walks the items it streamed in phase 0, last item and last rows first, from
// pass claimed_passes on (its whole items without claims; before its claims, the unclaimed rest): the rows of y its
// own SM read last, which L2 holds for it more often than for another SM (perf/NOTES.md v18, v58). Nothing where
// every pass is claimed.
template <class T, bool kProduct>
__device__ __forceinline__ void y_pass_own_rows(FinishParams<T> const& p) {
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  if (p.claimed_passes * kPassRows >= p.rows_per_chunk) return;  // uniform
  const int first = static_cast<int>(blockIdx.x), blocks = static_cast<int>(gridDim.x);
  const int last_item = first < p.items ? first + (p.items - 1 - first) / blocks * blocks : -1;
  for (int item = last_item; item >= 0; item -= blocks) {
    const int64_t chunk_begin = item / p.stripes * p.rows_per_chunk;
    normalize_span<T, true, kProduct>(p, item % p.stripes, chunk_begin + p.claimed_passes * kPassRows,
                                      min(p.M, chunk_begin + p.rows_per_chunk), workspace_factors(p));
  }
}

// Phase 2 over every item. Statically, block b takes items b, b + blocks, ... (kLastRowsFirst, the y pass: the same
// items, last first: y_pass_own_rows); with claim_counter, each block claims its next item while the current one
// streams, so a block on an SM with less of the memory bandwidth takes fewer items (the static walk ends on its
// slowest block: perf/NOTES.md v31).
// Claims go last item first: the rows the GEMM wrote last are the likeliest still in L2 (perf/NOTES.md v32); the y
// pass's (kLastRowsFirst) claims are passes, last passes first (normalize_y_pass_claim).
template <class T, bool kLastRowsFirst = false, bool kProduct = false>
__device__ void normalize_rows(FinishParams<T> const& p) {
  if constexpr (kLastRowsFirst) y_pass_own_rows<T, kProduct>(p);  // all of phase 2 without claims
  if (p.claim_counter == nullptr) {
    if constexpr (!kLastRowsFirst) {
      for (int item = static_cast<int>(blockIdx.x); item < p.items; item += static_cast<int>(gridDim.x)) {
        normalize_item<T, kProduct>(p, item, workspace_factors(p));
      }
    }
    return;
  }
  __shared__ int claimed[2];  // alternate slots: a slot is rewritten two claims later, after a barrier
  if (threadIdx.x == 0) claimed[0] = atomicAdd(p.claim_counter, 1);
  __syncthreads();
  int item = claimed[0];
  const int claims = kLastRowsFirst ? p.claimed_passes * p.items : p.items;  // the y pass's (kLastRowsFirst): passes
  for (int k = 1; item < claims; ++k) {  // uniform across the block
    if (threadIdx.x == 0) claimed[k & 1] = atomicAdd(p.claim_counter, 1);
    if constexpr (kLastRowsFirst) {
      normalize_y_pass_claim<T, kProduct>(p, item);
    } else {
      normalize_item<T, kProduct>(p, p.items - 1 - item, workspace_factors(p));
    }
    __syncthreads();
    item = claimed[k & 1];
  }
}

// finish_normalize: [phase 0 (partials from y), grid barrier,] phase 1 (column statistics), grid barrier, phase 2
// (normalize; FinishMode::moments stops after phase 1). Cooperative launch. kProduct: the product variant.
template <class T, bool kFromY = false, FinishMode kMode = FinishMode::normalize, bool kProduct = false>
__global__ void __launch_bounds__(kThreads) finish_normalize_kernel(FinishParams<T> p) {
  static_assert(!(kFromY && kMode == FinishMode::from_ranks), "the ranks' moments are the partials");
  static_assert(!kProduct || (kFromY && kMode == FinishMode::normalize), "the product variant makes its partials");
  constexpr bool kTailFromY = kRaggedTileFromY && !kFromY && kMode != FinishMode::from_ranks;  // the GEMM's partials
  __shared__ double lane_s1[kThreads], lane_s2[kThreads];
  wait_for_preceding_grids();  // the GEMM's y, partials and batches_tracked (a programmatic launch)
  if constexpr (kFromY) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && p.batches_tracked != nullptr) ++*p.batches_tracked;  // the GEMM did not
    partials_of_y<T, kProduct>(p);
    cg::this_grid().sync();  // orders the partials and the count before phase 1's reads
  }
  switch (p.merge_columns) {
    case 4: merge_column_statistics<4, kMode, kTailFromY>(p, lane_s1, lane_s2); break;
    case 8: merge_column_statistics<8, kMode, kTailFromY>(p, lane_s1, lane_s2); break;
    default: merge_column_statistics<16, kMode, kTailFromY>(p, lane_s1, lane_s2); break;
  }
  if constexpr (kMode == FinishMode::moments) return;  // every block: no phase 2
  if (p.claim_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *p.claim_counter = 0;
  cg::this_grid().sync();  // also orders phase 1's save_mean/save_invstd writes (and the zeroed counter) before phase 2
  normalize_rows<T, /*kLastRowsFirst=*/kFromY, kProduct>(p);
}

// The local walk (finish_merges_locally): the finish without a grid barrier, for the GEMM epilogue's few partials. Per
// work item a block merges the statistics of the item's column stripe itself, from every partial of those columns, into
// shared memory (merge_column_group over one group of the stripe's columns), then normalizes the item's rows; the block
// of the stripe's first row chunk alone saves the statistics and updates the running ones. So every block of a stripe
// reads its partials: cheap where a column has few (M <= 2048 at 128-row tiles), where phase 1 and the grid barrier
// are the barrier walk's fixed cost. The lanes' sums associate otherwise than phase 1's: not its bits, to the ulp.
template <class T>
__global__ void __launch_bounds__(kThreads) finish_local_kernel(FinishParams<T> p) {
  constexpr int kCols = kLanesPerRow * Vector16<T>::kSize;
  __shared__ double lane_s1[kThreads], lane_s2[kThreads];
  __shared__ __align__(16) float alpha[kCols], delta[kCols];
  wait_for_preceding_grids();  // the GEMM's y, partials and batches_tracked (a programmatic launch)
  for (int item = blockIdx.x; item < p.items; item += gridDim.x) {  // uniform across the block
    const int stripe = item % p.stripes;
    const ColumnFactors factors{alpha, delta, stripe * kCols, /*publish=*/item < p.stripes};  // row chunk 0
    merge_column_group<kCols, FinishMode::normalize, kRaggedTileFromY>(p, stripe, lane_s1, lane_s2,
                                                                      factors);  // ends with a barrier
    normalize_item<T, false>(p, item, factors);
  }
}

// The dataflow walk (train_forward with the GEMM's tile flow, tile_flow.h; perf/NOTES.md v33, v35), launched while the
// GEMM still runs and without a grid barrier. Two kinds of work, each claimed in order from its own counter: statistics
// jobs (job j merges column group j once the GEMM has stored every row tile of the group's column tile; the job that
// finishes a stripe's last group queues the stripe) and normalize items (item k: a pass of rows of the (k / passes)-th
// stripe queued, last rows first). A block holds at most one item: it streams the item once its stripe is queued,
// claims a job while it is not, and waits for the stripe only when every job is claimed. So no wait can deadlock: a
// job waits only for the GEMM, which counts its tiles alone, and an item only once every job is held by a running
// block. A block's first claim is a job (items_first 0: every job is claimed before any item is held, the walk of
// v33-v34) or an item (items_first 1: stripes the GEMM finished early are normalized while it still runs).
// Per element the arithmetic is the barrier walk's (merge_column_group, normalize_item): the same bits.
template <class T>
__global__ void __launch_bounds__(kThreads) finish_dataflow_kernel(FinishParams<T> p) {
  constexpr int kCols = kLanesPerRow * Vector16<T>::kSize;
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  enum Step : int { kDone, kJob, kItem };
  __shared__ double lane_s1[kThreads], lane_s2[kThreads];
  __shared__ int step[3], stripe_of[kMaxFlowStripes], queue_complete;  // step: {Step, job or item, the item's stripe}
  int* const flow = p.flow;
  int* const job_claims = flow + TileFlow::kJobClaims;
  int* const item_claims = flow + TileFlow::kItemClaims;
  const int* const tiles_done = TileFlow::tiles_done(flow);
  const int tile_count = TileFlow::kLanes * p.tiles;  // a column tile's count once every row tile is stored
  int* const stripe_groups = TileFlow::stripe_groups(flow, p.column_tiles);
  int* const stripe_queue = TileFlow::stripe_queue(flow, p.column_tiles, p.stripes);
  const int groups_per_tile = p.tile_columns / p.merge_columns, jobs = p.column_tiles * groups_per_tile;
  const int passes = static_cast<int>((p.M + kPassRows - 1) / kPassRows);
  // Thread 0's item: its claim (-1: none held) and its stripe (-1: not queued when last read).
  int held = -1, held_stripe = -1;
  auto read_stripe = [&] {  // thread 0; no wait
    if (held_stripe < 0 && held >= 0 && held < p.items) {
      held_stripe = queue_complete ? stripe_of[held / passes] : flow_load_acquire(stripe_queue + held / passes) - 1;
    }
  };
  auto decide = [&]() -> int {  // thread 0: the block's next step into step[]
    for (;;) {
      read_stripe();
      if (held_stripe >= 0) break;
      if (flow_load_acquire(job_claims) < jobs) {
        const int j = atomicAdd(job_claims, 1);
        if (j < jobs) {
          flow_wait_at_least(tiles_done + j / groups_per_tile, tile_count, p.flow_limit_ns);
          // momentum=None reads batches_tracked, which the GEMM's tile (0, 0) counts: wait for column tile 0 too.
          if (p.cumulative && p.running_mean != nullptr) flow_wait_at_least(tiles_done, tile_count, p.flow_limit_ns);
          flow_fence();
          step[1] = j;
          return kJob;
        }
      }
      if (held < 0) {
        held = atomicAdd(item_claims, 1);
        continue;
      }
      if (held >= p.items) return kDone;
      held_stripe = flow_wait_at_least(stripe_queue + held / passes, 1, p.flow_limit_ns) - 1;  // every job is held
    }
    flow_fence();
    step[1] = held, step[2] = held_stripe;
    return kItem;
  };
  if (threadIdx.x == 0) {
    queue_complete = 0;
    if (p.items_first) held = atomicAdd(item_claims, 1);
  }
  for (;;) {  // uniform across the block
    if (threadIdx.x == 0) step[0] = decide();
    __syncthreads();
    const int what = step[0], index = step[1], stripe = step[2];
    __syncthreads();  // step is rewritten by the next decision
    if (what == kDone) break;
    if (what == kJob) {
      merge_one_group(p, index, lane_s1, lane_s2);  // ends with a barrier: the group's writes precede what follows
      if (threadIdx.x == 0 && index * p.merge_columns < p.N) {
        const int queued = index * p.merge_columns / kCols;
        const int stripe_columns = min(kCols, p.N - queued * kCols);
        const int groups_in_stripe = (stripe_columns + p.merge_columns - 1) / p.merge_columns;
        flow_fence();
        if (atomicAdd(stripe_groups + queued, 1) == groups_in_stripe - 1) {
          flow_fence();
          const int slot = atomicAdd(flow + TileFlow::kStripesQueued, 1);
          flow_store_release(stripe_queue + slot, queued + 1);
        }
      }
      continue;
    }
    if (threadIdx.x == 0) {  // the next item's claim and a look at its stripe, while this one streams
      held = atomicAdd(item_claims, 1), held_stripe = -1;
      read_stripe();
    }
    normalize_item<T, false>(p, (passes - 1 - index % passes) * p.stripes + stripe, workspace_factors(p));
    __syncthreads();
    // Once every stripe is queued, the block copies the queue into shared memory and reads no entry again.
    if (!queue_complete) {  // uniform: read after a barrier, written below after another
      if (threadIdx.x == 0) step[0] = flow_load_acquire(flow + TileFlow::kStripesQueued) == p.stripes;
      __syncthreads();
      if (step[0]) {  // every slot is taken: wait for the entries themselves, then keep them
        for (int i = threadIdx.x; i < p.stripes; i += kThreads) {
          stripe_of[i] = flow_wait_at_least(stripe_queue + i, 1, p.flow_limit_ns) - 1;
        }
        flow_fence();
        __syncthreads();
        if (threadIdx.x == 0) queue_complete = 1;
      }
      __syncthreads();
    }
  }
}

}  // namespace

namespace {

// How long one wait of the dataflow walk lasts before the launch gives up and fails (tile_flow.h flow_gave_up):
// GEMMBN_FLOW_TIMEOUT_S seconds (0: no limit, for a debugger stopped inside the GEMM), read at each launch; else 20 s.
// A wait lasts as long as the GEMM has left to run (milliseconds; seconds under compute-sanitizer), so only a GEMM
// that never stores a tile the walk counts on reaches the limit, and the caller gets an error, not a hung process.
constexpr double kFlowTimeoutSeconds = 20;
Status flow_limit_ns(uint64_t& ns) {
  const char* set = std::getenv("GEMMBN_FLOW_TIMEOUT_S");
  if (set == nullptr || *set == '\0') {
    ns = static_cast<uint64_t>(kFlowTimeoutSeconds * 1e9);
    return Status::success();
  }
  char* end = nullptr;
  const double seconds = std::strtod(set, &end);
  if (*end != '\0' || !(seconds >= 0 && seconds <= 1e6)) {
    return Status::invalid("GEMMBN_FLOW_TIMEOUT_S must be a number of seconds from 0 (no limit) to 1e6");
  }
  ns = static_cast<uint64_t>(seconds * 1e9);
  return Status::success();
}

}  // namespace

Status finish_normalize_check(const FinishNormalizeArgs& a) {
  const bool ranks = a.rank_moments != nullptr;
  if (a.moments && ranks) return Status::invalid("moments and rank_moments are two different launches");
  // One rank's rows may be one (or its moments, from one row): the statistics of all ranks need two.
  if (a.M < (ranks || a.moments ? 1 : 2)) return Status::invalid("batch statistics need M >= 2 rows");
  if (a.N < 1 || a.tile_rows < 1) return Status::invalid("N and tile_rows must be positive");
  if (a.N % (16 / dtype_size(a.dtype)) != 0) return Status::invalid("N must be a multiple of 16 bytes of the dtype");
  if (a.product_scale && (!a.partials_from_y || a.moments || ranks)) {
    return Status::invalid("product_scale (y holds x W^T alone) needs partials_from_y and a normalizing launch");
  }
  if (!a.product_scale && (a.product_bias || a.pre_norm)) return Status::invalid("product_bias and pre_norm need product_scale");
  if (a.pre_norm && !is_aligned16(a.pre_norm)) return Status::invalid("pre_norm must be 16-byte aligned");
  if (a.tile_columns != 0) {
    if (a.partials_from_y || a.moments || ranks || a.product_scale) {
      return Status::invalid("tile_columns (the dataflow walk) takes the GEMM's own partials and a normalizing launch");
    }
    if (a.tile_columns < kMinFlowTileColumns || a.tile_columns % merge_columns_for(a.N) != 0) {
      return Status::invalid("tile_columns must be the GEMM row's tile_n (at least 64, a multiple of 16)");
    }
    if (!fits_dataflow(a.dtype, a.M, a.N)) {
      return Status::invalid("N (at most 1024 column stripes) or M x N is too large for the dataflow walk");
    }
    uint64_t limit_ns = 0;
    if (Status s = flow_limit_ns(limit_ns); !s) return s;
  }
  if (ranks && (a.ranks < 1 || a.partials_from_y)) {
    return Status::invalid("rank_moments needs ranks >= 1 and takes the partials' place (no partials_from_y)");
  }
  if (!a.moments && (!a.workspace || !is_aligned16(a.workspace))) {
    return Status::invalid("workspace (finish_workspace_bytes(N) bytes, 16-byte aligned) is required");
  }
  if (a.moments && (a.running_mean || a.running_var || a.batches_tracked)) {
    return Status::invalid("moments: no running statistics or batches_tracked (the launch with rank_moments has them)");
  }
  if (!a.y || (!ranks && (!a.partial_mean || !a.partial_m2)) ||
      (!a.moments && (!a.out || !a.save_mean || !a.save_invstd))) {
    return Status::invalid("y, out, partials and save_mean/save_invstd are required");
  }
  if (!is_aligned16(a.y) || (a.out && !is_aligned16(a.out))) return Status::invalid("y and out must be 16-byte aligned");
  if ((a.running_mean == nullptr) != (a.running_var == nullptr)) {
    return Status::invalid("running_mean and running_var go together");
  }
  if (a.running_mean && a.cumulative && !a.batches_tracked) {
    return Status::invalid("momentum=None needs batches_tracked");
  }
  return Status::success();
}

namespace {

// The blocks of a finish_normalize variant resident at once: the most its cooperative launch may have.
template <auto kernel>
Status finish_resident_blocks(int& blocks) {
  if (cudaError_t e = resident_blocks<kernel>(kThreads, blocks); e != cudaSuccess) {
    return Status::from_cuda(e, "querying finish_normalize's occupancy");
  }
  if (blocks < 1) return Status::from_cuda(cudaErrorLaunchOutOfResources, "finish_normalize does not fit");
  return Status::success();
}

// The launch's work items over the variant's resident blocks (phase 0's chunks are phase 2's).
template <class T, bool kFromY>
Status finish_work(int M, int N, WorkItems& work, int& max_blocks) {
  constexpr int kCols = kLanesPerRow * Vector16<T>::kSize;
  if (Status s = finish_resident_blocks<&finish_normalize_kernel<T, kFromY>>(max_blocks); !s) return s;
  work = work_items(M, N, kCols, max_blocks, kRowsPerPass * kUnroll);
  return Status::success();
}

// Whether phase 2 claims its items, one pass of rows each (normalize_rows), instead of walking the static chunks: where
// a claiming block's share of y is at least kClaimBytesPerBlock (from 66 MiB of y on an H200). Alone, with L2 flushed,
// claims win from 64 MiB; after the GEMM, with part of y in L2, the forward gained at 128 MiB and more but was even at
// 64 MiB (perf/NOTES.md v31, v32). GEMMBN_FINISH_CLAIMS=0|1 overrides it (tests run both walks; perf A/B runs).
constexpr int64_t kClaimBytesPerBlock = int64_t(256) << 10;
bool finish_claims_items(int64_t M, int N, int element_bytes, int blocks) {
  if (const char forced = forced_choice("GEMMBN_FINISH_CLAIMS")) return forced == '1';
  return M * N * element_bytes >= kClaimBytesPerBlock * blocks;
}
// Whether the y-pass variants' phase 2 claims passes, last passes of phase 0's items first (normalize_y_pass_claim),
// instead of each block walking its own item last rows first (which ends on the slowest block): where rows are wide
// (N >= kYClaimMinColumns) and y large enough for the partials' variant to claim. On an H100 claims won 0.2-1.3% of the
// training forward at every such shape measured and lost up to 2.4% at N <= 1024 (perf/NOTES.md v58).
// GEMMBN_FINISH_Y_CLAIMS=0|1 overrides it (tests run both walks; perf A/B runs).
constexpr int kYClaimMinColumns = 2048;
bool finish_y_pass_claims(int64_t M, int N, int element_bytes, int blocks) {
  if (const char forced = forced_choice("GEMMBN_FINISH_Y_CLAIMS")) return forced == '1';
  return N >= kYClaimMinColumns && M * N * element_bytes >= kClaimBytesPerBlock * blocks;
}
// Of each item's passes, how many a claimed y pass claims (its first rows; the owner walks the rest first): every one,
// unless GEMMBN_FINISH_Y_CLAIM_SHARE=P (a percentage, 1-100) claims the first P% of them (at least one). EXPERIMENT,
// not yet run on a GPU: the static walk's L2 hits for the rows each SM read last, the claims' balance for the rest
// (perf/NOTES.md v58's next step 3).
int y_pass_claimed_passes(int passes_per_chunk) {
  const long percent = integer_switch("GEMMBN_FINISH_Y_CLAIM_SHARE", 100);
  if (percent < 1 || percent >= 100) return passes_per_chunk;
  return std::max(1, static_cast<int>((int64_t(passes_per_chunk) * percent + 99) / 100));
}
// A claimed launch's blocks: two per SM at most (fewer streams in flight for the same bytes: perf/NOTES.md v32).
constexpr int kClaimBlocksPerSm = 2;
Status claiming_blocks(int max_blocks, int& blocks) {
  int device = 0, sm_count = 0;
  if (cudaError_t e = current_device_info(device, sm_count); e != cudaSuccess) {
    return Status::from_cuda(e, "querying the SM count");
  }
  blocks = std::min(max_blocks, kClaimBlocksPerSm * sm_count);
  return Status::success();
}

// Whether a launch with the GEMM epilogue's partials takes the local walk (finish_local_kernel) instead of the barrier
// walk: at most kLocalMergeTiles partials per column, where phase 1 and the grid barrier are a fixed cost that the
// local walk's repeated merges undercut (perf/NOTES.md v45).
// GEMMBN_FINISH_LOCAL_MERGE=0|1, read at each launch, forces either (tests run both; A/B runs).
constexpr int64_t kLocalMergeTiles = 16;
bool finish_merges_locally(int64_t tiles) {
  if (const char forced = forced_choice("GEMMBN_FINISH_LOCAL_MERGE")) return forced == '1';
  return tiles <= kLocalMergeTiles;
}

// Whether the local walk may take a launch (else the barrier walk does, also where GEMMBN_FINISH_LOCAL_MERGE=1): not
// where kRaggedTileFromY has every block read the ragged last row block from y while one of them normalizes it in
// place (out == y) with no barrier between: a block could read rows already normalized (perf/NOTES.md v62).
bool local_walk_safe(const FinishNormalizeArgs& a) {
  return !kRaggedTileFromY || a.out != a.y || a.M % a.tile_rows == 0;
}

// Whether the dataflow walk's blocks claim a normalize item first (finish_dataflow_kernel): GEMMBN_FLOW_ITEMS_FIRST=1,
// read at each launch; else a statistics job, the walk measured in perf/NOTES.md v33-v34. EXPERIMENT, off: items first
// normalizes the stripes the GEMM finished early beside its last wave, but that does not shorten the walk's tail (the
// last stripes' statistics), so it won nowhere consistently (perf/NOTES.md v36).
inline int flow_items_first() { return forced_choice("GEMMBN_FLOW_ITEMS_FIRST") == '1'; }

// The dataflow walk's launch: a pass of rows per item, as the claimed walk, on at most two blocks per SM.
template <class T>
Status launch_dataflow(const FinishNormalizeArgs& a, cudaStream_t stream) {
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  int max_blocks = 0, blocks = 0;
  if (Status s = finish_resident_blocks<&finish_dataflow_kernel<T>>(max_blocks); !s) return s;
  if (Status s = claiming_blocks(max_blocks, blocks); !s) return s;
  const int stripes = static_cast<int>(stripes_for(a.dtype, a.N));
  const int64_t items = pass_items(a.dtype, a.M, a.N);  // within fits_dataflow's bound (finish_normalize_check)
  const int tiles = static_cast<int>((a.M + a.tile_rows - 1) / a.tile_rows);
  FinishParams<T> p{static_cast<const T*>(a.y), static_cast<T*>(a.out), a.M, a.N, a.partial_mean, a.partial_m2, tiles,
                    a.tile_rows, static_cast<const T*>(a.gamma), static_cast<const T*>(a.beta),
                    static_cast<T*>(a.running_mean), static_cast<T*>(a.running_var), a.batches_tracked, a.cumulative,
                    a.momentum, a.eps, a.save_mean, a.save_invstd, merge_columns_for(a.N), stripes, kPassRows,
                    static_cast<int>(items)};
  p.alpha = static_cast<float*>(a.workspace);
  p.delta = p.alpha + a.N;
  p.flow = finish_tile_flow(a.workspace, a.N);
  p.column_tiles = (a.N + a.tile_columns - 1) / a.tile_columns;
  p.tile_columns = a.tile_columns;
  p.items_first = flow_items_first();
  if (Status s = flow_limit_ns(p.flow_limit_ns); !s) return s;
  return Status::from_cuda(launch_programmatic(&finish_dataflow_kernel<T>, blocks, kThreads, p, stream),
                           "launching finish_normalize (dataflow)");
}

// The launch's parameters but for the workspace's pointers: work's items over partials partial rows.
template <class T, FinishMode kMode>
FinishParams<T> finish_params(const FinishNormalizeArgs& a, const WorkItems& work, int partials) {
  constexpr bool kRanks = kMode == FinishMode::from_ranks;
  const int64_t N = a.N;
  FinishParams<T> p{static_cast<const T*>(a.y), static_cast<T*>(a.out), a.M, a.N,
                    kRanks ? const_cast<float*>(a.rank_moments) + N : a.partial_mean,
                    kRanks ? const_cast<float*>(a.rank_moments) + 2 * N : a.partial_m2, partials, a.tile_rows,
                    static_cast<const T*>(a.gamma), static_cast<const T*>(a.beta), static_cast<T*>(a.running_mean),
                    static_cast<T*>(a.running_var), a.batches_tracked, a.cumulative, a.momentum, a.eps, a.save_mean,
                    a.save_invstd, merge_columns_for(a.N), work.stripes, work.rows_per_chunk,
                    static_cast<int>(work.items), kRanks ? a.rank_moments : nullptr, kRanks ? 3 * N : N, a.moments,
                    static_cast<const T*>(a.product_bias), static_cast<const T*>(a.product_scale),
                    static_cast<T*>(a.pre_norm)};
  if (kMode != FinishMode::moments) {  // the workspace: alpha [N], delta [N], then the claim counter (launch_finish's)
    p.alpha = static_cast<float*>(a.workspace);
    p.delta = p.alpha + N;
  }
  return p;
}

// The local walk's launch (finish_local_kernel): a plain launch whose items fill its own resident blocks once.
template <class T>
Status launch_local(const FinishNormalizeArgs& a, int partials, cudaStream_t stream) {
  constexpr int kCols = kLanesPerRow * Vector16<T>::kSize;
  int resident = 0;
  if (Status s = finish_resident_blocks<&finish_local_kernel<T>>(resident); !s) return s;
  const WorkItems work = work_items(a.M, a.N, kCols, resident, kRowsPerPass * kUnroll);
  FinishParams<T> p = finish_params<T, FinishMode::normalize>(a, work, partials);
  const int blocks = static_cast<int>(std::min<int64_t>(work.items, resident));
  return Status::from_cuda(launch_plain(&finish_local_kernel<T>, blocks, kThreads, p, stream),
                           "launching finish_normalize (local)");
}

template <class T, bool kFromY, FinishMode kMode = FinishMode::normalize, bool kProduct = false>
Status launch_finish(const FinishNormalizeArgs& a, cudaStream_t stream) {
  const int partials =
      kMode == FinishMode::from_ranks ? a.ranks : static_cast<int>((a.M + a.tile_rows - 1) / a.tile_rows);
  if constexpr (!kFromY && kMode == FinishMode::normalize && !kProduct) {  // the variants the local walk has
    if (finish_merges_locally(partials) && local_walk_safe(a)) return launch_local<T>(a, partials, stream);
  }
  WorkItems work{};
  int max_blocks = 0;
  if (Status s = finish_work<T, kFromY>(a.M, a.N, work, max_blocks); !s) return s;
  if (kFromY && a.tile_rows != work.rows_per_chunk) return Status::invalid("tile_rows must be finish_partial_rows");
  bool claims = false;
  int claimed_passes = 0;
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  if constexpr (!kFromY && kMode != FinishMode::moments) {
    const int64_t claim_items = pass_items(a.dtype, a.M, a.N);
    int claim_blocks = 0;
    if (Status s = claiming_blocks(max_blocks, claim_blocks); !s) return s;
    claims = claim_items <= std::numeric_limits<int>::max() - claim_blocks &&
             finish_claims_items(a.M, a.N, sizeof(T), claim_blocks);
    if (claims) work.rows_per_chunk = kPassRows, work.items = claim_items, max_blocks = claim_blocks;
  }
  if constexpr (kFromY && kMode == FinishMode::normalize) {  // phase 0's items stay; phase 2 claims passes of them
    int claim_blocks = 0;
    if (Status s = claiming_blocks(max_blocks, claim_blocks); !s) return s;
    // rows_per_chunk is a multiple of kPassRows (work_items)
    claimed_passes = y_pass_claimed_passes(static_cast<int>(work.rows_per_chunk / kPassRows));
    const int64_t y_pass_claims = int64_t(claimed_passes) * work.items;
    claims = y_pass_claims <= std::numeric_limits<int>::max() - claim_blocks &&
             finish_y_pass_claims(a.M, a.N, sizeof(T), claim_blocks);
    if (claims) max_blocks = claim_blocks;
  }
  // Phase 1 takes a block per column group: at small M the normalize items are few (8 at 128x512) and
  // each block would otherwise merge several column groups one after another.
  const int merge_columns = merge_columns_for(a.N);
  const int64_t merge_groups = (a.N + merge_columns - 1) / merge_columns;
  // A claimed y pass takes every claiming block: phase 0's items are fewer, its passes many.
  const int64_t wanted = kFromY && claims ? max_blocks : std::max(work.items, merge_groups);
  int blocks = static_cast<int>(std::min<int64_t>(wanted, max_blocks));
  constexpr auto kernel = &finish_normalize_kernel<T, kFromY, kMode, kProduct>;
  if constexpr (kMode != FinishMode::normalize || kProduct) {  // a cooperative grid within its own variant's
    int resident = 0;  // residency (the work items stay finish_work's; blocks loop over any excess)
    if (Status s = finish_resident_blocks<kernel>(resident); !s) return s;
    blocks = std::min(blocks, resident);
  }
  FinishParams<T> p = finish_params<T, kMode>(a, work, partials);
  if (claims) {
    p.claim_counter = reinterpret_cast<int*>(p.delta + a.N);
    p.claimed_passes = claimed_passes;
  }
  return Status::from_cuda(launch_cooperative(kernel, blocks, kThreads, p, stream),
                           "launching finish_normalize (cooperative)");
}

// The workspace: alpha [N], delta [N], the claim counter (16 bytes), then the dataflow walk's counters (sized for the
// narrowest column tiles and the most stripes, fp32's 128 columns).
size_t tile_flow_offset(int N) { return sizeof(float) * 2 * size_t(N) + 16; }

}  // namespace

size_t finish_workspace_bytes(int N) {
  const int column_tiles = (N + kMinFlowTileColumns - 1) / kMinFlowTileColumns;
  return tile_flow_offset(N) + sizeof(int) * TileFlow::ints(column_tiles, static_cast<int>(stripes_for(DType::f32, N)));
}

int* finish_tile_flow(void* workspace, int N) {
  return reinterpret_cast<int*>(static_cast<char*>(workspace) + tile_flow_offset(N));
}

size_t finish_tile_flow_bytes(const FinishNormalizeArgs& a) {
  const int column_tiles = a.tile_columns > 0 ? (a.N + a.tile_columns - 1) / a.tile_columns : 0;
  return sizeof(int) * TileFlow::ints(column_tiles, static_cast<int>(stripes_for(a.dtype, a.N)));
}

// Whether the training forward's finish runs the dataflow walk: GEMMBN_FINISH_DATAFLOW=0|1 where set (tests, A/B runs),
// else where y holds at least kDataflowBytesPerSm per SM (32 MiB on an H200); below it the walk's chain of claims and
// waits per block and the counters' memset cost more than the GEMM's last wave leaves to overlap (perf/NOTES.md v33).
// Never past the walk's limits (fits_dataflow), so a forced walk is refused by no check.
constexpr int64_t kDataflowBytesPerSm = int64_t(240) << 10;
bool finish_runs_dataflow(DType dtype, int64_t M, int N) {
  if (!fits_dataflow(dtype, M, N)) return false;
  if (const char forced = forced_choice("GEMMBN_FINISH_DATAFLOW")) return forced == '1';
  int device = 0, sm_count = 0;
  if (current_device_info(device, sm_count) != cudaSuccess) return false;
  return M * N * dtype_size(dtype) >= kDataflowBytesPerSm * sm_count;
}

Status finish_partial_rows(DType dtype, int M, int N, int& rows) {
  rows = 0;
  if (M < 1 || N < 1) return Status::invalid("M and N must be positive");
  return with_element_type(dtype, [&](auto element) -> Status {
    WorkItems work{};
    int max_blocks = 0;
    if (Status s = finish_work<decltype(element), true>(M, N, work, max_blocks); !s) return s;
    rows = static_cast<int>(work.rows_per_chunk);
    return Status::success();
  });
}

Status finish_normalize(const FinishNormalizeArgs& a, cudaStream_t stream) {
  if (Status s = finish_normalize_check(a); !s) return s;
  return with_element_type(a.dtype, [&](auto element) -> Status {
    using T = decltype(element);
    if (a.rank_moments) return launch_finish<T, false, FinishMode::from_ranks>(a, stream);
    if (a.moments) {
      return a.partials_from_y ? launch_finish<T, true, FinishMode::moments>(a, stream)
                               : launch_finish<T, false, FinishMode::moments>(a, stream);
    }
#if GEMMBN_CUBLAS_PRODUCT  // the experiment's variant (CMake GEMMBN_CUBLAS_PRODUCT; perf/NOTES.md v28)
    if (a.product_scale) return launch_finish<T, true, FinishMode::normalize, true>(a, stream);
#else
    if (a.product_scale) return Status::invalid("the product variant needs a build with GEMMBN_CUBLAS_PRODUCT=ON");
#endif
    if (a.tile_columns != 0) return launch_dataflow<T>(a, stream);
    return a.partials_from_y ? launch_finish<T, true>(a, stream) : launch_finish<T, false>(a, stream);
  });
}

}  // namespace gemmbn
