// Thread-block clusters of each shape resident at once on this GPU, for a kernel shaped like the GEMM's (384 threads,
// one CTA per SM by its shared memory): the persistent grid each cluster shape can fill. CUTLASS's scheduler assumes
// 18-SM GPCs unless told (KernelHardwareInfo::max_active_clusters); this says what the device really holds.
//   nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/co perf/cluster_occupancy.cu && /tmp/co
#include <cstdio>

#include <cuda_runtime.h>

__global__ void gemm_shaped() {}  // occupancy is set by the launch's threads and shared memory, not the body

int main() {
  int device = 0, sms = 0, smem = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (cudaFuncSetAttribute(gemm_shaped, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 1;
  std::printf("SMs %d, shared memory per block up to %d bytes\n", sms, smem);
  const int shapes[][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}, {8, 1}};
  for (auto const& shape : shapes) {
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = shape[0];
    cluster.val.clusterDim.y = shape[1];
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(shape[0], shape[1], 1);
    config.blockDim = dim3(384, 1, 1);
    config.dynamicSmemBytes = smem;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, gemm_shaped, &config);
    const int size = shape[0] * shape[1];
    std::printf("cluster %dx%d: %d resident (%d CTAs of %d SMs)%s%s\n", shape[0], shape[1], clusters, clusters * size,
                sms, e == cudaSuccess ? "" : " error: ", e == cudaSuccess ? "" : cudaGetErrorString(e));
  }
  return 0;
}
