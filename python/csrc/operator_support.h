// What gemmbn's torch operators share (operators.cpp, debug_operators.cpp): argument checks that raise a refusal
// ("gemmbn: <why>", before the caller's data is touched), copies of read operands into the kernels' layout,
// allocation through torch's caching allocator, torch's current stream.
// Stable ABI only (TORCH_TARGET_VERSION 2.10, CMakeLists.txt).
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "gemmbn/api.h"

// Hidden: these are this library's own (torch::stable::Tensor is hidden too).
namespace gemmbn_operators __attribute__((visibility("hidden"))) {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using OptionalTensor = std::optional<Tensor>;

// A refusal: the arguments do not suit the kernels, and nothing the caller holds was written (at most an operand was
// copied into a fresh tensor). Its message starts with "gemmbn: ", which is how python/gemmbn/_native.py tells it
// from a failure (and the callers fall back to PyTorch).
[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error("gemmbn: " + message); }

inline const char* dtype_name(ScalarType t) {
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

inline gemmbn::DType kernel_dtype(ScalarType t, const char* name) {
  if (t == ScalarType::Float) return gemmbn::DType::f32;
  if (t == ScalarType::BFloat16) return gemmbn::DType::bf16;
  if (t == ScalarType::Half) return gemmbn::DType::f16;
  fail(std::string(name) + " is " + dtype_name(t) + "; the fused kernels take float32, bfloat16 or float16");
}

inline std::string shape_string(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

inline int checked_int(int64_t v, const char* name) {
  if (v < 1 || v > INT32_MAX) fail(std::string(name) + " = " + std::to_string(v) + " is outside [1, 2^31)");
  return static_cast<int>(v);
}

// One problem's facts, read from x once: every other tensor is checked against them.
struct Problem {
  ScalarType dtype;
  gemmbn::DType kernel_dtype;
  int32_t device;
};

// A CUDA tensor on the problem's device, of this dtype and shape.
inline void check_placed(const Tensor& t, const char* name, const Problem& p, ScalarType dtype,
                         std::initializer_list<int64_t> shape) {
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
}

// Contiguous and 16-byte aligned: TMA tiles and the kernels' vector accesses need both.
inline bool kernel_layout(const Tensor& t) {
  return t.is_contiguous() && reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

// A tensor the kernels write in place (the running statistics, a debug operator's output): placed as check_placed
// says and already in the kernels' layout, since a copy would not carry the writes back.
inline void check(const Tensor& t, const char* name, const Problem& p, ScalarType dtype, std::initializer_list<int64_t> shape) {
  check_placed(t, name, p, dtype, shape);
  if (!t.is_contiguous()) fail(std::string(name) + " must be contiguous");
  if (!kernel_layout(t)) fail(std::string(name) + "'s data must be 16-byte aligned");
}

// A tensor the kernels only read: placed as check_placed says, and returned as it is when in the kernels' layout,
// else as a contiguous copy (one copy kernel on the current stream), so that views, slices and offset storage take
// the fused path; the copy lives as long as the caller holds the result.
inline Tensor readable(const Tensor& t, const char* name, const Problem& p, ScalarType dtype,
                       std::initializer_list<int64_t> shape);

// An optional [n] vector of the problem's dtype that the kernels read: made readable in place, its data or nullptr.
inline const void* read_vector(OptionalTensor& t, const char* name, const Problem& p, int64_t n) {
  if (!t) return nullptr;
  t = readable(*t, name, p, p.dtype, {n});
  return t->data_ptr();
}

// An optional [n] vector of the problem's dtype that the kernels update in place: its data or nullptr.
inline void* written_vector(const OptionalTensor& t, const char* name, const Problem& p, int64_t n) {
  if (!t) return nullptr;
  check(*t, name, p, p.dtype, {n});
  return t->data_ptr();
}

// A batch counter the kernels read or increment (num_batches_tracked): one int64 element on the problem's device; its
// data or nullptr.
inline int64_t* counter(const OptionalTensor& t, const char* name, const Problem& p) {
  if (!t) return nullptr;
  if (t->numel() != 1 || t->scalar_type() != ScalarType::Long || !t->is_cuda() || t->get_device_index() != p.device) {
    fail(std::string(name) + " must be one int64 element on x's device, got " + dtype_name(t->scalar_type()) +
         " of shape " + shape_string(*t));
  }
  return static_cast<int64_t*>(t->data_ptr());
}

// The problem of a 2-D CUDA tensor of a fused dtype (x, or dout in the backward).
inline Problem problem_of(const Tensor& x, const char* name) {
  if (!x.is_cuda()) fail(std::string(name) + " must be a CUDA tensor (the fused kernels run on sm90 GPUs)");
  if (x.dim() != 2) fail(std::string(name) + " must be 2-D, got shape " + shape_string(x));
  return {x.scalar_type(), kernel_dtype(x.scalar_type(), name), x.get_device_index()};
}

// torch's current CUDA stream of a device. The stable ABI exposes it from torch 2.13 on; before, AOTInductor's
// C shim in libtorch_cuda (already loaded by `import torch` on a CUDA build) has it, looked up at run time so that
// this library also loads under a CPU build of torch (where it refuses CUDA calls).
inline cudaStream_t current_stream(int32_t device) {
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
inline void raise_on_error(const gemmbn::Status& s) {
  if (s) return;
  if (s.code == gemmbn::Status::invalid_argument || s.code == gemmbn::Status::unsupported) fail(s.message);
  std::string what = std::string("gemmbn failed ") + s.message;
  if (s.code == gemmbn::Status::cuda_error) what += std::string(": ") + cudaGetErrorString(s.cuda);
  throw std::runtime_error(what);
}

inline int32_t aoti_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return aoti_torch_dtype_float32();
    case ScalarType::BFloat16: return aoti_torch_dtype_bfloat16();
    case ScalarType::Half: return aoti_torch_dtype_float16();
    case ScalarType::Long: return aoti_torch_dtype_int64();
    case ScalarType::Int: return aoti_torch_dtype_int32();
    case ScalarType::Double: return aoti_torch_dtype_float64();
    case ScalarType::Byte: return aoti_torch_dtype_uint8();
    default: throw std::logic_error(std::string("gemmbn cannot allocate tensors of ") + dtype_name(t));
  }
}

// A new contiguous tensor on like's device, from torch's caching allocator. AOTInductor's C shim allocates without a
// trip through the dispatcher (torch::stable::new_empty boxes an aten::new_empty call: several microseconds each).
inline Tensor empty(const Tensor& like, std::vector<int64_t> shape, ScalarType dtype) {
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

inline Tensor readable(const Tensor& t, const char* name, const Problem& p, ScalarType dtype,
                       std::initializer_list<int64_t> shape) {
  check_placed(t, name, p, dtype, shape);
  if (kernel_layout(t)) return t;
  Tensor copy = empty(t, std::vector<int64_t>(shape), dtype);
  if (aoti_torch_copy_(copy.get(), t.get(), 0) != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error(std::string("gemmbn failed to copy ") + name + " into the kernels' layout");
  }
  return copy;
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

// A finish launch's workspace (finish_workspace_bytes) where it is the call's only scratch, bound to f.workspace; the
// returned Scratch holds it until the launch is queued.
inline Scratch bind_finish_workspace(gemmbn::FinishNormalizeArgs& f, const Tensor& like) {
  Scratch scratch;
  const size_t at = scratch.add(gemmbn::finish_workspace_bytes(f.N));
  scratch.allocate(like);
  f.workspace = scratch.at<char>(at);
  return scratch;
}

// The split GEMM's B operand (split_weight's or split_columns's pair for a's N rows over K) checked and bound to a,
// and x_scale's place reserved in `scratch` (returned; bind_scratch points a at it once allocated).
inline size_t bind_split_operand(gemmbn::GemmScaleStatsArgs& a, const Tensor& split, const Tensor& unscale,
                                 const char* split_name, const char* unscale_name, const Problem& p, Scratch& scratch) {
  check(split, split_name, p, ScalarType::Half, {a.N, gemmbn::split_weight_columns(a.K)});
  check(unscale, unscale_name, p, ScalarType::Float, {a.N});
  a.weight_split = split.data_ptr();
  a.weight_unscale = static_cast<const float*>(unscale.data_ptr());
  return scratch.add(sizeof(float) * gemmbn::row_scale_count(a.M));
}

// gemm_scale_stats's arguments for y = (x W^T + b) s: x, weight, bias, scale and, for the fp32-faithful GEMM
// (float32 with weight_split and weight_unscale: split_weight's output), the split weight and a fresh x_scale.
// x_scale's place is reserved in `scratch` (*x_scale_at); bind_scratch points the arguments at it once allocated.
// x, weight, bias and scale are made readable in place (the caller keeps any copies alive until the launch).
inline gemmbn::GemmScaleStatsArgs gemm_arguments(Tensor& x, Tensor& weight, OptionalTensor& bias,
                                          OptionalTensor& scale, const OptionalTensor& weight_split,
                                          const OptionalTensor& weight_unscale, const Problem& p, Scratch& scratch,
                                          std::optional<size_t>& x_scale_at) {
  if (weight.dim() != 2) fail("weight must be 2-D, got shape " + shape_string(weight));
  gemmbn::GemmScaleStatsArgs a;
  a.dtype = p.kernel_dtype;
  a.M = checked_int(x.size(0), "M");
  a.K = checked_int(x.size(1), "K");
  a.N = checked_int(weight.size(0), "N");
  x = readable(x, "x", p, p.dtype, {a.M, a.K});
  weight = readable(weight, "weight", p, p.dtype, {a.N, a.K});
  a.x = x.data_ptr(), a.weight = weight.data_ptr();
  a.bias = read_vector(bias, "bias", p, a.N);
  a.scale = read_vector(scale, "scale", p, a.N);
  if (weight_split.has_value() != weight_unscale.has_value()) fail("weight_split and weight_unscale go together");
  if (weight_split) {
    if (p.dtype != ScalarType::Float) fail("weight_split (the fp32-faithful GEMM) needs float32 x");
    x_scale_at = bind_split_operand(a, *weight_split, *weight_unscale, "weight_split", "weight_unscale", p, scratch);
  }
  return a;
}

// The stream-K rows' workspace (partial accumulators and flags), sized for a's row, reserved in the scratch; none
// for the other rows. Reads whether a's partials are given (set them, to any pointer, first).
inline std::optional<size_t> reserve_workspace(gemmbn::GemmScaleStatsArgs& a, Scratch& scratch) {
  size_t bytes = 0;
  raise_on_error(gemmbn::gemm_workspace_bytes(a, bytes));
  if (bytes == 0) return std::nullopt;
  a.workspace_bytes = bytes;
  return scratch.add(bytes);
}

inline void bind_scratch(gemmbn::GemmScaleStatsArgs& a, const Scratch& scratch, std::optional<size_t> x_scale_at,
                  std::optional<size_t> workspace_at) {
  if (x_scale_at) a.x_scale = scratch.at<float>(*x_scale_at);
  if (workspace_at) a.workspace = scratch.at<void>(*workspace_at);
}

}  // namespace gemmbn_operators
