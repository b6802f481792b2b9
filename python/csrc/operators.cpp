// gemmbn's native operators, registered with PyTorch's dispatcher through LibTorch's stable ABI
// (torch/csrc/stable, built with TORCH_TARGET_VERSION = 2.10): one build loads under every torch >= 2.10.
// Each operator checks its arguments, picks the GEMM's configuration row, allocates its outputs and
// workspace through torch's caching allocator and launches on torch's current stream of the inputs'
// device, so a forward or backward crosses from Python into C++ once. A refused call launches nothing.
// The kernels' math is in kernels/include/gemmbn/api.h; python/gemmbn/fused.py is the Python side.
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "gemmbn/api.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using OptionalTensor = std::optional<Tensor>;

// A refusal: the arguments do not suit the kernels, and nothing was launched or written. Its message starts with
// "gemmbn: ", which is how python/gemmbn/fused.py tells it from a failure (and falls back to PyTorch).
[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("gemmbn: " + message); }

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Half: return "float16";
    case ScalarType::Double: return "float64";
    case ScalarType::Long: return "int64";
    case ScalarType::Byte: return "uint8";
    default: return "another dtype";
  }
}

gemmbn::DType kernel_dtype(ScalarType t, const char* name) {
  if (t == ScalarType::Float) return gemmbn::DType::f32;
  if (t == ScalarType::BFloat16) return gemmbn::DType::bf16;
  if (t == ScalarType::Half) return gemmbn::DType::f16;
  fail(std::string(name) + " is " + dtype_name(t) + "; the fused kernels take float32, bfloat16 or float16");
}

std::string shape_string(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

int checked_int(int64_t v, const char* name) {
  if (v < 1 || v > INT32_MAX) fail(std::string(name) + " = " + std::to_string(v) + " is outside [1, 2^31)");
  return static_cast<int>(v);
}

// One problem's facts, read from x once: every other tensor is checked against them.
struct Problem {
  ScalarType dtype;
  gemmbn::DType kernel_dtype;
  int32_t device;
};

// A CUDA tensor on the problem's device, of this dtype and shape, contiguous, 16-byte aligned (TMA tiles and
// the kernels' vector accesses need all four).
void check(const Tensor& t, const char* name, const Problem& p, ScalarType dtype, std::initializer_list<int64_t> shape) {
  if (!t.is_cuda()) fail(std::string(name) + " must be a CUDA tensor");
  if (t.get_device_index() != p.device) {
    fail(std::string(name) + " is on cuda:" + std::to_string(t.get_device_index()) + " but x is on cuda:" +
         std::to_string(p.device));
  }
  if (t.scalar_type() != dtype) fail(std::string(name) + " must be " + dtype_name(dtype) + ", got " + dtype_name(t.scalar_type()));
  bool shape_ok = t.dim() == int64_t(shape.size());
  int64_t d = 0;
  for (int64_t extent : shape) shape_ok = shape_ok && t.size(d++) == extent;
  if (!shape_ok) {
    std::string want = "[";
    d = 0;
    for (int64_t extent : shape) want += (d++ ? ", " : "") + std::to_string(extent);
    fail(std::string(name) + " must have shape " + want + "], got " + shape_string(t));
  }
  if (!t.is_contiguous()) fail(std::string(name) + " must be contiguous");
  if (reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16) fail(std::string(name) + "'s data must be 16-byte aligned");
}

const void* optional_vector(const OptionalTensor& t, const char* name, const Problem& p, int64_t n) {
  if (!t) return nullptr;
  check(*t, name, p, p.dtype, {n});
  return t->data_ptr();
}

// The problem of a 2-D CUDA tensor of a fused dtype (x, or dout in the backward).
Problem problem_of(const Tensor& x, const char* name) {
  if (!x.is_cuda()) fail(std::string(name) + " must be a CUDA tensor (the fused kernels run on sm90 GPUs)");
  if (x.dim() != 2) fail(std::string(name) + " must be 2-D, got shape " + shape_string(x));
  return {x.scalar_type(), kernel_dtype(x.scalar_type(), name), x.get_device_index()};
}

// torch's current CUDA stream of a device. The stable ABI exposes it from torch 2.13 on; before, AOTInductor's
// C shim in libtorch_cuda (already loaded by `import torch` on a CUDA build) has it, looked up at run time so that
// this library also loads under a CPU build of torch (where it refuses CUDA calls).
cudaStream_t current_stream(int32_t device) {
  using Query = int32_t (*)(int32_t, void**);
  static const Query query = [] {
    void* symbol = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    if (symbol == nullptr) {
      if (void* library = dlopen("libtorch_cuda.so", RTLD_NOLOAD | RTLD_LAZY)) {
        symbol = dlsym(library, "aoti_torch_get_current_cuda_stream");
      }
    }
    return reinterpret_cast<Query>(symbol);
  }();
  if (query == nullptr) fail("this torch build has no CUDA (aoti_torch_get_current_cuda_stream not found)");
  void* stream = nullptr;
  if (query(device, &stream) != 0) fail("could not read torch's current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

// The kernels' own argument checks are refusals too; a CUTLASS or CUDA error is a failure, reported as such.
void raise_on_error(const gemmbn::Status& s) {
  if (s) return;
  if (s.code == gemmbn::Status::invalid_argument || s.code == gemmbn::Status::unsupported) fail(s.message);
  std::string what = std::string("gemmbn failed ") + s.message;
  if (s.code == gemmbn::Status::cuda_error) what += std::string(": ") + cudaGetErrorString(s.cuda);
  throw std::runtime_error(what);
}

int32_t aoti_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return aoti_torch_dtype_float32();
    case ScalarType::BFloat16: return aoti_torch_dtype_bfloat16();
    case ScalarType::Half: return aoti_torch_dtype_float16();
    case ScalarType::Long: return aoti_torch_dtype_int64();
    default: return aoti_torch_dtype_uint8();
  }
}

// A new contiguous tensor on like's device, from torch's caching allocator. AOTInductor's C shim allocates without a
// trip through the dispatcher (torch::stable::new_empty boxes an aten::new_empty call: several microseconds each).
Tensor empty(const Tensor& like, std::vector<int64_t> shape, ScalarType dtype) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) strides[d] = stride, stride *= std::max<int64_t>(shape[d], 1);
  AtenTensorHandle handle = nullptr;
  if (aoti_torch_empty_strided(int64_t(shape.size()), shape.data(), strides.data(), aoti_dtype(dtype),
                               aoti_torch_device_type_cuda(), like.get_device_index(), &handle) != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("gemmbn failed to allocate a tensor of " + std::to_string(stride) + " elements");
  }
  return Tensor(handle);
}

// One allocation for a call's scratch arrays (partials, row scales, a stream-K workspace), each 256-byte aligned.
class Scratch {
 public:
  size_t add(size_t bytes) {
    const size_t offset = size_;
    size_ += (bytes + 255) / 256 * 256;
    return offset;
  }
  void allocate(const Tensor& like) {
    if (size_ == 0) return;
    buffer_ = empty(like, {int64_t(size_)}, ScalarType::Byte);
    base_ = static_cast<char*>(buffer_->data_ptr());
  }
  template <typename T>
  T* at(size_t offset) const { return reinterpret_cast<T*>(base_ + offset); }

 private:
  size_t size_ = 0;
  std::optional<Tensor> buffer_;
  char* base_ = nullptr;
};

// gemm_scale_stats's arguments for y = (x W^T + b) s: x, weight, bias, scale and, for the fp32-faithful GEMM
// (float32 with weight_split and weight_unscale: split_weight's output), the split weight and a fresh x_scale.
// x_scale's place is reserved in `scratch` (*x_scale_at); bind_scratch points the arguments at it once allocated.
gemmbn::GemmScaleStatsArgs gemm_arguments(const Tensor& x, const Tensor& weight, const OptionalTensor& bias,
                                          const OptionalTensor& scale, const OptionalTensor& weight_split,
                                          const OptionalTensor& weight_unscale, const Problem& p, Scratch& scratch,
                                          std::optional<size_t>& x_scale_at) {
  if (weight.dim() != 2) fail("weight must be 2-D, got shape " + shape_string(weight));
  gemmbn::GemmScaleStatsArgs a;
  a.dtype = p.kernel_dtype;
  a.M = checked_int(x.size(0), "M");
  a.K = checked_int(x.size(1), "K");
  a.N = checked_int(weight.size(0), "N");
  check(x, "x", p, p.dtype, {a.M, a.K});
  check(weight, "weight", p, p.dtype, {a.N, a.K});
  a.x = x.data_ptr(), a.weight = weight.data_ptr();
  a.bias = optional_vector(bias, "bias", p, a.N);
  a.scale = optional_vector(scale, "scale", p, a.N);
  if (weight_split.has_value() != weight_unscale.has_value()) fail("weight_split and weight_unscale go together");
  if (weight_split) {
    if (p.dtype != ScalarType::Float) fail("weight_split (the fp32-faithful GEMM) needs float32 x");
    check(*weight_split, "weight_split", p, ScalarType::Half, {a.N, gemmbn::split_weight_columns(a.K)});
    check(*weight_unscale, "weight_unscale", p, ScalarType::Float, {a.N});
    x_scale_at = scratch.add(sizeof(float) * gemmbn::row_scale_count(a.M));
    a.weight_split = weight_split->data_ptr();
    a.weight_unscale = static_cast<const float*>(weight_unscale->data_ptr());
  }
  return a;
}

// The stream-K rows' workspace (partial accumulators and flags), sized for a's row, reserved in the scratch; none
// for the other rows. Reads whether a's partials are given (set them, to any pointer, first).
std::optional<size_t> reserve_workspace(gemmbn::GemmScaleStatsArgs& a, Scratch& scratch) {
  size_t bytes = 0;
  raise_on_error(gemmbn::gemm_workspace_bytes(a, bytes));
  if (bytes == 0) return std::nullopt;
  a.workspace_bytes = bytes;
  return scratch.add(bytes);
}

void bind_scratch(gemmbn::GemmScaleStatsArgs& a, const Scratch& scratch, std::optional<size_t> x_scale_at,
                  std::optional<size_t> workspace_at) {
  if (x_scale_at) a.x_scale = scratch.at<float>(*x_scale_at);
  if (workspace_at) a.workspace = scratch.at<void>(*workspace_at);
}

// (out, pre_norm, save_mean, save_invstd): y = (x W^T + b) s; out = (y - mean) invstd gamma + beta with the batch
// statistics; running statistics and num_batches_tracked updated in place (api.h: train_forward).
std::tuple<Tensor, Tensor, Tensor, Tensor> train_forward(
    Tensor x, Tensor weight, OptionalTensor bias, Tensor scale, OptionalTensor gamma, OptionalTensor beta,
    OptionalTensor running_mean, OptionalTensor running_var, OptionalTensor num_batches_tracked,
    std::optional<double> momentum, double eps, OptionalTensor weight_split, OptionalTensor weight_unscale,
    bool keep_pre_norm) {
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  std::optional<size_t> x_scale_at;
  gemmbn::GemmScaleStatsArgs g =
      gemm_arguments(x, weight, bias, scale, weight_split, weight_unscale, p, scratch, x_scale_at);
  const int64_t M = g.M, N = g.N;
  int row[gemmbn::kConfigFields];
  if (!gemmbn::gemm_config_row(gemmbn::gemm_operands(g), -1, g.M, g.N, g.K, row, true)) fail("no GEMM configuration");
  const int tile_rows = row[gemmbn::kConfigFields - 1];
  const int64_t tiles = (M + tile_rows - 1) / tile_rows;

  Tensor y = empty(x, {M, N}, p.dtype);
  // Normalize in place unless y itself is kept for the backward.
  Tensor out = keep_pre_norm ? empty(x, {M, N}, p.dtype) : y;
  Tensor save_mean = empty(x, {N}, ScalarType::Float);
  Tensor save_invstd = empty(x, {N}, ScalarType::Float);
  // Per (row block, column) mean and M2 of y as stored: the means, then the M2s.
  const size_t partials_at = scratch.add(sizeof(float) * 2 * tiles * N);
  static float statistics_marker;  // the workspace query reads only whether partials are given
  g.partial_mean = g.partial_m2 = &statistics_marker;
  const std::optional<size_t> workspace_at = reserve_workspace(g, scratch);
  scratch.allocate(x);
  bind_scratch(g, scratch, x_scale_at, workspace_at);
  g.y = y.data_ptr();
  g.partial_mean = scratch.at<float>(partials_at);
  g.partial_m2 = g.partial_mean + tiles * N;

  gemmbn::FinishNormalizeArgs f;
  f.dtype = p.kernel_dtype;
  f.y = y.data_ptr(), f.out = out.data_ptr();
  f.M = g.M, f.N = g.N, f.tile_rows = tile_rows;
  f.partial_mean = g.partial_mean, f.partial_m2 = g.partial_m2;
  f.gamma = optional_vector(gamma, "gamma", p, N);
  f.beta = optional_vector(beta, "beta", p, N);
  if (running_mean.has_value() != running_var.has_value()) fail("running_mean and running_var go together");
  f.running_mean = const_cast<void*>(optional_vector(running_mean, "running_mean", p, N));
  f.running_var = const_cast<void*>(optional_vector(running_var, "running_var", p, N));
  if (num_batches_tracked) {
    const Tensor& counter = *num_batches_tracked;
    if (counter.numel() != 1 || counter.scalar_type() != ScalarType::Long || !counter.is_cuda() ||
        counter.get_device_index() != p.device) {
      fail("num_batches_tracked must be one int64 element on x's device, got " + std::string(dtype_name(counter.scalar_type())) +
           " of shape " + shape_string(counter));
    }
    f.batches_tracked = g.batches_tracked = static_cast<int64_t*>(counter.data_ptr());
  }
  // momentum=None averages cumulatively over the counted batches; with nothing counted, nn.BatchNorm1d's factor is 0.
  f.cumulative = !momentum.has_value() && f.batches_tracked != nullptr;
  f.momentum = momentum.value_or(0.0);
  if (!(eps > 0)) fail("eps = " + std::to_string(eps) + " is not positive (the kernels need sqrt(var + eps) > 0)");
  f.eps = eps;
  f.save_mean = static_cast<float*>(save_mean.data_ptr());
  f.save_invstd = static_cast<float*>(save_invstd.data_ptr());
  raise_on_error(gemmbn::train_forward(g, f, current_stream(p.device)));
  Tensor pre_norm = keep_pre_norm ? y : empty(x, {0}, p.dtype);
  return {out, pre_norm, save_mean, save_invstd};
}

// out = ((x W^T + b) s - running_mean) / sqrt(running_var + eps) gamma + beta: the running statistics folded into
// a per-column gain and shift, then one GEMM (api.h: fold_eval_affine, gemm_scale_stats).
Tensor eval_forward(Tensor x, Tensor weight, OptionalTensor bias, Tensor scale, OptionalTensor gamma,
                    OptionalTensor beta, Tensor running_mean, Tensor running_var, double eps,
                    OptionalTensor weight_split, OptionalTensor weight_unscale) {
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  std::optional<size_t> x_scale_at;
  gemmbn::GemmScaleStatsArgs g =
      gemm_arguments(x, weight, bias, scale, weight_split, weight_unscale, p, scratch, x_scale_at);
  const int64_t M = g.M, N = g.N;
  gemmbn::FoldEvalAffineArgs f;
  f.dtype = p.kernel_dtype;
  f.N = g.N;
  f.gamma = optional_vector(gamma, "gamma", p, N);
  f.beta = optional_vector(beta, "beta", p, N);
  f.running_mean = optional_vector(running_mean, "running_mean", p, N);
  f.running_var = optional_vector(running_var, "running_var", p, N);
  if (!(eps > 0)) fail("eps = " + std::to_string(eps) + " is not positive (the kernels need sqrt(var + eps) > 0)");
  f.eps = eps;
  Tensor out = empty(x, {M, N}, p.dtype);
  const size_t affine_at = scratch.add(sizeof(float) * 2 * N);  // the folded gain, then the shift
  const std::optional<size_t> workspace_at = reserve_workspace(g, scratch);
  scratch.allocate(x);
  bind_scratch(g, scratch, x_scale_at, workspace_at);
  f.gain = scratch.at<float>(affine_at), f.shift = f.gain + N;
  g.gain = f.gain, g.shift = f.shift;
  g.y = out.data_ptr();
  const cudaStream_t stream = current_stream(p.device);
  // The fold writes only the affine scratch, so a GEMM refused after it leaves the caller's state as it was.
  raise_on_error(gemmbn::fold_eval_affine(f, stream));
  raise_on_error(gemmbn::gemm_scale_stats(g, stream));
  return out;
}

// y = (x W^T + b) s on the GEMM without statistics (bias, scale None: 0, 1); the fp32-faithful GEMM when
// weight_split and weight_unscale are given. The eval backward's y and the gradient GEMMs.
Tensor linear_scale(Tensor x, Tensor weight, OptionalTensor bias, OptionalTensor scale, OptionalTensor weight_split,
                    OptionalTensor weight_unscale) {
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  std::optional<size_t> x_scale_at;
  gemmbn::GemmScaleStatsArgs g =
      gemm_arguments(x, weight, bias, scale, weight_split, weight_unscale, p, scratch, x_scale_at);
  Tensor y = empty(x, {int64_t(g.M), int64_t(g.N)}, p.dtype);
  g.y = y.data_ptr();
  const std::optional<size_t> workspace_at = reserve_workspace(g, scratch);
  scratch.allocate(x);
  bind_scratch(g, scratch, x_scale_at, workspace_at);
  raise_on_error(gemmbn::gemm_scale_stats(g, current_stream(p.device)));
  return y;
}

// (weight_split, weight_unscale): W [N, K] float32 as the fp32-faithful GEMM's operand (api.h: split_weight).
std::tuple<Tensor, Tensor> split_weight(Tensor weight) {
  const Problem p = problem_of(weight, "weight");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::SplitWeightArgs a;
  a.N = checked_int(weight.size(0), "N");
  a.K = checked_int(weight.size(1), "K");
  check(weight, "weight", p, ScalarType::Float, {a.N, a.K});
  Tensor weight_split = empty(weight, {a.N, gemmbn::split_weight_columns(a.K)}, ScalarType::Half);
  Tensor weight_unscale = empty(weight, {a.N}, ScalarType::Float);
  a.weight = static_cast<const float*>(weight.data_ptr());
  a.weight_split = weight_split.data_ptr();
  a.weight_unscale = static_cast<float*>(weight_unscale.data_ptr());
  raise_on_error(gemmbn::split_weight(a, current_stream(p.device)));
  return {weight_split, weight_unscale};
}

// out[c, r] = input[r, c], zero for r >= R: float32 [R, C] -> [C, R'], R' = R rounded up to a multiple of 4
// (the split GEMM's operand where the reduction runs down input's columns).
Tensor transpose_padded(Tensor input) {
  const Problem p = problem_of(input, "input");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::TransposePaddedArgs a;
  a.rows = input.size(0), a.cols = input.size(1), a.out_columns = (a.rows + 3) / 4 * 4;
  check(input, "input", p, ScalarType::Float, {a.rows, a.cols});
  Tensor out = empty(input, {a.cols, a.out_columns}, ScalarType::Float);
  a.in = static_cast<const float*>(input.data_ptr());
  a.out = static_cast<float*>(out.data_ptr());
  raise_on_error(gemmbn::transpose_padded(a, current_stream(p.device)));
  return out;
}

// Bits of batch_norm_backward's `outputs`: which of (dz, dgamma, dbeta, dbias, dscale) to compute.
enum BackwardOutput : int64_t { kDz = 1, kDgamma = 2, kDbeta = 4, kDbias = 8, kDscale = 16 };

// (dz, dgamma, dbeta, dbias, dscale) in dout's dtype, each an empty [0] tensor where `outputs` does not ask for it:
// the normalization's and the scale's backward (api.h: batch_norm_backward).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> batch_norm_backward(
    Tensor dout, OptionalTensor y, Tensor mean, Tensor invstd, OptionalTensor gamma, Tensor scale, Tensor x,
    Tensor weight, OptionalTensor bias, bool batch_statistics, int64_t outputs) {
  const Problem p = problem_of(dout, "dout");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::BatchNormBackwardArgs a;
  a.dtype = p.kernel_dtype;
  a.M = checked_int(dout.size(0), "M");
  a.N = checked_int(dout.size(1), "N");
  const int64_t M = a.M, N = a.N;
  check(dout, "dout", p, p.dtype, {M, N});
  if (y) check(*y, "y", p, p.dtype, {M, N});
  check(mean, "mean", p, ScalarType::Float, {N});
  check(invstd, "invstd", p, ScalarType::Float, {N});
  if (x.dim() != 2) fail("x must be 2-D, got shape " + shape_string(x));
  a.K = checked_int(x.size(1), "K");
  check(x, "x", p, p.dtype, {M, a.K});
  check(weight, "weight", p, p.dtype, {N, a.K});
  a.dout = dout.data_ptr();
  a.y = y ? y->data_ptr() : nullptr;
  a.mean = static_cast<const float*>(mean.data_ptr());
  a.invstd = static_cast<const float*>(invstd.data_ptr());
  a.gamma = optional_vector(gamma, "gamma", p, N);
  check(scale, "scale", p, p.dtype, {N});
  a.scale = scale.data_ptr();
  a.x = x.data_ptr(), a.weight = weight.data_ptr();
  a.bias = optional_vector(bias, "bias", p, N);
  a.batch_statistics = batch_statistics;
  if (outputs < 0 || outputs > 31) fail("outputs must be a bit mask of 5 bits (dz, dgamma, dbeta, dbias, dscale)");
  auto output = [&](int64_t bit, std::vector<int64_t> shape, void*& pointer) {
    if (!(outputs & bit)) return empty(dout, {0}, p.dtype);
    Tensor t = empty(dout, std::move(shape), p.dtype);
    pointer = t.data_ptr();
    return t;
  };
  Tensor dz = output(kDz, {M, N}, a.dz);
  Tensor dgamma = output(kDgamma, {N}, a.dgamma);
  Tensor dbeta = output(kDbeta, {N}, a.dbeta);
  Tensor dbias = output(kDbias, {N}, a.dbias);
  Tensor dscale = output(kDscale, {N}, a.dscale);
  size_t bytes = 0;
  raise_on_error(gemmbn::batch_norm_backward_workspace_bytes(a, bytes));
  Tensor workspace = empty(dout, {int64_t(bytes)}, ScalarType::Byte);
  a.workspace = workspace.data_ptr(), a.workspace_bytes = bytes;
  raise_on_error(gemmbn::batch_norm_backward(a, current_stream(p.device)));
  return {dz, dgamma, dbeta, dbias, dscale};
}

}  // namespace

// A fragment: the Python side (python/gemmbn/ops.py) defines the layer's own operators in the same namespace.
STABLE_TORCH_LIBRARY_FRAGMENT(gemmbn, m) {
  m.def("train_forward(Tensor x, Tensor weight, Tensor? bias, Tensor scale, Tensor? gamma, Tensor? beta, "
        "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, float? momentum, "
        "float eps, Tensor? weight_split, Tensor? weight_unscale, bool keep_pre_norm) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("eval_forward(Tensor x, Tensor weight, Tensor? bias, Tensor scale, Tensor? gamma, Tensor? beta, "
        "Tensor running_mean, Tensor running_var, float eps, Tensor? weight_split, Tensor? weight_unscale) -> Tensor");
  m.def("linear_scale(Tensor x, Tensor weight, Tensor? bias, Tensor? scale, Tensor? weight_split, "
        "Tensor? weight_unscale) -> Tensor");
  m.def("split_weight(Tensor weight) -> (Tensor, Tensor)");
  m.def("transpose_padded(Tensor input) -> Tensor");
  m.def("batch_norm_backward(Tensor dout, Tensor? y, Tensor mean, Tensor invstd, Tensor? gamma, Tensor scale, "
        "Tensor x, Tensor weight, Tensor? bias, bool batch_statistics, int outputs) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

// CPU inputs reach the same functions, which refuse them by name ("x must be a CUDA tensor") instead of the
// dispatcher's "no kernel for CPU".
#define GEMMBN_REGISTER_KERNELS(m)                                    \
  m.impl("train_forward", TORCH_BOX(&train_forward));                 \
  m.impl("eval_forward", TORCH_BOX(&eval_forward));                   \
  m.impl("linear_scale", TORCH_BOX(&linear_scale));                   \
  m.impl("split_weight", TORCH_BOX(&split_weight));                   \
  m.impl("transpose_padded", TORCH_BOX(&transpose_padded));           \
  m.impl("batch_norm_backward", TORCH_BOX(&batch_norm_backward))

STABLE_TORCH_LIBRARY_IMPL(gemmbn, CUDA, m) { GEMMBN_REGISTER_KERNELS(m); }
STABLE_TORCH_LIBRARY_IMPL(gemmbn, CPU, m) { GEMMBN_REGISTER_KERNELS(m); }
