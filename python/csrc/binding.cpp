// gemmbn._C: the kernels behind a nanobind module. Arrays arrive by DLPack (torch tensors zero-copy),
// the stream as an integer. Everything is checked here before a launch; a failed check raises and
// launches nothing, so no output or running statistic moves. No torch headers, no torch link.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gemmbn/api.h"

namespace nb = nanobind;
using gemmbn::DType;
using gemmbn::Status;

namespace {

using Array = nb::ndarray<>;
using OptionalArray = std::optional<nb::ndarray<>>;

[[noreturn]] void fail(const std::string& message) { throw nb::value_error(("gemmbn: " + message).c_str()); }

std::string dtype_name(nb::dlpack::dtype t) {
  if (t == nb::dtype<float>()) return "float32";
  if (t == nb::dtype<double>()) return "float64";
  if (t == nb::dtype<int64_t>()) return "int64";
  if (t == nb::dtype<uint8_t>()) return "uint8";
  if (t.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return "bfloat16";
  if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 16) return "float16";
  return "dtype(code=" + std::to_string(t.code) + ", bits=" + std::to_string(t.bits) + ")";
}

DType parse_dtype(const std::string& name) {
  if (name == "float32") return DType::f32;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16") return DType::f16;
  fail("dtype must be 'float32', 'bfloat16' or 'float16', got '" + name + "'");
}

// The operand types of a (dtype, split) pair: split is the fp32-faithful GEMM, float32 only.
gemmbn::GemmOperands parse_operands(const std::string& dtype, bool split) {
  const DType t = parse_dtype(dtype);
  if (split && t != DType::f32) fail("the split GEMM takes float32, got '" + dtype + "'");
  return gemmbn::gemm_operands(t, split);
}

const char* dtype_string(DType t) { return t == DType::f32 ? "float32" : t == DType::bf16 ? "bfloat16" : "float16"; }

DType dtype_of(const Array& a, const char* name) {
  const std::string n = dtype_name(a.dtype());
  if (n == "float32" || n == "bfloat16" || n == "float16") return parse_dtype(n);
  fail(std::string(name) + " has dtype " + n + "; accepted: float32, bfloat16, float16");
}

int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) fail("no CUDA device is available");
  return device;
}

std::string shape_string(const Array& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

// A CUDA array on the current device, C-contiguous, of the given shape and dtype name.
void check(const Array& a, const char* name, std::initializer_list<int64_t> shape, const std::string& dtype) {
  if (a.device_type() != nb::device::cuda::value) fail(std::string(name) + " must be a CUDA array");
  if (a.device_id() != current_device()) {
    fail(std::string(name) + " is on device " + std::to_string(a.device_id()) + ", the current device is " +
         std::to_string(current_device()));
  }
  if (dtype_name(a.dtype()) != dtype) fail(std::string(name) + " must be " + dtype + ", got " + dtype_name(a.dtype()));
  bool shape_ok = a.ndim() == shape.size();
  size_t i = 0;
  for (int64_t extent : shape) shape_ok = shape_ok && int64_t(a.shape(i++)) == extent;
  if (!shape_ok) {
    std::string want = "[";
    i = 0;
    for (int64_t extent : shape) want += (i++ ? ", " : "") + std::to_string(extent);
    fail(std::string(name) + " must have shape " + want + "], got " + shape_string(a));
  }
  int64_t expected_stride = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expected_stride) fail(std::string(name) + " must be C-contiguous");
    expected_stride *= a.shape(d);
  }
}

const void* optional_vector(const OptionalArray& a, const char* name, int64_t n, const std::string& dtype) {
  if (!a) return nullptr;
  check(*a, name, {n}, dtype);
  return a->data();
}

int64_t* optional_counter(const OptionalArray& a) {
  if (!a) return nullptr;
  const bool scalar = a->ndim() == 0 || (a->ndim() == 1 && a->shape(0) == 1);
  if (!scalar) fail("batches_tracked must hold one element, got shape " + shape_string(*a));
  if (a->ndim() == 0) {
    if (a->device_type() != nb::device::cuda::value || dtype_name(a->dtype()) != "int64") {
      fail("batches_tracked must be a CUDA int64 array");
    }
  } else {
    check(*a, "batches_tracked", {1}, "int64");
  }
  return static_cast<int64_t*>(a->data());
}

int checked_int(int64_t v, const char* name) {
  if (v < 0 || v > INT32_MAX) fail(std::string(name) + " = " + std::to_string(v) + " is outside [0, 2^31)");
  return static_cast<int>(v);
}

void raise_on_error(const Status& s) {
  if (s) return;
  if (s.code == Status::invalid_argument || s.code == Status::unsupported) fail(s.message);
  std::string what = std::string("gemmbn: ") + s.message;
  if (s.code == Status::cuda_error) what += ": " + std::string(cudaGetErrorString(s.cuda));
  throw std::runtime_error(what);
}

cudaStream_t as_stream(std::uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

// gemm_scale_stats's arguments from checked arrays, all but the partials and batches_tracked.
gemmbn::GemmScaleStatsArgs gemm_arguments(const Array& x, const Array& weight, const Array& y,
                                          const OptionalArray& bias, const OptionalArray& scale,
                                          const OptionalArray& gain, const OptionalArray& shift,
                                          const OptionalArray& weight_split, const OptionalArray& weight_unscale,
                                          const OptionalArray& x_scale, const OptionalArray& workspace) {
  if (x.ndim() != 2 || weight.ndim() != 2) fail("x and weight must be 2-D");
  gemmbn::GemmScaleStatsArgs a;
  if (workspace) {
    if (workspace->ndim() != 1) fail("workspace must be 1-D, got shape " + shape_string(*workspace));
    check(*workspace, "workspace", {int64_t(workspace->shape(0))}, "uint8");
    a.workspace = workspace->data();
    a.workspace_bytes = workspace->shape(0);
  }
  a.dtype = dtype_of(x, "x");
  if (weight_split.has_value() != weight_unscale.has_value() || weight_split.has_value() != x_scale.has_value()) {
    fail("weight_split, weight_unscale and x_scale go together");
  }
  const std::string dt = dtype_string(a.dtype);
  a.M = checked_int(x.shape(0), "M");
  a.K = checked_int(x.shape(1), "K");
  a.N = checked_int(weight.shape(0), "N");
  check(x, "x", {a.M, a.K}, dt);
  check(weight, "weight", {a.N, a.K}, dt);
  check(y, "y", {a.M, a.N}, dt);
  a.x = x.data(), a.weight = weight.data(), a.y = y.data();
  if (weight_split) {
    if (a.dtype != DType::f32) fail("weight_split (the fp32-faithful GEMM) needs float32 x");
    check(*weight_split, "weight_split", {a.N, gemmbn::split_weight_columns(a.K)}, "float16");
    check(*weight_unscale, "weight_unscale", {a.N}, "float32");
    check(*x_scale, "x_scale", {gemmbn::row_scale_count(a.M)}, "float32");
    a.weight_split = weight_split->data();
    a.weight_unscale = static_cast<const float*>(weight_unscale->data());
    a.x_scale = static_cast<float*>(x_scale->data());
  }
  a.bias = optional_vector(bias, "bias", a.N, dt);
  a.scale = optional_vector(scale, "scale", a.N, dt);
  a.gain = static_cast<const float*>(optional_vector(gain, "gain", a.N, "float32"));
  a.shift = static_cast<const float*>(optional_vector(shift, "shift", a.N, "float32"));
  return a;
}

// Rows per statistics partial of the row the launch runs (a.config, or the one chosen with partials).
int64_t partial_rows(const gemmbn::GemmScaleStatsArgs& a) {
  int row[gemmbn::kConfigFields];
  if (!gemmbn::gemm_config_row(gemmbn::gemm_operands(a), a.config, a.M, a.N, a.K, row)) {
    fail("config is not a row of the configuration table");
  }
  return row[gemmbn::kConfigFields - 1];
}

// finish_normalize's arguments from checked arrays over y [M, N], all but the partials.
gemmbn::FinishNormalizeArgs finish_arguments(const Array& y, const Array& out, int tile_rows,
                                             const OptionalArray& gamma, const OptionalArray& beta,
                                             const OptionalArray& running_mean, const OptionalArray& running_var,
                                             const OptionalArray& batches_tracked, std::optional<double> momentum,
                                             double eps, const Array& save_mean, const Array& save_invstd) {
  if (y.ndim() != 2) fail("y must be 2-D");
  gemmbn::FinishNormalizeArgs a;
  a.dtype = dtype_of(y, "y");
  const std::string dt = dtype_string(a.dtype);
  a.M = checked_int(y.shape(0), "M");
  a.N = checked_int(y.shape(1), "N");
  if (tile_rows < 1) fail("tile_rows must be positive");
  a.tile_rows = tile_rows;
  check(y, "y", {a.M, a.N}, dt);
  check(out, "out", {a.M, a.N}, dt);
  check(save_mean, "save_mean", {a.N}, "float32");
  check(save_invstd, "save_invstd", {a.N}, "float32");
  if (running_mean.has_value() != running_var.has_value()) fail("running_mean and running_var go together");
  if (!(eps > 0)) fail("eps must be positive");
  a.y = y.data(), a.out = out.data();
  a.gamma = optional_vector(gamma, "gamma", a.N, dt);
  a.beta = optional_vector(beta, "beta", a.N, dt);
  a.running_mean = const_cast<void*>(optional_vector(running_mean, "running_mean", a.N, dt));
  a.running_var = const_cast<void*>(optional_vector(running_var, "running_var", a.N, dt));
  a.batches_tracked = optional_counter(batches_tracked);
  a.cumulative = !momentum.has_value();
  a.momentum = momentum.value_or(0.0);
  a.eps = eps;
  a.save_mean = static_cast<float*>(save_mean.data());
  a.save_invstd = static_cast<float*>(save_invstd.data());
  return a;
}

// fold_eval_affine's arguments from checked arrays, all but gain and shift.
gemmbn::FoldEvalAffineArgs fold_arguments(const OptionalArray& gamma, const OptionalArray& beta,
                                          const Array& running_mean, const Array& running_var, double eps) {
  if (running_mean.ndim() != 1) fail("running_mean must be 1-D");
  gemmbn::FoldEvalAffineArgs a;
  a.dtype = dtype_of(running_mean, "running_mean");
  const std::string dt = dtype_string(a.dtype);
  a.N = checked_int(running_mean.shape(0), "N");
  check(running_mean, "running_mean", {a.N}, dt);
  check(running_var, "running_var", {a.N}, dt);
  if (!(eps > 0)) fail("eps must be positive");
  a.gamma = optional_vector(gamma, "gamma", a.N, dt);
  a.beta = optional_vector(beta, "beta", a.N, dt);
  a.running_mean = running_mean.data(), a.running_var = running_var.data();
  a.eps = eps;
  return a;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "gemmbn kernels: fused GEMM + scale + BatchNorm statistics on Hopper (sm_90a)";

  m.def("device_support", [](int device) -> std::pair<bool, std::string> {
    Status s = gemmbn::device_support(device);
    if (s.code == Status::cuda_error) return {false, std::string(s.message) + ": " + cudaGetErrorString(s.cuda)};
    return {bool(s), s.message};
  }, nb::arg("device"), "(True, '') where the fused kernels run on this CUDA device, else (False, reason).");

  m.def("gemm_config", [](const std::string& dtype, int64_t M, int64_t N, int64_t K, int config,
                          bool split, bool statistics) -> std::pair<int, int> {
    int row[gemmbn::kConfigFields];
    if (!gemmbn::gemm_config_row(parse_operands(dtype, split), config, checked_int(M, "M"), checked_int(N, "N"),
                                 checked_int(K, "K"), row, statistics)) {
      fail("config is not a row of the configuration table");
    }
    return {row[gemmbn::kConfigFields - 1], row[1]};
  }, nb::arg("dtype"), nb::arg("M"), nb::arg("N"), nb::arg("K"), nb::arg("config") = -1, nb::arg("split") = false,
     nb::arg("statistics") = true,
     "(partial_rows, tile_n) of the GEMM configuration row used for this problem (config < 0: the one chosen "
     "for it); partial_rows rows per statistics partial. split: the fp32-faithful GEMM's table. statistics:\n"
     "the choice for a launch with partials (False: without, as the eval forward).");

  m.def("gemm_selected_config", [](const std::string& dtype, int64_t M, int64_t N, int64_t K, bool split,
                                   bool statistics) {
    return gemmbn::gemm_selected_config(parse_operands(dtype, split), checked_int(M, "M"), checked_int(N, "N"),
                                        checked_int(K, "K"), statistics);
  }, nb::arg("dtype"), nb::arg("M"), nb::arg("N"), nb::arg("K"), nb::arg("split") = false,
     nb::arg("statistics") = true,
     "Index of the configuration row (gemm_configs) the GEMM runs for this problem by default (statistics:\n"
     "a launch with partials; False: without).");

  m.def("gemm_configs", [](const std::string& dtype, bool split) {
    const gemmbn::GemmOperands operands = parse_operands(dtype, split);
    std::vector<std::map<std::string, int>> rows;
    static const char* names[gemmbn::kConfigFields] = {
        "tile_m",   "tile_n", "tile_k",  "cluster_m",     "cluster_n",
        "epilogue_n", "pingpong", "raster", "swizzle", "promote_tiles", "stream_k", "partial_rows"};
    for (int i = 0; i < gemmbn::gemm_config_count(operands); ++i) {
      int row[gemmbn::kConfigFields];
      gemmbn::gemm_config_row(operands, i, 1, 1, 1, row);
      std::map<std::string, int> named;
      for (int j = 0; j < gemmbn::kConfigFields; ++j) named[names[j]] = row[j];
      rows.push_back(named);
    }
    return rows;
  }, nb::arg("dtype"), nb::arg("split") = false,
     "The GEMM configuration table (configs.h) of dtype (split: the fp32-faithful GEMM's), one dict per row.");

  m.def("gemm_workspace_bytes", [](const std::string& dtype, int64_t M, int64_t N, int64_t K, int config,
                                   bool split, int splits, bool statistics) {
    gemmbn::GemmScaleStatsArgs a;
    a.dtype = parse_dtype(dtype);
    (void)parse_operands(dtype, split);
    // The query reads only whether a split weight is given, not its contents.
    static const char split_marker = 0;
    if (split) a.weight_split = &split_marker;
    // Likewise only whether partials are given (the row chosen may depend on it).
    static float statistics_marker = 0.f;
    if (statistics) a.partial_mean = a.partial_m2 = &statistics_marker;
    a.M = checked_int(M, "M"), a.N = checked_int(N, "N"), a.K = checked_int(K, "K");
    a.config = config, a.splits = splits;
    size_t bytes = 0;
    raise_on_error(gemmbn::gemm_workspace_bytes(a, bytes));
    return bytes;
  }, nb::arg("dtype"), nb::arg("M"), nb::arg("N"), nb::arg("K"), nb::arg("config") = -1, nb::arg("split") = false,
     nb::arg("splits") = -1, nb::arg("statistics") = true,
     "Bytes of workspace gemm_scale_stats needs for this problem and row (config < 0: the one chosen for it,\n"
     "with partials when statistics, else without):\n"
     "0 except for stream-K rows. Pass a uint8 CUDA array of at least that size as workspace=.");

  m.def("split_weight_columns", [](int64_t K) { return gemmbn::split_weight_columns(checked_int(K, "K")); },
        nb::arg("K"), "Columns of split_weight's output for K input features.");

  m.def("split_weight",
        [](Array weight, Array weight_split, Array weight_unscale, std::uintptr_t stream) {
          if (weight.ndim() != 2) fail("weight must be 2-D");
          gemmbn::SplitWeightArgs a;
          a.N = checked_int(weight.shape(0), "N");
          a.K = checked_int(weight.shape(1), "K");
          check(weight, "weight", {a.N, a.K}, "float32");
          check(weight_split, "weight_split", {a.N, gemmbn::split_weight_columns(a.K)}, "float16");
          check(weight_unscale, "weight_unscale", {a.N}, "float32");
          a.weight = static_cast<const float*>(weight.data());
          a.weight_split = weight_split.data();
          a.weight_unscale = static_cast<float*>(weight_unscale.data());
          raise_on_error(gemmbn::split_weight(a, as_stream(stream)));
        },
        nb::arg("weight"), nb::arg("weight_split"), nb::arg("weight_unscale"), nb::arg("stream"),
        "weight (float32 [N, K]) -> the split GEMM's operand: weight_split (float16 [N, split_weight_columns(K)])\n"
        "and weight_unscale (float32 [N], the power of two undoing each row's scale).");

  m.def("gemm_scale_stats",
        [](Array x, Array weight, Array y, OptionalArray bias, OptionalArray scale, OptionalArray gain,
           OptionalArray shift, OptionalArray partial_mean, OptionalArray partial_m2,
           OptionalArray batches_tracked, std::uintptr_t stream, int config, int raster, int swizzle, int splits,
           OptionalArray weight_split, OptionalArray weight_unscale, OptionalArray x_scale,
           OptionalArray workspace) {
          gemmbn::GemmScaleStatsArgs a = gemm_arguments(x, weight, y, bias, scale, gain, shift, weight_split,
                                                        weight_unscale, x_scale, workspace);
          a.config = config, a.raster = raster, a.swizzle = swizzle, a.splits = splits;
          if (partial_mean.has_value() != partial_m2.has_value()) fail("partial_mean and partial_m2 go together");
          if (partial_mean) {
            const int64_t tile_rows = partial_rows(a), tiles = (a.M + tile_rows - 1) / tile_rows;
            check(*partial_mean, "partial_mean", {tiles, a.N}, "float32");
            check(*partial_m2, "partial_m2", {tiles, a.N}, "float32");
            a.partial_mean = static_cast<float*>(partial_mean->data());
            a.partial_m2 = static_cast<float*>(partial_m2->data());
          }
          a.batches_tracked = optional_counter(batches_tracked);
          raise_on_error(gemmbn::gemm_scale_stats(a, as_stream(stream)));
        },
        nb::arg("x"), nb::arg("weight"), nb::arg("y"), nb::arg("bias").none(), nb::arg("scale").none(),
        nb::arg("gain").none(), nb::arg("shift").none(), nb::arg("partial_mean").none(),
        nb::arg("partial_m2").none(), nb::arg("batches_tracked").none(), nb::arg("stream"), nb::kw_only(),
        nb::arg("config") = -1, nb::arg("raster") = -1, nb::arg("swizzle") = -1, nb::arg("splits") = -1,
        nb::arg("weight_split").none() = nb::none(), nb::arg("weight_unscale").none() = nb::none(),
        nb::arg("x_scale").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
        "y = ((x @ weight^T + bias) * scale) * gain + shift, with per-tile column mean/M2 of y as stored.\n"
        "config/raster/swizzle/splits override the configuration row, the tile order and (stream-K rows) the\n"
        "split-K factor (tuning; -1: the defaults). workspace: uint8, gemm_workspace_bytes(...) bytes or more.\n"
        "weight_split/weight_unscale (split_weight's output for weight) and x_scale (float32 [row_scale_count(M)],\n"
        "a workspace): the fp32-faithful GEMM for float32 x.");

  m.def("train_forward",
        [](Array x, Array weight, Array y, OptionalArray out, OptionalArray bias, OptionalArray scale,
           OptionalArray gamma, OptionalArray beta, OptionalArray running_mean, OptionalArray running_var,
           OptionalArray batches_tracked, Array partials, std::optional<double> momentum, double eps,
           Array save_mean, Array save_invstd, std::uintptr_t stream, OptionalArray weight_split,
           OptionalArray weight_unscale, OptionalArray x_scale, OptionalArray workspace) {
          gemmbn::GemmScaleStatsArgs g = gemm_arguments(x, weight, y, bias, scale, std::nullopt, std::nullopt,
                                                        weight_split, weight_unscale, x_scale, workspace);
          const int64_t tile_rows = partial_rows(g), tiles = (g.M + tile_rows - 1) / tile_rows;
          check(partials, "partials", {2, tiles, g.N}, "float32");
          g.partial_mean = static_cast<float*>(partials.data());
          g.partial_m2 = g.partial_mean + tiles * g.N;
          gemmbn::FinishNormalizeArgs f = finish_arguments(y, out ? *out : y, int(tile_rows), gamma, beta, running_mean,
                                                           running_var, batches_tracked, momentum, eps, save_mean,
                                                           save_invstd);
          f.partial_mean = g.partial_mean, f.partial_m2 = g.partial_m2;
          g.batches_tracked = optional_counter(batches_tracked);
          raise_on_error(gemmbn::train_forward(g, f, as_stream(stream)));
        },
        nb::arg("x"), nb::arg("weight"), nb::arg("y"), nb::arg("out").none(), nb::arg("bias").none(),
        nb::arg("scale").none(), nb::arg("gamma").none(), nb::arg("beta").none(), nb::arg("running_mean").none(),
        nb::arg("running_var").none(), nb::arg("batches_tracked").none(), nb::arg("partials"),
        nb::arg("momentum").none(), nb::arg("eps"), nb::arg("save_mean"), nb::arg("save_invstd"), nb::arg("stream"),
        nb::kw_only(), nb::arg("weight_split").none() = nb::none(), nb::arg("weight_unscale").none() = nb::none(),
        nb::arg("x_scale").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
        "The training forward, both launches: gemm_scale_stats (y and its partials, batches_tracked += 1) then\n"
        "finish_normalize (out = normalized y; out None: in place in y). partials: float32 [2, tiles, N] scratch\n"
        "(the partial means, then the M2s; tiles = ceil(M / gemm_config(...)[0])). Every argument is checked\n"
        "before the first launch. Keywords as gemm_scale_stats's.");

  m.def("row_scale_count", [](int64_t M) { return gemmbn::row_scale_count(checked_int(M, "M")); }, nb::arg("M"),
        "Entries of the split GEMM's x_scale workspace for M rows (whole 128-row tiles).");

  m.def("finish_normalize",
        [](Array y, Array out, Array partial_mean, Array partial_m2, int tile_rows, OptionalArray gamma,
           OptionalArray beta, OptionalArray running_mean,
           OptionalArray running_var, OptionalArray batches_tracked, std::optional<double> momentum, double eps,
           Array save_mean, Array save_invstd, std::uintptr_t stream) {
          gemmbn::FinishNormalizeArgs a = finish_arguments(y, out, tile_rows, gamma, beta, running_mean, running_var,
                                                           batches_tracked, momentum, eps, save_mean, save_invstd);
          const int64_t tiles = (int64_t(a.M) + tile_rows - 1) / tile_rows;
          check(partial_mean, "partial_mean", {tiles, a.N}, "float32");
          check(partial_m2, "partial_m2", {tiles, a.N}, "float32");
          a.partial_mean = static_cast<const float*>(partial_mean.data());
          a.partial_m2 = static_cast<const float*>(partial_m2.data());
          raise_on_error(gemmbn::finish_normalize(a, as_stream(stream)));
        },
        nb::arg("y"), nb::arg("out"), nb::arg("partial_mean"), nb::arg("partial_m2"), nb::arg("tile_rows"),
        nb::arg("gamma").none(), nb::arg("beta").none(),
        nb::arg("running_mean").none(), nb::arg("running_var").none(), nb::arg("batches_tracked").none(),
        nb::arg("momentum").none(), nb::arg("eps"), nb::arg("save_mean"), nb::arg("save_invstd"), nb::arg("stream"),
        "Merge the partials, update running statistics, out = (y - mean) * invstd * gamma + beta.");

  m.def("eval_forward",
        [](Array x, Array weight, Array out, OptionalArray bias, OptionalArray scale, OptionalArray gamma,
           OptionalArray beta, Array running_mean, Array running_var, double eps, Array affine, std::uintptr_t stream,
           OptionalArray weight_split, OptionalArray weight_unscale, OptionalArray x_scale, OptionalArray workspace) {
          gemmbn::GemmScaleStatsArgs g = gemm_arguments(x, weight, out, bias, scale, std::nullopt, std::nullopt,
                                                        weight_split, weight_unscale, x_scale, workspace);
          gemmbn::FoldEvalAffineArgs f = fold_arguments(gamma, beta, running_mean, running_var, eps);
          if (f.N != g.N) fail("running_mean has " + std::to_string(f.N) + " entries, weight " + std::to_string(g.N) + " rows");
          check(affine, "affine", {2, g.N}, "float32");
          f.gain = static_cast<float*>(affine.data()), f.shift = f.gain + g.N;
          g.gain = f.gain, g.shift = f.shift;
          // The fold writes only the affine scratch, so a GEMM refused after it leaves the caller's state as it was.
          raise_on_error(gemmbn::fold_eval_affine(f, as_stream(stream)));
          raise_on_error(gemmbn::gemm_scale_stats(g, as_stream(stream)));
        },
        nb::arg("x"), nb::arg("weight"), nb::arg("out"), nb::arg("bias").none(), nb::arg("scale").none(),
        nb::arg("gamma").none(), nb::arg("beta").none(), nb::arg("running_mean"), nb::arg("running_var"),
        nb::arg("eps"), nb::arg("affine"), nb::arg("stream"), nb::kw_only(),
        nb::arg("weight_split").none() = nb::none(), nb::arg("weight_unscale").none() = nb::none(),
        nb::arg("x_scale").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
        "The eval forward, both launches: fold_eval_affine into affine (float32 [2, N] scratch: gain, shift),\n"
        "then gemm_scale_stats with that affine and no statistics: out = ((x W^T + b) s) gain + shift.\n"
        "Keywords as gemm_scale_stats's (workspace: gemm_workspace_bytes(..., statistics=False)).");

  m.def("batch_norm_backward_workspace_bytes", [](const std::string& dtype, int64_t M, int64_t N) {
    gemmbn::BatchNormBackwardArgs a;
    a.dtype = parse_dtype(dtype);
    a.M = checked_int(M, "M"), a.N = checked_int(N, "N");
    size_t bytes = 0;
    raise_on_error(gemmbn::batch_norm_backward_workspace_bytes(a, bytes));
    return bytes;
  }, nb::arg("dtype"), nb::arg("M"), nb::arg("N"),
     "Bytes of workspace batch_norm_backward needs for [M, N] of dtype on the current device.");

  m.def("batch_norm_backward",
        [](Array dout, OptionalArray y, OptionalArray dz, Array mean, Array invstd, OptionalArray gamma, Array scale,
           OptionalArray x, OptionalArray weight, OptionalArray bias, bool batch_statistics, Array workspace,
           OptionalArray dgamma, OptionalArray dbeta, OptionalArray dbias, OptionalArray dscale,
           std::uintptr_t stream) {
          if (dout.ndim() != 2) fail("dout must be 2-D");
          gemmbn::BatchNormBackwardArgs a;
          a.dtype = dtype_of(dout, "dout");
          const std::string dt = dtype_string(a.dtype);
          a.M = checked_int(dout.shape(0), "M");
          a.N = checked_int(dout.shape(1), "N");
          check(dout, "dout", {a.M, a.N}, dt);
          if (y) check(*y, "y", {a.M, a.N}, dt);
          if (dz) check(*dz, "dz", {a.M, a.N}, dt);
          check(mean, "mean", {a.N}, "float32");
          check(invstd, "invstd", {a.N}, "float32");
          if (x) {
            if (x->ndim() != 2) fail("x must be 2-D, got shape " + shape_string(*x));
            a.K = checked_int(x->shape(1), "K");
            check(*x, "x", {a.M, a.K}, dt);
            a.x = x->data();
          }
          if (weight) {
            check(*weight, "weight", {a.N, a.K}, dt);
            a.weight = weight->data();
          }
          if (workspace.ndim() != 1) fail("workspace must be 1-D, got shape " + shape_string(workspace));
          check(workspace, "workspace", {int64_t(workspace.shape(0))}, "uint8");
          a.dout = dout.data();
          a.y = y ? y->data() : nullptr;
          a.dz = dz ? dz->data() : nullptr;
          a.mean = static_cast<const float*>(mean.data());
          a.invstd = static_cast<const float*>(invstd.data());
          a.gamma = optional_vector(gamma, "gamma", a.N, dt);
          check(scale, "scale", {a.N}, dt);
          a.scale = scale.data();
          a.bias = optional_vector(bias, "bias", a.N, dt);
          a.batch_statistics = batch_statistics;
          a.workspace = workspace.data();
          a.workspace_bytes = workspace.shape(0);
          a.dgamma = const_cast<void*>(optional_vector(dgamma, "dgamma", a.N, dt));
          a.dbeta = const_cast<void*>(optional_vector(dbeta, "dbeta", a.N, dt));
          a.dbias = const_cast<void*>(optional_vector(dbias, "dbias", a.N, dt));
          a.dscale = const_cast<void*>(optional_vector(dscale, "dscale", a.N, dt));
          raise_on_error(gemmbn::batch_norm_backward(a, as_stream(stream)));
        },
        nb::arg("dout"), nb::arg("y").none(), nb::arg("dz").none(), nb::arg("mean"), nb::arg("invstd"),
        nb::arg("gamma").none(), nb::arg("scale"), nb::arg("x").none(), nb::arg("weight").none(),
        nb::arg("bias").none(), nb::arg("batch_statistics"), nb::arg("workspace"), nb::arg("dgamma").none(),
        nb::arg("dbeta").none(), nb::arg("dbias").none(), nb::arg("dscale").none(), nb::arg("stream"),
        "Backward of the normalization and the scale (api.h): dz = scale dL/dy [M, N] (None: not written) and\n"
        "the [N] gradients dgamma, dbeta, dbias, dscale (each None: not computed), all in dout's dtype, from dout,\n"
        "the saved y (None only with fixed statistics and neither dgamma nor dscale), mean and invstd (float32\n"
        "[N]; the running ones when not batch_statistics); x [M, K] and weight [N, K] for dscale where scale is 0.\n"
        "workspace: uint8, batch_norm_backward_workspace_bytes(...) bytes or more.");

  m.def("transpose_padded",
        [](Array in, Array out, std::uintptr_t stream) {
          if (in.ndim() != 2 || out.ndim() != 2) fail("in and out must be 2-D");
          gemmbn::TransposePaddedArgs a;
          a.rows = in.shape(0), a.cols = in.shape(1), a.out_columns = out.shape(1);
          check(in, "in", {a.rows, a.cols}, "float32");
          check(out, "out", {a.cols, a.out_columns}, "float32");
          a.in = static_cast<const float*>(in.data());
          a.out = static_cast<float*>(out.data());
          raise_on_error(gemmbn::transpose_padded(a, as_stream(stream)));
        },
        nb::arg("in"), nb::arg("out"), nb::arg("stream"),
        "out[c, r] = in[r, c], zero for r >= in's rows: float32 [R, C] -> [C, R'] (R' >= R).");

  m.def("fold_eval_affine",
        [](OptionalArray gamma, OptionalArray beta, Array running_mean, Array running_var, double eps, Array gain,
           Array shift, std::uintptr_t stream) {
          gemmbn::FoldEvalAffineArgs a = fold_arguments(gamma, beta, running_mean, running_var, eps);
          check(gain, "gain", {a.N}, "float32");
          check(shift, "shift", {a.N}, "float32");
          a.gain = static_cast<float*>(gain.data());
          a.shift = static_cast<float*>(shift.data());
          raise_on_error(gemmbn::fold_eval_affine(a, as_stream(stream)));
        },
        nb::arg("gamma").none(), nb::arg("beta").none(), nb::arg("running_mean"), nb::arg("running_var"),
        nb::arg("eps"), nb::arg("gain"), nb::arg("shift"), nb::arg("stream"),
        "gain = gamma / sqrt(running_var + eps), shift = beta - running_mean * gain (float32 outputs).");
}
