// gemmbn kernel API: raw device pointers, sizes and a stream in; a Status out. No torch headers.
//
// Training forward of BatchNorm1d(Linear(x) * scale), two launches (train_forward makes both):
//   gemm_scale_stats  y = (x W^T + b) * s, plus per-(M-tile, column) mean and M2 of y
//   finish_normalize  merge the partials, update running statistics, out = y * alpha + delta
// Eval forward: fold_eval_affine (per-column gain/shift) + gemm_scale_stats with that affine.
// The fp32-faithful GEMM reads W as split_weight's fp16 pairs (once per weight version).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace gemmbn {

enum class DType : int { f32 = 0, bf16 = 1, f16 = 2 };

inline int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

// The GEMM's operand types, each with its own configuration table and instantiations (configs.h).
enum class GemmOperands : int {
  tf32 = 0,       // fp32 x and W on TF32 tensor cores
  bf16 = 1,
  f16 = 2,
  f32_split = 3,  // fp32 x and W as scaled fp16 pairs, three products per k-tile: fp32-faithful
};

struct Status {
  enum Code : int { ok = 0, invalid_argument, unsupported, cutlass_error, cuda_error };
  Code code = ok;
  cudaError_t cuda = cudaSuccess;
  const char* message = "";  // static string, never freed
  explicit operator bool() const { return code == ok; }
  static Status success() { return {}; }
  static Status invalid(const char* what) { return {invalid_argument, cudaSuccess, what}; }
  static Status from_cuda(cudaError_t e, const char* where) {
    return e == cudaSuccess ? Status{} : Status{cuda_error, e, where};
  }
};

// The GEMM and its epilogue:
//   y[m, n] = ((acc[m, n] + bias[n]) * scale[n]) * gain[n] + shift[n],   acc = x @ weight^T (fp32)
//   partial_mean[t, n], partial_m2[t, n] = mean and sum of squared deviations of y[m, n] as stored
//   (rounded to dtype) over the valid rows m of row block t (partial_rows of the configuration row
//   used, see gemm_config_row); where kRaggedTileFromY, only over full row blocks (t < M / partial_rows).
// Null vectors take the identity (bias 0, scale 1, gain 1, shift 0); null partials skip the statistics.
// batches_tracked, if not null, is incremented once by the launch (so the finish kernel, later on the
// same stream, reads the new count for momentum=None).
#ifndef GEMMBN_RAGGED_TILE_FROM_Y  // CMake sets it (0 or 1)
#define GEMMBN_RAGGED_TILE_FROM_Y 1
#endif
// CMake GEMMBN_RAGGED_TILE_FROM_Y (on since perf/NOTES.md v63; v61 for the design): the statistics node leaves a ragged
// last row block (M not a multiple of partial_rows) out, so the GEMM kernels carry no code for partial row blocks
// (45-70% of their SASS, though only the last row block of a ragged M runs it), and finish_normalize reads those rows'
// moments from y itself. Off: the node makes every row block's partials.
inline constexpr bool kRaggedTileFromY = GEMMBN_RAGGED_TILE_FROM_Y != 0;

struct GemmScaleStatsArgs {
  DType dtype = DType::f32;   // of x, weight, y, bias, scale; f32 runs TF32 tensor cores unless split
  const void* x = nullptr;    // [M, K] row-major
  const void* weight = nullptr;  // [N, K] row-major (nn.Linear layout); unused when split
  // fp32 only, all or none: the fp32-faithful GEMM on split_weight's output for `weight`; x_scale is
  // its workspace (row_scales runs first, on the same stream).
  const void* weight_split = nullptr;     // [N, split_weight_columns(K)] fp16
  const float* weight_unscale = nullptr;  // [N]
  float* x_scale = nullptr;               // [row_scale_count(M)]
  const unsigned* x_row_max_bits = nullptr;  // optional [M]: max_k |x[m, k]|'s bits, known (transpose_padded's)
  void* y = nullptr;          // [M, N] row-major
  int M = 0, N = 0, K = 0;
  const void* bias = nullptr;   // [N]
  const void* scale = nullptr;  // [N]
  const float* gain = nullptr;  // [N]
  const float* shift = nullptr; // [N]
  float* partial_mean = nullptr;  // [tiles_m, N]
  float* partial_m2 = nullptr;    // [tiles_m, N]
  int64_t* batches_tracked = nullptr;
  // Optional, with the partials: the finish's dataflow counters (tile_flow.h), zeroed on the stream before the launch;
  // each stored tile counts itself in them and the first epilogue lets a programmatic launch after it start
  // (train_forward sets it where the finish runs its dataflow walk).
  int* tile_flow = nullptr;
  // Stream-K rows only: gemm_workspace_bytes(args) bytes, owned by the caller (its first bytes are
  // zeroed on the stream before each launch); may be null where that size is 0.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Tuning overrides (perf/tune_gemm.py); the defaults take select_config's row and its schedule.
  int config = -1;   // row of the dtype's configuration table (configs.h)
  int raster = -1;   // tile order: 0 CUTLASS heuristic, 1 along M, 2 along N
  int swizzle = -1;  // tile scheduler's max swizzle size: 1, 2, 4 or 8 (-1: configs.h unpadded_swizzle's)
  int splits = -1;   // stream-K rows: > 1 splits every tile's K range that many ways (plain split-K), 1 CUTLASS's
                     // stream-K heuristic, -1 select_splits's choice
};

// The operand types of a dtype, split = the fp32-faithful GEMM (meaningful for f32 only).
inline GemmOperands gemm_operands(DType dtype, bool split) {
  if (dtype == DType::bf16) return GemmOperands::bf16;
  if (dtype == DType::f16) return GemmOperands::f16;
  return split ? GemmOperands::f32_split : GemmOperands::tf32;
}
// The operand types a call runs (dtype, and the split weight for f32).
inline GemmOperands gemm_operands(const GemmScaleStatsArgs& a) { return gemm_operands(a.dtype, a.weight_split); }
// The number of rows in the operands' configuration table (kernels/include/gemmbn/configs.h).
int gemm_config_count(GemmOperands operands);
// The rule's one device fact, the device's peak DRAM bandwidth in GB/s (0: unknown), or this value for the current
// device's (current_dram_gbps), queried only where the rule reads it.
inline constexpr int kCurrentDeviceDram = -1;
// The table row the GEMM runs for this problem when the call leaves config < 0; statistics: whether
// the call computes the partials (the training forward) or not (eval, the plain GEMM); dram_gbps: the device's peak
// DRAM bandwidth the rule reads.
int gemm_selected_config(GemmOperands operands, int M, int N, int K, bool statistics = true,
                         int dram_gbps = kCurrentDeviceDram);
// The current device's peak DRAM bandwidth in GB/s as select_config reads it, or 0 where it cannot be queried.
int device_dram_gbps();
// Row `config` of the table (config < 0: the row picked for the problem), as
// {tile_m, tile_n, tile_k, cluster_m, cluster_n, epilogue_n, pingpong, raster, swizzle, promote_tiles,
// stream_k, statistics, presplit, merge_per_tile, partial_rows}; partial_rows (last) is the number of rows per
// statistics partial, swizzle the one this problem's launch passes (the row's, reduced where it would pad tiles:
// configs.h unpadded_swizzle). False if config is out of range.
inline constexpr int kConfigFields = 15;
bool gemm_config_row(GemmOperands operands, int config, int M, int N, int K, int out[kConfigFields],
                     bool statistics = true);
// Workspace the call needs (args' dtype, split weight and partial_mean presence, M, N, K, config and
// splits are read; pointers are not): 0 for all but stream-K rows (queries the current device's SM count) and the
// split GEMM's presplit rows (x's pairs: M x split_weight_columns(K) fp16).
Status gemm_workspace_bytes(const GemmScaleStatsArgs& args, size_t& bytes);
Status gemm_scale_stats(const GemmScaleStatsArgs& args, cudaStream_t stream);

// W [N, K] fp32 -> the split GEMM's operand: per row n a power-of-two scale 2^b[n] putting max_k |W[n, k]|
// in [2^14, 2^15), and 2^b W[n, :] as fp16 hi + lo parts in the mainloop's k order (f16_split.cuh):
//   weight_split[n, 64 t + j]      = hi of 2^b W[n, 32 t + c(j)],  weight_split[n, 64 t + 32 + j] = its lo
//   (c: the column order within each 16-column slice; zeros past K),  weight_unscale[n] = 2^-b[n]
struct SplitWeightArgs {
  const float* weight = nullptr;  // [N, K]
  int N = 0, K = 0;
  void* weight_split = nullptr;     // [N, split_weight_columns(K)] fp16
  float* weight_unscale = nullptr;  // [N]
};
int64_t split_weight_columns(int K);
Status split_weight(const SplitWeightArgs& args, cudaStream_t stream);

// split_weight of t^T straight from t [R, C] fp32 (the backward's B operands x and W, whose reduction runs down
// their columns), without the transposed copy: bitwise split_weight(transpose_padded(t)), with N = C, K = R.
//   pass 1: column_max_bits[c] = bits of max_r |t[r, c]| (atomicMax on non-negative floats' bits: order-free,
//           deterministic);  pass 2: 32 x 64 tiles of t, split by column.
struct SplitColumnsArgs {
  const float* t = nullptr;  // [R, C] row-major
  int R = 0, C = 0;
  unsigned* column_max_bits = nullptr;  // [C] scratch (zeroed here, on the stream)
  void* split = nullptr;               // [C, split_weight_columns(R)] fp16
  float* unscale = nullptr;             // [C]
};
Status split_columns(const SplitColumnsArgs& args, cudaStream_t stream);

// x [M, K] fp32 -> x_scale[m] = 2^a[m], the power of two putting max_k |x[m, k]| in [2^14, 2^15), the
// split GEMM's per-row scale of x; padded to row_scale_count(M) entries (whole 128-row tiles; 1 there).
// With x_split: also 2^a[m] x[m, :] as fp16 pairs in split_weight's format (the presplit rows' A operand).
struct RowScalesArgs {
  const float* x = nullptr;  // [M, K]
  int M = 0, K = 0;
  float* x_scale = nullptr;  // [row_scale_count(M)]
  const unsigned* row_max_bits = nullptr;  // optional [M]: the maxima's bits, known; then x is not read (unless split)
  void* x_split = nullptr;   // optional [M, split_weight_columns(K)] fp16
};
int64_t row_scale_count(int M);
Status row_scales(const RowScalesArgs& args, cudaStream_t stream);

// Merge the per-tile partials of y (Chan's formula, fixed order, fp64) into mean_y and var_y (biased):
//   out = (y - mean_y) / sqrt(var_y + eps) * gamma + beta      (out may alias y)
//   running_mean <- (1-f) running_mean + f mean_y;  running_var <- (1-f) running_var + f var_y M/(M-1)
//   f = momentum, or 1 / batches_tracked when cumulative (momentum=None).
// partials_from_y: a pass over y makes the partials first (per row chunk of the launch's own work items,
// finish_partial_rows rows each, written into partial_mean/partial_m2) and increments batches_tracked, so the
// GEMM before it runs without its statistics node (train_statistics_from_y chooses).
struct FinishNormalizeArgs {
  DType dtype = DType::f32;  // of y, out, bias, scale, gamma, beta, running stats
  const void* y = nullptr;
  void* out = nullptr;
  int M = 0, N = 0;
  // [ceil(M / tile_rows), N], read (written first when partials_from_y); where kRaggedTileFromY and the partials are
  // the GEMM's (not from y, not rank_moments), only rows t < M / tile_rows are read and the rest of y's rows are.
  float* partial_mean = nullptr;
  float* partial_m2 = nullptr;
  int tile_rows = 128;
  bool partials_from_y = false;
  const void* gamma = nullptr;
  const void* beta = nullptr;
  void* running_mean = nullptr;  // both or neither
  void* running_var = nullptr;
  int64_t* batches_tracked = nullptr;  // read when cumulative; incremented when partials_from_y
  bool cumulative = false;
  double momentum = 0.1;
  double eps = 1e-5;
  float* save_mean = nullptr;    // [N] mean_y
  float* save_invstd = nullptr;  // [N] 1/sqrt(var_y + eps)
  // Batch statistics over a process group's ranks (issue 19: two launches around a collective; perf/NOTES.md v18):
  // - moments [3, N] (fp32): the launch stops after the column statistics and writes this batch's rows, mean_y and
  //   M2 = rows var_y per column (M >= 1); out, save_mean/save_invstd, the running statistics and batches_tracked are
  //   unused.
  // - rank_moments [ranks, 3, N] (fp32): the ranks' moments in rank order take the partials' place (partial_mean,
  //   partial_m2, tile_rows and partials_from_y unused): mean_y and var_y of all the ranks' rows normalize this
  //   batch's M >= 1 rows of y, and the running statistics move with them (unbiased over the ranks' rows);
  //   batches_tracked is read (momentum=None), not counted.
  float* moments = nullptr;
  const float* rank_moments = nullptr;
  int ranks = 0;
  // The product variant (partials_from_y, a normalizing launch; product_scale given selects it): y holds x W^T alone,
  // a vendor GEMM's (train_product_by_cublas), and every read of it forms y = (y + product_bias) product_scale rounded
  // to the dtype, the training GEMM's y; pre_norm (may alias y; null: not kept) receives that y. product_bias may be
  // null.
  const void* product_bias = nullptr;
  const void* product_scale = nullptr;
  void* pre_norm = nullptr;
  // The dataflow walk (train_forward sets it where finish_runs_dataflow; with the GEMM's partials only): the GEMM row's
  // tile_n, whose launch counts its stored tiles in finish_tile_flow(workspace, N) (zeroed before the GEMM: see
  // GemmScaleStatsArgs.tile_flow). The finish then starts while the GEMM runs and takes each column tile's statistics
  // and each stripe's rows as soon as the GEMM has stored them. 0: the barrier walk, after the GEMM.
  int tile_columns = 0;
  // finish_workspace_bytes(N) bytes of device memory, 16-byte aligned, for a normalizing launch (not moments): the
  // columns' alpha and delta from the statistics, and the counter its blocks claim normalize work items from where the
  // rule says so. Set up by the launch itself: its contents before and after mean nothing.
  void* workspace = nullptr;
};
size_t finish_workspace_bytes(int N);
// The dataflow walk's counters in a finish workspace (tile_flow.h), and the bytes of them a launch uses (tile_columns
// set), to zero on the stream before the GEMM.
int* finish_tile_flow(void* workspace, int N);
size_t finish_tile_flow_bytes(const FinishNormalizeArgs& args);
// Whether the training forward's finish runs the dataflow walk (the rule, or GEMMBN_FINISH_DATAFLOW=0|1 where set; never
// past the walk's limits).
bool finish_runs_dataflow(DType dtype, int64_t M, int N);
Status finish_normalize(const FinishNormalizeArgs& args, cudaStream_t stream);
// finish_normalize's argument checks alone (what it would refuse), without a launch.
Status finish_normalize_check(const FinishNormalizeArgs& args);
// The rows per partial of finish_normalize's pass over y (partials_from_y) for dtype, M and N on the current device.
Status finish_partial_rows(DType dtype, int M, int N, int& rows);
// Whether the training forward's statistics come from finish_normalize's pass over y (true) or the GEMM's epilogue:
// the rule (perf/NOTES.md v17, v24, v25), or GEMMBN_STATISTICS_SOURCE=epilogue|y where set (tests, A/B runs).
bool train_statistics_from_y(GemmOperands operands, int M, int N, int K);
// Whether the training forward's product x W^T is cuBLAS's (the operators call torch's mm into y, then finish_normalize's
// product variant: bias, scale, statistics from y) rather than gemm_scale_stats's: the rule (perf/NOTES.md v28), or
// GEMMBN_TRAIN_PRODUCT=cublas|gemmbn where set (tests, A/B runs). Only 16-bit operands, and only in a build with CMake
// GEMMBN_CUBLAS_PRODUCT=ON (an experiment; otherwise always false).
bool train_product_by_cublas(GemmOperands operands, int M, int N, int K);

// The training forward in one call: gemm_scale_stats then finish_normalize on the same stream, both
// calls' arguments checked before the first launch, so a refused call launches nothing (no running
// statistic or batches_tracked moves). The two must describe one problem: the finish reads the GEMM's
// y and partials (same pointers, M, N, dtype and batches_tracked; tile_rows the GEMM row's partial_rows).
// GEMMBN_TRAIN_TILE_ORDER=M|N[swizzle], where set, orders the GEMM's tiles when the call names no raster or swizzle
// (an experiment, perf/NOTES.md v35).
Status train_forward(const GemmScaleStatsArgs& gemm, const FinishNormalizeArgs& finish, cudaStream_t stream);

// Backward of the normalization and of the scale (python/gemmbn/backward.py has the whole step), per column
// n over the rows m, with d = y - mean and column sums in fp32 partials merged in fp64 in a fixed order:
//   dbeta = sum dout,   dgamma = invstd sum dout d,   a = gamma invstd
//   batch statistics: grad_y = a (dout - dbeta / M - d invstd dgamma / M),  sum_grad_y = -a invstd dgamma sum d / M
//   fixed statistics (eval; mean, invstd the running ones): grad_y = a dout,  sum_grad_y = a dbeta
//   dz = s grad_y (the operand of both gradient GEMMs: dx = dz W, dW = dz^T x),  dbias = s sum_grad_y
//   dscale = sum_m grad_y z: (sum_m grad_y y) / s where s != 0; sum_m grad_y (x_m . W_n + b_n) where s = 0
// sum_grad_y is sum_m grad_y in closed form (0 in exact arithmetic with batch statistics: BN removes the mean).
// One cooperative launch: the sums, their merge, dz with sum grad_y d, its merge, the zero-scale columns.
struct BatchNormBackwardArgs {
  DType dtype = DType::f32;     // of every tensor but mean, invstd and the workspace
  const void* dout = nullptr;   // [M, N]
  const void* y = nullptr;      // [M, N] the saved pre-normalization tensor; null only with fixed statistics
                                // and neither dgamma nor dscale
  void* dz = nullptr;           // [M, N], or null: no dz and no dscale
  int M = 0, N = 0;
  const float* mean = nullptr;    // [N]
  const float* invstd = nullptr;  // [N]
  const void* gamma = nullptr;    // [N], null: 1
  const void* scale = nullptr;    // [N], required
  // For dscale where s = 0: x [M, K], weight [N, K] (16-byte rows), bias [N] (null: 0).
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  int K = 0;
  bool batch_statistics = true;
  void* workspace = nullptr;      // batch_norm_backward_workspace_bytes(args) bytes
  size_t workspace_bytes = 0;
  void* dgamma = nullptr;  // [N] each; null: not computed
  void* dbeta = nullptr;
  void* dbias = nullptr;
  void* dscale = nullptr;  // needs dz, y, x and weight
  // Optional, float32 with dz: dz's transpose [N, dz_t_columns] (dz_t_columns = M rounded up to a multiple of 4, zero
  // past M) and the bits of max |dz| per row [M] and per column [N] (zeroed by the call): the split GEMM's operand of
  // dW = dz^T x and the row scales of dz and dz^T, without transpose_padded's pass over dz.
  float* dz_t = nullptr;
  int64_t dz_t_columns = 0;
  unsigned* dz_row_max_bits = nullptr;
  unsigned* dz_column_max_bits = nullptr;
  // Batch statistics over a process group's ranks (issue 19): two launches around the ranks' gather of their sums,
  // mean and invstd the global statistics (python/gemmbn/distributed.py).
  // - column_sums_out [3, N] fp64: the sums launch. It writes this batch's column sums of dout, dout d and d alone
  //   (d = y - mean; M >= 1); dz and the gradients must be null.
  // - local_sums [3, N], global_sums [2, N] fp64 and global_rows (one fp64 on the device): the gradients' launch.
  //   Its coefficients come from global_sums (the ranks' sums of dout and dout d added in rank order) over
  //   global_rows rows, not from a pass over this batch (M >= 1); dgamma, dbeta and sum_grad_y are this batch's own,
  //   from local_sums (its sums launch's). global_rows is the caller's (the forward's gathered count), read on the
  //   device: >= M.
  double* column_sums_out = nullptr;
  const double* local_sums = nullptr;
  const double* global_sums = nullptr;
  const double* global_rows = nullptr;
};
// Workspace the call needs (reads dtype, M and N; the current device's SM count sizes it).
Status batch_norm_backward_workspace_bytes(const BatchNormBackwardArgs& args, size_t& bytes);
Status batch_norm_backward(const BatchNormBackwardArgs& args, cudaStream_t stream);

// out[c, r] = in[r, c] for r < rows, 0 for rows <= r < out_columns: fp32 [rows, cols] -> [cols, out_columns], the
// split GEMM's operand layout where the reduction runs down in's columns (python/gemmbn/backward.py).
// Optionally also the bits of each row's and each column's largest magnitude (atomicMax on non-negative floats'
// bits: order-free, deterministic), the split GEMM's row scales of in and of out without a pass of their own.
struct TransposePaddedArgs {
  const float* in = nullptr;  // [rows, cols] row-major
  int64_t rows = 0, cols = 0;
  float* out = nullptr;       // [cols, out_columns] row-major
  int64_t out_columns = 0;    // >= rows
  unsigned* row_max_bits = nullptr;     // optional, with column_max_bits: [rows] max_c |in[r, c]| (zeroed here)
  unsigned* column_max_bits = nullptr;  // [cols] max_r |in[r, c]|, out's row maxima (zeroed here, on the stream)
};
Status transpose_padded(const TransposePaddedArgs& args, cudaStream_t stream);

// Eval-mode BatchNorm and the linear layer's bias b and scale s folded per column, for a GEMM then run without bias
// and scale: gain = s gamma / sqrt(running_var + eps), shift = beta + (b s - running_mean) gamma / sqrt(running_var + eps).
struct FoldEvalAffineArgs {
  DType dtype = DType::f32;  // of gamma, beta, running stats
  int N = 0;
  const void* gamma = nullptr;
  const void* beta = nullptr;
  const void* running_mean = nullptr;
  const void* running_var = nullptr;
  double eps = 1e-5;
  float* gain = nullptr;
  float* shift = nullptr;
  // Optional (null: b = 0, s = 1). Folding them leaves the epilogue two vectors to read instead of four, which
  // short K exposes (perf/NOTES.md v18).
  const void* bias = nullptr;
  const void* scale = nullptr;
};
Status fold_eval_affine(const FoldEvalAffineArgs& args, cudaStream_t stream);

// Points on a forward's host path: the host clock (CLOCK_MONOTONIC, ns) when this process last passed each (0: not
// yet), and that clock now. They split a call's host time before its GEMM runs without a profiler
// (perf/host_overhead.py --mark): the operator entered, the GEMM's checks done, the GEMM enqueued.
enum class HostMark : int { operator_entered = 0, gemm_launching = 1, gemm_enqueued = 2 };
constexpr int kHostMarks = 3;
void note_host_mark(HostMark mark);
int64_t host_mark_ns(HostMark mark);
int64_t monotonic_ns();

// True where the device can run the kernels (sm90); otherwise the reason.
Status device_support(int device);

}  // namespace gemmbn
