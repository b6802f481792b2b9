// Validation, configuration choice and per-type dispatch of the fused GEMM; device queries.
#include <cstdint>

#include "gemmbn/api.h"
#include "gemmbn/configs.h"
#include "gemmbn/device_info.h"
#include "gemmbn/gemm_runners.h"

namespace gemmbn {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

const TileConfig& config_at(DType dtype, int index) {
  return dtype == DType::f32 ? kTf32Configs[index] : kHalfConfigs[index];
}

int select_config(DType dtype, int M, int N, int K) {
  (void)dtype, (void)M, (void)N, (void)K;
  return 0;  // one configuration per type so far; shape-dependent rows come with tuning
}

int gemm_tile_rows(DType dtype, int M, int N, int K) { return config_at(dtype, select_config(dtype, M, N, K)).tile_m; }
int gemm_tile_cols(DType dtype, int M, int N, int K) { return config_at(dtype, select_config(dtype, M, N, K)).tile_n; }

Status gemm_scale_stats(const GemmScaleStatsArgs& args, cudaStream_t stream) {
  if (args.M < 1 || args.N < 1 || args.K < 1) return Status::invalid("M, N and K must be positive");
  const int vector = 16 / dtype_size(args.dtype);
  if (args.K % vector != 0) return Status::invalid("K must be a multiple of 16 bytes of the dtype (TMA rows)");
  if (args.N % vector != 0) return Status::invalid("N must be a multiple of 16 bytes of the dtype (TMA rows)");
  if (!args.x || !args.weight || !args.y) return Status::invalid("x, weight and y must not be null");
  for (const void* p : {args.x, args.weight, static_cast<const void*>(args.y), args.bias, args.scale,
                        static_cast<const void*>(args.gain), static_cast<const void*>(args.shift)}) {
    if (p && !aligned16(p)) return Status::invalid("every array must start on a 16-byte boundary");
  }
  if ((args.partial_mean == nullptr) != (args.partial_m2 == nullptr)) {
    return Status::invalid("partial_mean and partial_m2 go together");
  }
  const int index = select_config(args.dtype, args.M, args.N, args.K);
  switch (args.dtype) {
    case DType::f32: return detail::run_gemm_tf32(index, args, stream);
    case DType::bf16: return detail::run_gemm_bf16(index, args, stream);
    case DType::f16: return detail::run_gemm_f16(index, args, stream);
  }
  return Status::invalid("unknown dtype");
}

cudaError_t current_device_info(int& device, int& sm_count) {
  constexpr int kMaxDevices = 64;
  static int cached_sm_count[kMaxDevices] = {};
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  if (device >= 0 && device < kMaxDevices && cached_sm_count[device] > 0) {
    sm_count = cached_sm_count[device];
    return cudaSuccess;
  }
  e = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess && device >= 0 && device < kMaxDevices) cached_sm_count[device] = sm_count;
  return e;
}

Status device_support(int device) {
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) return Status::from_cuda(e, "querying the device's compute capability");
  if (major != 9 || minor != 0) {
    return {Status::unsupported, cudaSuccess, "the fused kernels are built for sm_90a (Hopper: H100/H200)"};
  }
  return Status::success();
}

}  // namespace gemmbn
