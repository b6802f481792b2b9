// torch.ops.gemmbn_debug: the kernels one at a time, into buffers the caller owns, with the configuration table's
// tuning overrides, plus the table and device queries. For tests, tuning and profiling (perf/); nothing on a
// forward or backward calls these (operators.cpp has those). Same checks and refusals as the operators.
#include <string>
#include <tuple>
#include <vector>

#include "gemmbn/configs.h"
#include "operator_support.h"

namespace {

using namespace gemmbn_operators;

gemmbn::DType parse_dtype(const std::string& name) {
  if (name == "float32") return gemmbn::DType::f32;
  if (name == "bfloat16") return gemmbn::DType::bf16;
  if (name == "float16") return gemmbn::DType::f16;
  fail("dtype must be 'float32', 'bfloat16' or 'float16', got '" + name + "'");
}

// The operand types of a (dtype, split) pair: split is the fp32-faithful GEMM, float32 only.
gemmbn::GemmOperands parse_operands(const std::string& dtype, bool split) {
  const gemmbn::DType t = parse_dtype(dtype);
  if (split && t != gemmbn::DType::f32) fail("the split GEMM takes float32, got '" + dtype + "'");
  return gemmbn::gemm_operands(t, split);
}

// (True, "") where the fused kernels run on this CUDA device, else (False, why not).
std::tuple<bool, std::string> device_support(int64_t device) {
  const gemmbn::Status s = gemmbn::device_support(int(device));
  std::string why = s.message ? s.message : "";
  if (s.code == gemmbn::Status::cuda_error) why += std::string(": ") + cudaGetErrorString(s.cuda);
  return {bool(s), why};
}

int64_t gemm_config_count(std::string dtype, bool split) {
  return gemmbn::gemm_config_count(parse_operands(dtype, split));
}

// Row `config` of the table (config < 0: the row chosen for the problem), api.h's kConfigFields fields in order.
std::vector<int64_t> gemm_config_row(std::string dtype, int64_t M, int64_t N, int64_t K, int64_t config, bool split,
                                     bool statistics) {
  int row[gemmbn::kConfigFields];
  if (!gemmbn::gemm_config_row(parse_operands(dtype, split), int(config), checked_int(M, "M"), checked_int(N, "N"),
                               checked_int(K, "K"), row, statistics)) {
    fail("config " + std::to_string(config) + " is not a row of the configuration table");
  }
  return std::vector<int64_t>(row, row + gemmbn::kConfigFields);
}

// dram_gbps: the DRAM peak the rule reads (-1: the current device's, 0: unknown), for tests of either device's rows.
int64_t gemm_selected_config(std::string dtype, int64_t M, int64_t N, int64_t K, bool split, bool statistics,
                             int64_t dram_gbps) {
  if (dram_gbps < gemmbn::kCurrentDeviceDram || dram_gbps > INT32_MAX) {
    fail("dram_gbps = " + std::to_string(dram_gbps) + ": -1 (the current device's), 0 (unknown) or GB/s are accepted");
  }
  return gemmbn::gemm_selected_config(parse_operands(dtype, split), checked_int(M, "M"), checked_int(N, "N"),
                                      checked_int(K, "K"), statistics, int(dram_gbps));
}

int64_t device_dram_gbps() { return gemmbn::device_dram_gbps(); }

// Whether this build's GEMM leaves a ragged last row block's partials to finish_normalize (api.h kRaggedTileFromY).
bool ragged_tile_from_y() { return gemmbn::kRaggedTileFromY; }

// The split of each tile's K range a stream-K row's call gets from the rule (configs.h select_splits; 1: CUTLASS's
// stream-K heuristic).
int64_t gemm_selected_splits(int64_t M, int64_t N) {
  return gemmbn::select_splits(checked_int(M, "M"), checked_int(N, "N"));
}

// Whether a training forward of this problem takes its statistics from finish_normalize's pass over y (api.h:
// train_statistics_from_y; GEMMBN_STATISTICS_SOURCE overrides the rule).
bool train_statistics_from_y(std::string dtype, int64_t M, int64_t N, int64_t K, bool split) {
  return gemmbn::train_statistics_from_y(parse_operands(dtype, split), checked_int(M, "M"), checked_int(N, "N"),
                                         checked_int(K, "K"));
}

// Whether the training forward's product is cuBLAS's (api.h: train_product_by_cublas; GEMMBN_TRAIN_PRODUCT overrides).
bool train_product_by_cublas(std::string dtype, int64_t M, int64_t N, int64_t K) {
  return gemmbn::train_product_by_cublas(parse_operands(dtype, false), checked_int(M, "M"), checked_int(N, "N"),
                                         checked_int(K, "K"));
}

// The host clock (CLOCK_MONOTONIC, ns) at this process's last GEMM launch (0: none yet), and now (api.h).
// mark: a gemmbn::HostMark's number (0: the operator entered, 1: the GEMM's checks done, 2: the GEMM enqueued).
int64_t host_mark_ns(int64_t mark) {
  if (mark < 0 || mark >= gemmbn::kHostMarks) {
    fail("mark must be 0 (operator entered), 1 (GEMM launching) or 2 (GEMM enqueued), got " + std::to_string(mark));
  }
  return gemmbn::host_mark_ns(static_cast<gemmbn::HostMark>(mark));
}
int64_t monotonic_ns() { return gemmbn::monotonic_ns(); }

int64_t gemm_workspace_bytes(std::string dtype, int64_t M, int64_t N, int64_t K, int64_t config, bool split,
                             int64_t splits, bool statistics, int64_t raster, int64_t swizzle) {
  gemmbn::GemmScaleStatsArgs a;
  a.dtype = parse_dtype(dtype);
  (void)parse_operands(dtype, split);
  // The query reads only whether a split weight and partials are given, not their contents.
  static const char split_marker = 0;
  static float statistics_marker = 0.f;
  if (split) a.weight_split = &split_marker;
  if (statistics) a.partial_mean = a.partial_m2 = &statistics_marker;
  a.M = checked_int(M, "M"), a.N = checked_int(N, "N"), a.K = checked_int(K, "K");
  // A stream-K row's workspace depends on its tile order: the swizzle pads the tile grid (configs.h unpadded_swizzle).
  a.config = int(config), a.splits = int(splits), a.raster = int(raster), a.swizzle = int(swizzle);
  size_t bytes = 0;
  raise_on_error(gemmbn::gemm_workspace_bytes(a, bytes));
  return int64_t(bytes);
}

int64_t split_weight_columns(int64_t K) { return gemmbn::split_weight_columns(checked_int(K, "K")); }
int64_t row_scale_count(int64_t M) { return gemmbn::row_scale_count(checked_int(M, "M")); }

float* float_pointer(const OptionalTensor& t, const char* name, const Problem& p, std::initializer_list<int64_t> shape) {
  if (!t) return nullptr;
  check(*t, name, p, ScalarType::Float, shape);
  return static_cast<float*>(t->data_ptr());
}

// y = ((x W^T + bias) scale) gain + shift with the per-tile column mean/M2 of y as stored into partial_mean/m2
// (both or neither; [ceil(M / partial_rows), N] of the row used). config/raster/swizzle/splits: tuning overrides
// (-1: the defaults). weight_split/weight_unscale with x_scale (float32 [row_scale_count(M)]): the split GEMM.
void gemm_scale_stats(Tensor x, Tensor weight, Tensor y, OptionalTensor bias, OptionalTensor scale,
                      OptionalTensor gain, OptionalTensor shift, OptionalTensor partial_mean,
                      OptionalTensor partial_m2, OptionalTensor batches_tracked, int64_t config, int64_t raster,
                      int64_t swizzle, int64_t splits, OptionalTensor weight_split, OptionalTensor weight_unscale,
                      OptionalTensor x_scale, OptionalTensor workspace) {
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch unused;
  std::optional<size_t> unused_at;
  gemmbn::GemmScaleStatsArgs a = gemm_arguments(x, weight, bias, scale, weight_split, weight_unscale, p, unused, unused_at);
  if (weight_split.has_value() != x_scale.has_value()) fail("weight_split, weight_unscale and x_scale go together");
  a.x_scale = float_pointer(x_scale, "x_scale", p, {gemmbn::row_scale_count(a.M)});
  check(y, "y", p, p.dtype, {a.M, a.N});
  a.y = y.data_ptr();
  a.gain = float_pointer(gain, "gain", p, {a.N});
  a.shift = float_pointer(shift, "shift", p, {a.N});
  a.config = int(config), a.raster = int(raster), a.swizzle = int(swizzle), a.splits = int(splits);
  if (partial_mean.has_value() != partial_m2.has_value()) fail("partial_mean and partial_m2 go together");
  if (partial_mean) {
    int row[gemmbn::kConfigFields];
    if (!gemmbn::gemm_config_row(gemmbn::gemm_operands(a), a.config, a.M, a.N, a.K, row)) {
      fail("config is not a row of the configuration table");
    }
    const int64_t tile_rows = row[gemmbn::kConfigFields - 1], tiles = (a.M + tile_rows - 1) / tile_rows;
    a.partial_mean = float_pointer(partial_mean, "partial_mean", p, {tiles, a.N});
    a.partial_m2 = float_pointer(partial_m2, "partial_m2", p, {tiles, a.N});
  }
  a.batches_tracked = counter(batches_tracked, "batches_tracked", p);
  if (workspace) {
    if (workspace->dim() != 1) fail("workspace must be 1-D, got shape " + shape_string(*workspace));
    check(*workspace, "workspace", p, ScalarType::Byte, {workspace->size(0)});
    a.workspace = workspace->data_ptr(), a.workspace_bytes = size_t(workspace->size(0));
  }
  raise_on_error(gemmbn::gemm_scale_stats(a, current_stream(p.device)));
}

// Merge the partials, update the running statistics, out = (y - mean) invstd gamma + beta (api.h: finish_normalize).
void finish_normalize(Tensor y, Tensor out, Tensor partial_mean, Tensor partial_m2, int64_t tile_rows,
                      OptionalTensor gamma, OptionalTensor beta, OptionalTensor running_mean,
                      OptionalTensor running_var, OptionalTensor batches_tracked, std::optional<double> momentum,
                      double eps, Tensor save_mean, Tensor save_invstd) {
  const Problem p = problem_of(y, "y");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::FinishNormalizeArgs a;
  a.dtype = p.kernel_dtype;
  a.M = checked_int(y.size(0), "M");
  a.N = checked_int(y.size(1), "N");
  if (tile_rows < 1) fail("tile_rows must be positive");
  a.tile_rows = int(tile_rows);
  const int64_t tiles = (a.M + tile_rows - 1) / tile_rows;
  check(y, "y", p, p.dtype, {a.M, a.N});
  check(out, "out", p, p.dtype, {a.M, a.N});
  a.y = y.data_ptr(), a.out = out.data_ptr();
  a.partial_mean = float_pointer(partial_mean, "partial_mean", p, {tiles, a.N});
  a.partial_m2 = float_pointer(partial_m2, "partial_m2", p, {tiles, a.N});
  a.gamma = read_vector(gamma, "gamma", p, a.N);
  a.beta = read_vector(beta, "beta", p, a.N);
  if (running_mean.has_value() != running_var.has_value()) fail("running_mean and running_var go together");
  a.running_mean = written_vector(running_mean, "running_mean", p, a.N);
  a.running_var = written_vector(running_var, "running_var", p, a.N);
  a.batches_tracked = counter(batches_tracked, "batches_tracked", p);
  a.cumulative = !momentum.has_value();
  a.momentum = momentum.value_or(0.0);
  if (!(eps > 0)) fail("eps must be positive");
  a.eps = eps;
  a.save_mean = float_pointer(save_mean, "save_mean", p, {a.N});
  a.save_invstd = float_pointer(save_invstd, "save_invstd", p, {a.N});
  const Scratch scratch = bind_finish_workspace(a, y);
  raise_on_error(gemmbn::finish_normalize(a, current_stream(p.device)));
}

// gain = s gamma / sqrt(running_var + eps), shift = beta + (b s - running_mean) gamma / sqrt(running_var + eps), float32,
// bias b and scale s optional (0 and 1) (api.h: fold_eval_affine).
void fold_eval_affine(OptionalTensor gamma, OptionalTensor beta, OptionalTensor bias, OptionalTensor scale,
                      Tensor running_mean, Tensor running_var, double eps, Tensor gain, Tensor shift) {
  if (!running_mean.is_cuda() || running_mean.dim() != 1) fail("running_mean must be a 1-D CUDA tensor");
  const Problem p{running_mean.scalar_type(), kernel_dtype(running_mean.scalar_type(), "running_mean"),
                  running_mean.get_device_index()};
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::FoldEvalAffineArgs a;
  a.dtype = p.kernel_dtype;
  a.N = checked_int(running_mean.size(0), "N");
  running_mean = readable(running_mean, "running_mean", p, p.dtype, {a.N});
  running_var = readable(running_var, "running_var", p, p.dtype, {a.N});
  a.running_mean = running_mean.data_ptr();
  a.running_var = running_var.data_ptr();
  a.gamma = read_vector(gamma, "gamma", p, a.N);
  a.beta = read_vector(beta, "beta", p, a.N);
  a.bias = read_vector(bias, "bias", p, a.N);
  a.scale = read_vector(scale, "scale", p, a.N);
  if (!(eps > 0)) fail("eps must be positive");
  a.eps = eps;
  a.gain = float_pointer(gain, "gain", p, {a.N});
  a.shift = float_pointer(shift, "shift", p, {a.N});
  raise_on_error(gemmbn::fold_eval_affine(a, current_stream(p.device)));
}

}  // namespace

STABLE_TORCH_LIBRARY(gemmbn_debug, m) {
  m.def("device_support(int device) -> (bool, str)");
  m.def("gemm_config_count(str dtype, bool split) -> int");
  m.def("gemm_config_row(str dtype, int M, int N, int K, int config, bool split, bool statistics) -> int[]");
  m.def("gemm_selected_config(str dtype, int M, int N, int K, bool split, bool statistics, int dram_gbps) -> int");
  m.def("device_dram_gbps() -> int");
  m.def("ragged_tile_from_y() -> bool");
  m.def("gemm_selected_splits(int M, int N) -> int");
  m.def("train_statistics_from_y(str dtype, int M, int N, int K, bool split) -> bool");
  m.def("train_product_by_cublas(str dtype, int M, int N, int K) -> bool");
  m.def("host_mark_ns(int mark) -> int");
  m.def("monotonic_ns() -> int");
  m.def("gemm_workspace_bytes(str dtype, int M, int N, int K, int config, bool split, int splits, "
        "bool statistics, int raster=-1, int swizzle=-1) -> int");
  m.def("split_weight_columns(int K) -> int");
  m.def("row_scale_count(int M) -> int");
  m.def("gemm_scale_stats(Tensor x, Tensor weight, Tensor(a!) y, Tensor? bias, Tensor? scale, Tensor? gain, "
        "Tensor? shift, Tensor(b!)? partial_mean, Tensor(c!)? partial_m2, Tensor(d!)? batches_tracked, int config, "
        "int raster, int swizzle, int splits, Tensor? weight_split, Tensor? weight_unscale, Tensor(e!)? x_scale, "
        "Tensor(f!)? workspace) -> ()");
  m.def("finish_normalize(Tensor y, Tensor(a!) out, Tensor partial_mean, Tensor partial_m2, int tile_rows, "
        "Tensor? gamma, Tensor? beta, Tensor(b!)? running_mean, Tensor(c!)? running_var, Tensor? batches_tracked, "
        "float? momentum, float eps, Tensor(d!) save_mean, Tensor(e!) save_invstd) -> ()");
  m.def("fold_eval_affine(Tensor? gamma, Tensor? beta, Tensor? bias, Tensor? scale, Tensor running_mean, "
        "Tensor running_var, float eps, Tensor(a!) gain, Tensor(b!) shift) -> ()");
}

// The queries take no tensor: they run under any dispatch key (CompositeExplicitAutograd covers them all).
STABLE_TORCH_LIBRARY_IMPL(gemmbn_debug, CompositeExplicitAutograd, m) {
  m.impl("device_support", TORCH_BOX(&device_support));
  m.impl("gemm_config_count", TORCH_BOX(&gemm_config_count));
  m.impl("gemm_config_row", TORCH_BOX(&gemm_config_row));
  m.impl("gemm_selected_config", TORCH_BOX(&gemm_selected_config));
  m.impl("device_dram_gbps", TORCH_BOX(&device_dram_gbps));
  m.impl("ragged_tile_from_y", TORCH_BOX(&ragged_tile_from_y));
  m.impl("gemm_selected_splits", TORCH_BOX(&gemm_selected_splits));
  m.impl("train_statistics_from_y", TORCH_BOX(&train_statistics_from_y));
  m.impl("train_product_by_cublas", TORCH_BOX(&train_product_by_cublas));
  m.impl("host_mark_ns", TORCH_BOX(&host_mark_ns));
  m.impl("monotonic_ns", TORCH_BOX(&monotonic_ns));
  m.impl("gemm_workspace_bytes", TORCH_BOX(&gemm_workspace_bytes));
  m.impl("split_weight_columns", TORCH_BOX(&split_weight_columns));
  m.impl("row_scale_count", TORCH_BOX(&row_scale_count));
}

#define GEMMBN_REGISTER_DEBUG_KERNELS(m)                         \
  m.impl("gemm_scale_stats", TORCH_BOX(&gemm_scale_stats));      \
  m.impl("finish_normalize", TORCH_BOX(&finish_normalize));      \
  m.impl("fold_eval_affine", TORCH_BOX(&fold_eval_affine))

STABLE_TORCH_LIBRARY_IMPL(gemmbn_debug, CUDA, m) { GEMMBN_REGISTER_DEBUG_KERNELS(m); }
STABLE_TORCH_LIBRARY_IMPL(gemmbn_debug, CPU, m) { GEMMBN_REGISTER_DEBUG_KERNELS(m); }
