// Helpers for the plain CUDA kernels: element types per DType, conversions, 16-byte vectors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gemmbn/api.h"

namespace gemmbn {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// A per-column vector that may be absent (nullptr reads as `fallback`).
template <class T>
__device__ __forceinline__ double load_or(const T* p, int64_t i, double fallback) {
  return p ? static_cast<double>(to_float(p[i])) : fallback;
}

// 16 bytes of T: one vectorized load or store per thread.
template <class T>
struct Vector16 {
  static constexpr int kSize = 16 / sizeof(T);
  union {
    uint4 raw;
    T elements[kSize];
  };
  __device__ __forceinline__ void load(const T* p) { raw = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<uint4*>(p) = raw; }
  __device__ __forceinline__ float get(int i) const { return to_float(elements[i]); }
  __device__ __forceinline__ void set(int i, float v) { elements[i] = from_float<T>(v); }
};

// Calls f(T{}) with the element type of dtype.
template <class F>
Status with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(__nv_bfloat16{});
    case DType::f16: return f(__half{});
  }
  return Status::invalid("unknown dtype");
}

inline bool is_aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace gemmbn
