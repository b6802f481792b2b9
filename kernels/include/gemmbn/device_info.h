// Per-device facts the launches need on every call (SM count, occupancy, function attributes), each
// computed once per device and then read from a cache.
#pragma once

#include <atomic>

#include <cuda_runtime.h>

namespace gemmbn {

cudaError_t current_device_info(int& device, int& sm_count);
// The current device's peak DRAM bandwidth in GB/s: two transfers per memory clock across the bus's width.
cudaError_t current_dram_gbps(int& gbps);

// value = the cached positive result of compute(value) for this device, computing it on the first call.
// One cache per call site (each lambda is its own Compute type). Two threads' first calls may both
// compute; they store the same value, and the atomics keep that race defined. Devices past 64 and
// failed or non-positive results are not cached.
template <class Compute>
cudaError_t cached_per_device(int device, int& value, Compute compute) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) {
      value = cached;
      return cudaSuccess;
    }
  }
  const cudaError_t e = compute(value);
  if (e == cudaSuccess && cacheable && value > 0) cache[device].store(value, std::memory_order_relaxed);
  return e;
}

}  // namespace gemmbn

namespace gemmbn {

// Blocks of `kernel` (threads per block, no dynamic shared memory) resident on the current device at
// once: the most a cooperative launch of it may have. Cached per kernel and device.
template <auto kernel>
cudaError_t resident_blocks(int threads, int& blocks) {
  int device = 0, sm_count = 0;
  if (cudaError_t e = current_device_info(device, sm_count); e != cudaSuccess) return e;
  return cached_per_device(device, blocks, [threads, sm_count](int& resident) {
    int per_sm = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
    resident = per_sm * sm_count;
    return e;
  });
}

}  // namespace gemmbn
