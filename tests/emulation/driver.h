// What the emulation drivers share, included after the kernel file's source: the host stub its launch code
// links against, and the rounding units their bounds are written in.
#pragma once

#include <cuda_fp16.h>

#include <type_traits>

namespace gemmbn {
// The kernel files' host code calls this (gemm_dispatch.cpp has the real one); nothing in a driver launches.
cudaError_t current_device_info(int&, int&) { return cudaErrorNoDevice; }
}  // namespace gemmbn

namespace emulation {
constexpr double kFp32 = 1.0 / (1 << 24);  // fp32's unit roundoff
// The unit roundoff of storing a value as T, beyond fp32's own (0 for fp32 itself).
template <class T> constexpr double unit_roundoff() { return sizeof(T) == 4 ? 0.0 : std::is_same_v<T, __half> ? 1.0 / (1 << 11) : 1.0 / (1 << 8); }
}  // namespace emulation
