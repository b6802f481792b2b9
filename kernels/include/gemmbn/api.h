// gemmbn kernel API: raw device pointers, sizes and a stream in; a Status out. No torch headers.
//
// Training forward of BatchNorm1d(Linear(x) * scale), two launches:
//   gemm_scale_stats  y = (x W^T + b) * s, plus per-(M-tile, column) mean and M2 of y
//   finish_normalize  merge the partials, update running statistics, out = y * alpha + delta
// Eval forward: fold_eval_affine (per-column gain/shift) + gemm_scale_stats with that affine.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace gemmbn {

enum class DType : int { f32 = 0, bf16 = 1, f16 = 2 };

inline int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

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
//   (rounded to dtype) over the valid rows m of M-tile t (tile height = tile_m of the configuration row used, see gemm_config_row).
// Null vectors take the identity (bias 0, scale 1, gain 1, shift 0); null partials skip the statistics.
// batches_tracked, if not null, is incremented once by the launch (so the finish kernel, later on the
// same stream, reads the new count for momentum=None).
struct GemmScaleStatsArgs {
  DType dtype = DType::f32;   // of x, weight, y, bias, scale; f32 runs TF32 tensor cores
  const void* x = nullptr;    // [M, K] row-major
  const void* weight = nullptr;  // [N, K] row-major (nn.Linear layout)
  void* y = nullptr;          // [M, N] row-major
  int M = 0, N = 0, K = 0;
  const void* bias = nullptr;   // [N]
  const void* scale = nullptr;  // [N]
  const float* gain = nullptr;  // [N]
  const float* shift = nullptr; // [N]
  float* partial_mean = nullptr;  // [tiles_m, N]
  float* partial_m2 = nullptr;    // [tiles_m, N]
  int64_t* batches_tracked = nullptr;
  // Tuning overrides (perf/tune_gemm.py); the defaults take select_config's row and its schedule.
  int config = -1;   // row of the dtype's configuration table (configs.h)
  int raster = -1;   // tile order: 0 CUTLASS heuristic, 1 along M, 2 along N
  int swizzle = -1;  // tile scheduler's max swizzle size: 1, 2, 4 or 8
};

// The number of rows in a dtype's configuration table (kernels/include/gemmbn/configs.h).
int gemm_config_count(DType dtype);
// Row `config` of the table (config < 0: the row picked for the problem), as
// {tile_m, tile_n, tile_k, cluster_m, cluster_n, epilogue_n, pingpong, raster, swizzle}; tile_m is the
// number of rows per statistics partial. False if config is out of range.
inline constexpr int kConfigFields = 9;
bool gemm_config_row(DType dtype, int config, int M, int N, int K, int out[kConfigFields]);
Status gemm_scale_stats(const GemmScaleStatsArgs& args, cudaStream_t stream);

// y = (acc + bias) * scale in place or into y, with the same partials of y as gemm_scale_stats over
// tiles of tile_rows rows (fp32 only: the interim fp32-exact path after an SGEMM).
struct BiasScaleMomentsArgs {
  const float* acc = nullptr;  // [M, N]
  float* y = nullptr;          // [M, N], may equal acc
  int M = 0, N = 0;
  const float* bias = nullptr;
  const float* scale = nullptr;
  float* partial_mean = nullptr;
  float* partial_m2 = nullptr;
  int tile_rows = 128;
  int64_t* batches_tracked = nullptr;
};
Status bias_scale_moments(const BiasScaleMomentsArgs& args, cudaStream_t stream);

// Merge the per-tile partials of y (Chan's formula, fixed order, fp64) into mean_y and var_y (biased):
//   out = (y - mean_y) / sqrt(var_y + eps) * gamma + beta      (out may alias y)
//   running_mean <- (1-f) running_mean + f mean_y;  running_var <- (1-f) running_var + f var_y M/(M-1)
//   f = momentum, or 1 / batches_tracked when cumulative (momentum=None).
struct FinishNormalizeArgs {
  DType dtype = DType::f32;  // of y, out, bias, scale, gamma, beta, running stats
  const void* y = nullptr;
  void* out = nullptr;
  int M = 0, N = 0;
  const float* partial_mean = nullptr;
  const float* partial_m2 = nullptr;
  int tile_rows = 128;
  const void* gamma = nullptr;
  const void* beta = nullptr;
  void* running_mean = nullptr;  // both or neither
  void* running_var = nullptr;
  const int64_t* batches_tracked = nullptr;  // read when cumulative
  bool cumulative = false;
  double momentum = 0.1;
  double eps = 1e-5;
  float* save_mean = nullptr;    // [N] mean_y
  float* save_invstd = nullptr;  // [N] 1/sqrt(var_y + eps)
};
Status finish_normalize(const FinishNormalizeArgs& args, cudaStream_t stream);

// Eval-mode affine folded per column: gain = gamma / sqrt(running_var + eps), shift = beta - running_mean * gain.
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
};
Status fold_eval_affine(const FoldEvalAffineArgs& args, cudaStream_t stream);

// True where the device can run the kernels (sm90); otherwise the reason.
Status device_support(int device);

}  // namespace gemmbn
