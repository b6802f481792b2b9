// Backward of the normalization and of the scale: the column sums over M, their merge, then dz = s dL/dy
// (api.h has the math).
//
// One cooperative launch in five phases, grid-wide barriers after the first three:
//   1. sums: every block streams its work items (column stripe x row chunk, finish_normalize's
//      decomposition) and writes, per item and column, the sums of dout, dout d and d (d = y - mean);
//   2. merge: each column's partials are merged once, in fp64 in a fixed order, into dbeta, dgamma,
//      sum_grad_y, dbias and grad_y's three per-column coefficients;
//   3. dz: every block streams its phase-1 items again, last rows first, so that the first rows it reads
//      are the ones phase 1 read last and may still be in L2; it also sums grad_y d per column, and for the
//      fp32-faithful GEMMs writes dz^T with the maxima of |dz| per row and per column (their row scales);
//   4. those sums merged: dscale = sum_m grad_y y / s where s != 0;
//   5. dscale where s = 0 (y = 0 there, z lost): sum_m grad_y (x_m . W_n + b_n) from x and the weight.
// dout and y are read twice (no grad_y is known before every row has been summed), dz written once.
// Sums: fp32 over a thread's kUnroll rows of a pass, fp64 over its passes, the block's threads of a column
// in fp64 (stored as an fp32 partial per item), the items in fp64 in a fixed order.
#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "gemmbn/api.h"
#include "gemmbn/cooperative_launch.cuh"
#include "gemmbn/device_info.h"
#include "gemmbn/elementwise.cuh"
#include "gemmbn/work_items.h"

namespace gemmbn {
namespace {

namespace cg = cooperative_groups;

constexpr int kUnroll = 4;                             // rows per thread per pass: 8 16-byte loads in flight
constexpr int kSums = 3;                               // phase 1: sum dout, sum dout d, sum d
constexpr int kGlobalSums = 2;                         // over ranks, the coefficients' sums: dout, dout d
constexpr int kCoefficients = 3;                       // grad_y = c_dout dout - (c_d d + c_0)
constexpr int kStripeTerms = kCoefficients + 2;        // phase 3's per-column terms: those, mean and s
constexpr int kMergeColumns = 16;                      // phase 2: a block per 16 columns,
constexpr int kMergeLanes = kThreads / kMergeColumns;  // 16 threads per column

template <class T>
struct BackwardParams {
  const T* dout;
  const T* y;   // null: fixed statistics, only dbeta, dbias and dz
  T* dz;        // s grad_y; null: the column gradients only (phases 1-2)
  int64_t M;
  int N;
  const float* mean;
  const float* invstd;
  const T* gamma;
  const T* scale;
  const T* x;       // [M, K], with the weight and bias: z where s = 0 (phase 5)
  const T* weight;  // [N, K]
  const T* bias;
  int K;
  bool batch_statistics;
  float* partials;         // [kSums][chunks][N]; phase 3 reuses [0]
  float* coefficients;     // [kCoefficients][N]
  double* sum_grad_y_fp64;  // [N]
  T *dgamma, *dbeta, *dbias, *dscale;  // null: not computed
  int stripes;
  int64_t rows_per_chunk;
  int items, chunks;  // items = stripes x chunks
  // The transposed variant (float32): dz^T [N, dz_t_columns], zero past M, and the bits of max |dz| per row [M]
  // and per column [N], zeroed in phase 1.
  float* dz_t = nullptr;
  int64_t dz_t_columns = 0;
  unsigned* dz_row_max_bits = nullptr;
  unsigned* dz_column_max_bits = nullptr;
  // Statistics over several ranks (issue 19), two launches around the ranks' gather of their sums. First launch
  // (column_sums_out): phases 1-2 as usual, and phase 2 writes this batch's fp64 sums [kSums][N] (dout, dout d, d;
  // d = y - the global mean the caller passes). Second launch (global_sums): no phase 1; phase 2 reads this batch's
  // sums from local_sums (the first launch's: dbeta, dgamma and sum_grad_y are this batch's own) and takes the
  // coefficients from global_sums [kGlobalSums][N], the ranks' sums of dout and dout d added in rank order, over
  // *global_rows rows; then phases 3-5.
  double* column_sums_out = nullptr;
  const double* local_sums = nullptr;
  const double* global_sums = nullptr;
  const double* global_rows = nullptr;
};

// dout (and y when with_y) of a thread's kUnroll rows of a pass from row r on, rows from row_end on left out:
// all the pass's 16-byte loads are issued before any is used.
template <class T>
__device__ __forceinline__ void load_pass(BackwardParams<T> const& p, int64_t r, int64_t row_end, int vector_col,
                                          bool with_y, Vector16<T> (&g)[kUnroll], Vector16<T> (&v)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t row = r + u * kRowsPerPass;
    if (row >= row_end) continue;
    g[u].load(p.dout + row * p.N + vector_col);
    if (with_y) v[u].load(p.y + row * p.N + vector_col);
  }
}

// A work item's per-thread sums (the thread's column vector, over its rows) added over the block's
// kRowsPerPass threads of each column in a fixed order (fp64), stored as fp32 partials [slot + s][chunk][col].
template <int S, class T>
__device__ void store_item_sums(BackwardParams<T> const& p, int slot, int stripe, int chunk,
                                const double (&sums)[S][Vector16<T>::kSize]) {
  constexpr int V = Vector16<T>::kSize, kCols = kLanesPerRow * V;
  static_assert(kCols <= kThreads, "a thread per stripe column");
  __shared__ float thread_sums[S][kRowsPerPass][kCols];
  const int lane = threadIdx.x % kLanesPerRow, row_in_pass = threadIdx.x / kLanesPerRow;
#pragma unroll
  for (int s = 0; s < S; ++s) {
#pragma unroll
    for (int i = 0; i < V; ++i) thread_sums[s][row_in_pass][lane * V + i] = static_cast<float>(sums[s][i]);
  }
  __syncthreads();
  const int col = stripe * kCols + static_cast<int>(threadIdx.x);
  if (static_cast<int>(threadIdx.x) < kCols && col < p.N) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      double total = 0;
#pragma unroll
      for (int r = 0; r < kRowsPerPass; ++r) total += thread_sums[s][r][threadIdx.x];
      p.partials[(int64_t(slot + s) * p.chunks + chunk) * p.N + col] = static_cast<float>(total);
    }
  }
  __syncthreads();  // thread_sums is reused by the next item
}

// Phase 1, per work item: sums over the item's rows of dout, dout d and d per column (see the top).
template <class T>
__device__ void column_sums(BackwardParams<T> const& p) {
  using Vec = Vector16<T>;
  constexpr int V = Vec::kSize, kCols = kLanesPerRow * V;
  const int lane = threadIdx.x % kLanesPerRow, row_in_pass = threadIdx.x / kLanesPerRow;
  const bool with_y = p.y != nullptr;
  if (p.global_sums != nullptr) return;  // the second launch over ranks: the sums are given
  for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
    const int stripe = item % p.stripes, chunk = item / p.stripes;
    const int vector_col = stripe * kCols + lane * V;
    double sums[kSums][V] = {};
    if (vector_col < p.N) {
      float mean[V];
#pragma unroll
      for (int i = 0; i < V; ++i) mean[i] = with_y ? p.mean[vector_col + i] : 0.f;
      const int64_t row_begin = chunk * p.rows_per_chunk, row_end = min(p.M, row_begin + p.rows_per_chunk);
      for (int64_t r = row_begin + row_in_pass; r < row_end; r += kRowsPerPass * kUnroll) {
        Vec g[kUnroll], v[kUnroll];
        load_pass(p, r, row_end, vector_col, with_y, g, v);
        float pass[kSums][V] = {};
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (r + u * kRowsPerPass >= row_end) continue;
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const float dout = g[u].get(i), d = with_y ? v[u].get(i) - mean[i] : 0.f;
            pass[0][i] += dout;
            pass[1][i] = fmaf(dout, d, pass[1][i]);
            pass[2][i] += d;
          }
        }
#pragma unroll
        for (int s = 0; s < kSums; ++s) {
#pragma unroll
          for (int i = 0; i < V; ++i) sums[s][i] += pass[s][i];
        }
      }
    }
    store_item_sums<kSums>(p, 0, stripe, chunk, sums);
  }
}

// The fp64 totals over the chunks of partials [slot .. slot + S) of column col: each of the column's
// kMergeLanes threads sums a strided set of chunks, then one thread adds the lanes in a fixed order. True
// on that thread (merge lane 0, col < N). Called by every thread of the block.
template <int S, class T>
__device__ bool merged_totals(BackwardParams<T> const& p, int slot, int col, double (&total)[S]) {
  __shared__ double lane_sums[S][kThreads];
  const int column_offset = threadIdx.x % kMergeColumns, merge_lane = threadIdx.x / kMergeColumns;
  double sums[S] = {};
  if (col < p.N) {
#pragma unroll 4
    for (int chunk = merge_lane; chunk < p.chunks; chunk += kMergeLanes) {
#pragma unroll
      for (int s = 0; s < S; ++s) sums[s] += p.partials[(int64_t(slot + s) * p.chunks + chunk) * p.N + col];
    }
  }
  __syncthreads();  // the previous group's reads of lane_sums are done
#pragma unroll
  for (int s = 0; s < S; ++s) lane_sums[s][threadIdx.x] = sums[s];
  __syncthreads();
  if (merge_lane != 0 || col >= p.N) return false;
#pragma unroll
  for (int s = 0; s < S; ++s) total[s] = 0;
  for (int lane = 0; lane < kMergeLanes; ++lane) {  // fixed order
#pragma unroll
    for (int s = 0; s < S; ++s) total[s] += lane_sums[s][lane * kMergeColumns + column_offset];
  }
  return true;
}

// Phase 2, per column, from the chunks' sums S0 (dout), S1 (dout d), S2 (d):
//   dbeta = S0,  dgamma = invstd S1,  c_dout = a = gamma invstd,  dbias = s sum_grad_y
//   batch statistics: c_d = a invstd dgamma / M,  c_0 = a dbeta / M,  sum_grad_y = -c_d S2
//   fixed statistics: c_d = c_0 = 0,                                  sum_grad_y = a dbeta
// Over ranks (global_sums): c_d and c_0 from the global sums and rows, sum_grad_y = a S0 - c_d S2 - c_0 M of this
// batch's (the terms cancel only over every rank's rows).
template <class T>
__device__ void merge_columns(BackwardParams<T> const& p) {
  const int groups = (p.N + kMergeColumns - 1) / kMergeColumns;
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {  // uniform across the block
    const int col = group * kMergeColumns + static_cast<int>(threadIdx.x) % kMergeColumns;
    double total[kSums], global[kGlobalSums];
    if (p.global_sums == nullptr) {
      if (!merged_totals<kSums>(p, 0, col, total)) continue;
    } else {
      if (static_cast<int>(threadIdx.x) >= kMergeColumns || col >= p.N) continue;  // merged_totals' thread per column
#pragma unroll
      for (int s = 0; s < kSums; ++s) total[s] = p.local_sums[s * p.N + col];
#pragma unroll
      for (int s = 0; s < kGlobalSums; ++s) global[s] = p.global_sums[s * p.N + col];
    }
    if (p.column_sums_out) {
#pragma unroll
      for (int s = 0; s < kSums; ++s) p.column_sums_out[s * p.N + col] = total[s];
    }
    const double rows = static_cast<double>(p.M), invstd = p.invstd[col];
    const double dbeta = total[0], dgamma = invstd * total[1], a = load_or(p.gamma, col, 1.0) * invstd;
    double c_d = 0, c_0 = 0, sum_grad_y = a * dbeta;
    if (p.batch_statistics && p.global_sums == nullptr) {
      c_d = a * invstd * dgamma / rows;
      c_0 = a * dbeta / rows;
      sum_grad_y = -c_d * total[2];
    } else if (p.batch_statistics) {
      const double global_rows = *p.global_rows;
      c_d = a * invstd * (invstd * global[1]) / global_rows;
      c_0 = a * global[0] / global_rows;
      sum_grad_y = a * dbeta - c_d * total[2] - c_0 * rows;
    }
    if (p.dbeta) p.dbeta[col] = from_float<T>(static_cast<float>(dbeta));
    if (p.dgamma) p.dgamma[col] = from_float<T>(static_cast<float>(dgamma));
    if (p.dbias) p.dbias[col] = from_float<T>(static_cast<float>(load_or(p.scale, col, 1.0) * sum_grad_y));
    p.sum_grad_y_fp64[col] = sum_grad_y;
    p.coefficients[col] = static_cast<float>(a);
    p.coefficients[p.N + col] = static_cast<float>(c_d);
    p.coefficients[2 * p.N + col] = static_cast<float>(c_0);
  }
}

// Phase 3's transposed output: each pass's 32 rows x 128 columns of dz staged in shared memory (two buffers, so one
// barrier per pass) and written as 128 rows of dz^T of 32 m-values each, a warp per 128-byte row segment. The
// swizzle r ^ (c / 4) puts a warp's staging stores (one row, columns 4 apart) and its loads (one column, 32 rows) on
// 32 distinct banks. Writing dz^T here spares transpose_padded's read of dz (perf/NOTES.md, v17).
constexpr int kStagedColumns = kLanesPerRow * 4, kStagedRows = kRowsPerPass * kUnroll;  // float32's stripe x pass
constexpr int kStagedColumnsPerWarp = kStagedColumns / kRowsPerPass;
static_assert(kStagedRows == 32 && kLanesPerRow == 32, "a lane per staged row, a warp per staged row of threads");
__device__ __forceinline__ int staged_at(int c, int r) { return c * kStagedRows + (r ^ (c / 4)); }

// Phase 3, per work item (phase 1's, in reverse: last items and last rows first):
//   grad_y = c_dout dout - (c_d d + c_0),  dz = s grad_y   in fp32, rounded once to T
// and, where dscale is asked for, the item's sums of grad_y d (fp32, before the scale) into partials [0].
// kTransposed (float32): also dz^T and the maxima of |dz| per row and column (atomicMax on the bits of
// non-negative floats: order-free, deterministic; fmaxf drops NaN, as transpose_padded's maxima do).
template <class T, bool kTransposed>
__device__ void write_dz(BackwardParams<T> const& p) {
  using Vec = Vector16<T>;
  constexpr int V = Vec::kSize, kCols = kLanesPerRow * V;
  constexpr int64_t kPassRows = kRowsPerPass * kUnroll;
  static_assert(!kTransposed || kCols == kStagedColumns, "dz^T is float32's");
  __shared__ float stripe_terms[kStripeTerms][kCols];  // c_dout, c_d, c_0, mean, s
  constexpr int kBuffers = kTransposed ? 2 : 1, kStaged = kTransposed ? kStagedColumns * kStagedRows : 1;
  __shared__ float staged[kBuffers][kStaged];                         // a pass of dz, then the column maxima
  __shared__ float row_maxima[kBuffers][kRowsPerPass][kLanesPerRow];  // per warp, of its staged columns
  const int lane = threadIdx.x % kLanesPerRow, row_in_pass = threadIdx.x / kLanesPerRow;
  // kTransposed: warp 0 merges the 8 warps' maxima of a staged pass's rows (rows row0 + lane, in `buffer`), one
  // atomicMax per row before row_end.
  auto merge_row_maxima = [&](int buffer, int64_t row0, int64_t row_end) {
    if (threadIdx.x >= kLanesPerRow) return;
    float m = row_maxima[buffer][0][lane];
    for (int w = 1; w < kRowsPerPass; ++w) m = fmaxf(m, row_maxima[buffer][w][lane]);
    if (row0 + lane < row_end) atomicMax(p.dz_row_max_bits + row0 + lane, __float_as_uint(m));
  };
  const bool with_y = p.y != nullptr, with_sums = p.dscale != nullptr;
  const int first = static_cast<int>(blockIdx.x), blocks = static_cast<int>(gridDim.x);
  const int last_item = first < p.items ? first + (p.items - 1 - first) / blocks * blocks : -1;
  for (int item = last_item; item >= 0; item -= blocks) {  // uniform across the block
    const int stripe = item % p.stripes, chunk = item / p.stripes;
    const int col0 = stripe * kCols;
    __syncthreads();  // the previous item's reads of stripe_terms (and staged) are done
    if (static_cast<int>(threadIdx.x) < kCols) {
      const int col = col0 + static_cast<int>(threadIdx.x);
      const bool valid = col < p.N;
#pragma unroll
      for (int k = 0; k < kCoefficients; ++k) stripe_terms[k][threadIdx.x] = valid ? p.coefficients[k * p.N + col] : 0.f;
      stripe_terms[kCoefficients][threadIdx.x] = valid && with_y ? p.mean[col] : 0.f;
      stripe_terms[kCoefficients + 1][threadIdx.x] = valid ? static_cast<float>(load_or(p.scale, col, 1.0)) : 0.f;
    }
    __syncthreads();

    const int vector_col = col0 + lane * V;
    const bool in_columns = vector_col < p.N;  // N % V == 0: a vector is wholly inside or outside
    double sums[1][V] = {};
    float c_dout[V], c_d[V], c_0[V], mean[V], scale[V], column_max[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int c = lane * V + i;
      c_dout[i] = stripe_terms[0][c], c_d[i] = stripe_terms[1][c], c_0[i] = stripe_terms[2][c];
      mean[i] = stripe_terms[kCoefficients][c], scale[i] = stripe_terms[kCoefficients + 1][c];
      column_max[i] = 0.f;
    }
    const int64_t row_begin = chunk * p.rows_per_chunk, row_end = min(p.M, row_begin + p.rows_per_chunk);
    // dz^T's columns this item writes: its rows, and in the last chunk the zero padding up to dz_t_columns (chunks
    // are whole passes but for the last, so a pass never reaches into the next chunk).
    const int64_t transposed_end = row_end == p.M ? p.dz_t_columns : row_end;
    const int64_t passes = (row_end - row_begin + kPassRows - 1) / kPassRows;
    for (int64_t pass = passes - 1; pass >= 0; --pass) {  // uniform across the block
      const int64_t pass_row0 = row_begin + pass * kPassRows, r = pass_row0 + row_in_pass;
      Vec g[kUnroll], v[kUnroll];
      if (in_columns) load_pass(p, r, row_end, vector_col, with_y, g, v);
      float pass_sums[V] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t row = r + u * kRowsPerPass;
        const bool inside = in_columns && row < row_end;
        if (inside) {
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const float d = with_y ? v[u].get(i) - mean[i] : 0.f;
            const float grad = fmaf(c_dout[i], g[u].get(i), -fmaf(c_d[i], d, c_0[i]));
            pass_sums[i] = fmaf(grad, d, pass_sums[i]);
            g[u].set(i, grad * scale[i]);
          }
          g[u].store(p.dz + row * p.N + vector_col);
        }
        if constexpr (kTransposed) {  // zeros outside: the padding rows of dz^T
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const float value = inside ? g[u].get(i) : 0.f;
            staged[pass & 1][staged_at(lane * V + i, row_in_pass + u * kRowsPerPass)] = value;
            column_max[i] = fmaxf(column_max[i], fabsf(value));
          }
        }
      }
#pragma unroll
      for (int i = 0; i < V; ++i) sums[0][i] += pass_sums[i];
      if constexpr (kTransposed) {
        __syncthreads();  // the pass is staged; the other buffer's readers (the previous pass) are done
        if (pass != passes - 1) merge_row_maxima((pass + 1) & 1, pass_row0 + kPassRows, row_end);  // the previous pass's
        float row_max = 0.f;  // of dz row pass_row0 + lane over this warp's columns
#pragma unroll 4
        for (int j = 0; j < kStagedColumnsPerWarp; ++j) {
          const int c = row_in_pass * kStagedColumnsPerWarp + j;
          const float value = staged[pass & 1][staged_at(c, lane)];
          row_max = fmaxf(row_max, fabsf(value));
          const int64_t m = pass_row0 + lane;
          if (col0 + c < p.N && m < transposed_end) p.dz_t[(col0 + c) * p.dz_t_columns + m] = value;
        }
        row_maxima[pass & 1][row_in_pass][lane] = row_max;
      }
    }
    if constexpr (kTransposed) {
      __syncthreads();  // the last pass's row maxima and reads of staged are done
      merge_row_maxima(0, row_begin, row_end);  // the first pass's rows (the loop runs them last)
#pragma unroll
      for (int i = 0; i < V; ++i) staged[0][row_in_pass * kCols + lane * V + i] = column_max[i];
      __syncthreads();
      const int col = col0 + static_cast<int>(threadIdx.x);
      if (static_cast<int>(threadIdx.x) < kCols && col < p.N) {  // the item's rows' maxima per column
        float m = staged[0][threadIdx.x];
        for (int w = 1; w < kRowsPerPass; ++w) m = fmaxf(m, staged[0][w * kCols + threadIdx.x]);
        atomicMax(p.dz_column_max_bits + col, __float_as_uint(m));
      }
    }
    if (with_sums) store_item_sums<1>(p, 0, stripe, chunk, sums);
  }
}

// Phase 4, per column with s != 0: dscale = sum_m grad_y z = (sum grad_y d + mean sum_grad_y) / s, in fp64.
template <class T>
__device__ void merge_dscale(BackwardParams<T> const& p) {
  const int groups = (p.N + kMergeColumns - 1) / kMergeColumns;
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {  // uniform across the block
    const int col = group * kMergeColumns + static_cast<int>(threadIdx.x) % kMergeColumns;
    double total[1];
    if (!merged_totals<1>(p, 0, col, total)) continue;
    const double s = to_float(p.scale[col]);
    if (s != 0) {
      const double sum_grad_y_z = (total[0] + double(p.mean[col]) * p.sum_grad_y_fp64[col]) / s;
      p.dscale[col] = from_float<T>(static_cast<float>(sum_grad_y_z));
    }
  }
}

// Phase 5, per column with s = 0: dscale = sum_m grad_y (x_m . W_n + b_n), grad_y as phase 3 makes it, the dot
// in fp64 (each product exact), a thread per row, the block's threads added in a fixed order. M x K work per
// such column, none for the others: a scale that is exactly 0 is rare, and keeping z for it would cost every
// call an M x N tensor.
template <class T>
__device__ void zero_scale_dscale(BackwardParams<T> const& p) {
  using Vec = Vector16<T>;
  constexpr int V = Vec::kSize;
  __shared__ double thread_sums[kThreads];
  for (int col = blockIdx.x; col < p.N; col += gridDim.x) {
    if (to_float(p.scale[col]) != 0.f) continue;  // uniform across the block
    const float c_dout = p.coefficients[col], c_d = p.coefficients[p.N + col], c_0 = p.coefficients[2 * p.N + col];
    const float mean = p.mean[col];
    const double bias = load_or(p.bias, col, 0.0);
    const T* w = p.weight + int64_t(col) * p.K;
    double sum = 0;
    for (int64_t m = threadIdx.x; m < p.M; m += kThreads) {
      const T* x = p.x + m * p.K;
      double dot = bias;
      for (int k = 0; k < p.K; k += V) {
        Vec xv, wv;
        xv.load(x + k), wv.load(w + k);
#pragma unroll
        for (int i = 0; i < V; ++i) dot = fma(double(xv.get(i)), double(wv.get(i)), dot);
      }
      const float d = to_float(p.y[m * p.N + col]) - mean;
      const float grad = fmaf(c_dout, to_float(p.dout[m * p.N + col]), -fmaf(c_d, d, c_0));
      sum = fma(double(grad), dot, sum);
    }
    thread_sums[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0;
      for (int t = 0; t < kThreads; ++t) total += thread_sums[t];  // fixed order
      p.dscale[col] = from_float<T>(static_cast<float>(total));
    }
    __syncthreads();  // thread_sums is reused by the next column
  }
}

// The transposed variant's maxima start at 0 (phase 3 raises them): zeroed here, ordered before phase 3's atomics by
// the grid barriers, instead of by memset launches of their own.
template <class T>
__device__ void zero_maxima(BackwardParams<T> const& p) {
  const int64_t stride = int64_t(gridDim.x) * kThreads, first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t i = first; i < p.M; i += stride) p.dz_row_max_bits[i] = 0;
  for (int64_t i = first; i < p.N; i += stride) p.dz_column_max_bits[i] = 0;
}

// batch_norm_backward: the phases, a grid barrier after each of the first three (the same for every block).
template <class T, bool kTransposed = false>
__global__ void __launch_bounds__(kThreads, 2) batch_norm_backward_kernel(BackwardParams<T> p) {
  wait_for_preceding_grids();  // dout and the forward's tensors (a programmatic launch)
  if constexpr (kTransposed) zero_maxima(p);
  column_sums(p);
  cg::this_grid().sync();  // orders phase 1's partials before phase 2's reads
  merge_columns(p);
  if (p.dz == nullptr) return;
  cg::this_grid().sync();  // orders phase 2's coefficients before phase 3's reads (and phase 2's reads of
                           // the partials before phase 3 writes over them)
  write_dz<T, kTransposed>(p);
  if (p.dscale == nullptr) return;
  cg::this_grid().sync();  // orders phase 3's partials before phase 4's reads
  merge_dscale(p);         // phases 4 and 5 write disjoint columns
  zero_scale_dscale(p);
}

// The launch's shape and workspace: finish_normalize's work items over the resident blocks.
struct Plan {
  WorkItems work;
  int blocks;
  int chunks;
  size_t workspace_bytes;  // fp32 partials [kSums][chunks][N] and coefficients [kCoefficients][N], fp64 [N]
};

template <class T, bool kTransposed>
Status plan_for(const BatchNormBackwardArgs& a, Plan& plan) {
  constexpr int kCols = kLanesPerRow * Vector16<T>::kSize;
  int max_blocks = 0;
  if (cudaError_t e = resident_blocks<&batch_norm_backward_kernel<T, kTransposed>>(kThreads, max_blocks); e != cudaSuccess) {
    return Status::from_cuda(e, "querying batch_norm_backward's occupancy");
  }
  if (max_blocks < 1) return Status::from_cuda(cudaErrorLaunchOutOfResources, "batch_norm_backward does not fit");
  plan.work = work_items(a.M, a.N, kCols, max_blocks, kRowsPerPass * kUnroll);
  plan.chunks = static_cast<int>(plan.work.items / plan.work.stripes);
  const int64_t merge_groups = (a.N + kMergeColumns - 1) / kMergeColumns;
  plan.blocks = static_cast<int>(std::min<int64_t>(std::max(plan.work.items, merge_groups), max_blocks));
  // N is a multiple of 4, so the fp64 array after the fp32 ones starts 16-byte aligned.
  plan.workspace_bytes = sizeof(float) * size_t(a.N) * (size_t(kSums) * plan.chunks + kCoefficients) + sizeof(double) * a.N;
  return Status::success();
}

// The two launches of statistics over ranks (api.h): the sums launch writes the sums alone; the gradients' launch
// has every sum it needs. Either may have a single row (the statistics' rows are the ranks').
Status check_over_ranks(const BatchNormBackwardArgs& a) {
  if (!a.batch_statistics || !a.y) return Status::invalid("statistics over ranks are batch statistics: they need y");
  if (a.column_sums_out) {
    if (a.local_sums || a.global_sums || a.global_rows) {
      return Status::invalid("column_sums_out (the sums launch) and global_sums (the gradients' launch) are two launches");
    }
    if (a.dz || a.dgamma || a.dbeta || a.dbias || a.dscale || a.dz_t) {
      return Status::invalid("the sums launch (column_sums_out) writes the sums alone: dz and the gradients must be null");
    }
    return Status::success();
  }
  if (!a.local_sums || !a.global_sums || !a.global_rows) {
    return Status::invalid("the gradients' launch over ranks needs local_sums, global_sums and global_rows");
  }
  return Status::success();
}

Status check(const BatchNormBackwardArgs& a) {
  const bool over_ranks = a.column_sums_out || a.local_sums || a.global_sums || a.global_rows;
  if (a.M < 1 || a.N < 1) return Status::invalid("M and N must be positive");
  if (a.batch_statistics && a.M < 2 && !over_ranks) return Status::invalid("batch statistics need M >= 2 rows");
  if (a.N % (16 / dtype_size(a.dtype)) != 0) return Status::invalid("N must be a multiple of 16 bytes of the dtype");
  if (over_ranks) {
    if (Status s = check_over_ranks(a); !s) return s;
  }
  if (!a.dout || !a.mean || !a.invstd) return Status::invalid("dout, mean and invstd are required");
  if (!a.scale && !a.column_sums_out) return Status::invalid("scale is required (but by the sums launch)");
  if (a.batch_statistics && !a.y) return Status::invalid("batch statistics need y (the saved pre-normalization tensor)");
  if (a.dgamma && !a.y) return Status::invalid("dgamma needs y (the saved pre-normalization tensor)");
  if (a.dscale && !(a.dz && a.y && a.x && a.weight)) return Status::invalid("dscale needs dz, y, x and weight");
  if (a.dscale && (a.K < 1 || a.K % (16 / dtype_size(a.dtype)) != 0)) {
    return Status::invalid("dscale needs K positive and a multiple of 16 bytes of the dtype");
  }
  if (a.dz_t) {
    if (a.dtype != DType::f32 || !a.dz) return Status::invalid("dz_t is float32's, and needs dz");
    if (!a.dz_row_max_bits || !a.dz_column_max_bits) return Status::invalid("dz_t needs dz_row_max_bits and dz_column_max_bits");
    if (a.dz_t_columns != (int64_t(a.M) + 3) / 4 * 4) return Status::invalid("dz_t_columns must be M rounded up to a multiple of 4");
  }
  for (const void* p : {a.dout, a.y, a.x, a.weight, static_cast<const void*>(a.dz), static_cast<const void*>(a.workspace),
                        static_cast<const void*>(a.dz_t)}) {
    if (p && !is_aligned16(p)) return Status::invalid("dout, y, dz, x, weight, workspace and dz_t must be 16-byte aligned");
  }
  return Status::success();
}

// Calls f(std::bool_constant<kTransposed>{}) for the kernel variant the arguments ask for (dz^T: float32 only).
template <class T, class F>
Status with_variant(const BatchNormBackwardArgs& a, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.dz_t) return f(std::true_type{});
  }
  return f(std::false_type{});
}

}  // namespace

Status batch_norm_backward_workspace_bytes(const BatchNormBackwardArgs& a, size_t& bytes) {
  bytes = 0;
  if (a.M < 1 || a.N < 1) return Status::invalid("M and N must be positive");
  return with_element_type(a.dtype, [&](auto element) -> Status {
    using T = decltype(element);
    return with_variant<T>(a, [&](auto transposed) -> Status {
      Plan plan{};
      if (Status s = plan_for<T, decltype(transposed)::value>(a, plan); !s) return s;
      bytes = plan.workspace_bytes;
      return Status::success();
    });
  });
}

Status batch_norm_backward(const BatchNormBackwardArgs& a, cudaStream_t stream) {
  if (Status s = check(a); !s) return s;
  return with_element_type(a.dtype, [&](auto element) -> Status {
    using T = decltype(element);
    return with_variant<T>(a, [&](auto transposed) -> Status {
      Plan plan{};
      if (Status s = plan_for<T, decltype(transposed)::value>(a, plan); !s) return s;
      if (!a.workspace || a.workspace_bytes < plan.workspace_bytes) {
        return Status::invalid("workspace is smaller than batch_norm_backward_workspace_bytes");
      }
      float* partials = static_cast<float*>(a.workspace);
      BackwardParams<T> p{static_cast<const T*>(a.dout), static_cast<const T*>(a.y), static_cast<T*>(a.dz), a.M, a.N,
                          a.mean, a.invstd, static_cast<const T*>(a.gamma), static_cast<const T*>(a.scale),
                          static_cast<const T*>(a.x), static_cast<const T*>(a.weight), static_cast<const T*>(a.bias), a.K,
                          a.batch_statistics, partials, partials + int64_t(kSums) * plan.chunks * a.N,
                          reinterpret_cast<double*>(partials + (int64_t(kSums) * plan.chunks + kCoefficients) * a.N),
                          static_cast<T*>(a.dgamma), static_cast<T*>(a.dbeta), static_cast<T*>(a.dbias),
                          static_cast<T*>(a.dscale), plan.work.stripes, plan.work.rows_per_chunk,
                          static_cast<int>(plan.work.items), plan.chunks, a.dz_t, a.dz_t_columns, a.dz_row_max_bits,
                          a.dz_column_max_bits};
      p.column_sums_out = a.column_sums_out, p.local_sums = a.local_sums, p.global_sums = a.global_sums;
      p.global_rows = a.global_rows;
      cudaError_t e = launch_cooperative(&batch_norm_backward_kernel<T, decltype(transposed)::value>, plan.blocks,
                                         kThreads, p, stream);
      return Status::from_cuda(e, "launching batch_norm_backward (cooperative)");
    });
  });
}

}  // namespace gemmbn
