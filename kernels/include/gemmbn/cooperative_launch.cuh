// The cooperative launch of the finish and backward kernels. With GEMMBN_PROGRAMMATIC_LAUNCH=1 (the CMake option of
// that name, an experiment, off by default) it is a programmatic dependent launch (sm_90): processed while the kernel
// before it on the stream (the GEMM) drains, instead of after. The kernels call wait_for_preceding_grids() before
// their first global memory access, so only the launch overlaps and every read and write stays ordered after the
// preceding kernel, whatever it is (one that never triggers its dependents starts them as its blocks exit). On an H200
// it moved no forward or training step by a measurable amount (perf/NOTES.md v27).
#pragma once

#include <cuda_runtime.h>

#ifndef GEMMBN_PROGRAMMATIC_LAUNCH
#define GEMMBN_PROGRAMMATIC_LAUNCH 0
#endif

namespace gemmbn {

// Returns once every grid this one depends on has completed and its memory is visible. Compiled only where the
// launches are programmatic, so that the default build's kernels are the plain launch's, instruction for instruction.
__device__ __forceinline__ void wait_for_preceding_grids() {
#if GEMMBN_PROGRAMMATIC_LAUNCH && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

namespace detail {

// The attribute that lets a launch start before the kernel ahead of it on the stream has completed.
inline cudaLaunchAttribute programmatic_serialization() {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

// kernel<<<blocks, threads, 0, stream>>>(params) with `count` launch attributes.
template <class Params>
cudaError_t launch_with(void (*kernel)(Params), int blocks, int threads, Params& params, cudaStream_t stream,
                        cudaLaunchAttribute* attributes, unsigned count) {
  // In field order (gridDim, blockDim, dynamicSmemBytes, stream, attrs, numAttrs): the CPU emulation of the kernels
  // (tests/emulation/emulation.h) defines gridDim and blockDim as macros, so the fields are not named.
  cudaLaunchConfig_t config = {dim3(blocks), dim3(threads), 0, stream, attributes, count};
  void* arguments[] = {&params};
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), arguments);
}

}  // namespace detail

// kernel<<<blocks, threads, 0, stream>>>(params) as a cooperative launch (every block resident at once: a grid
// barrier may be used), programmatic where GEMMBN_PROGRAMMATIC_LAUNCH.
template <class Params>
cudaError_t launch_cooperative(void (*kernel)(Params), int blocks, int threads, Params& params, cudaStream_t stream) {
  cudaLaunchAttribute attributes[2] = {{}, detail::programmatic_serialization()};
  attributes[0].id = cudaLaunchAttributeCooperative;
  attributes[0].val.cooperative = 1;
  return detail::launch_with(kernel, blocks, threads, params, stream, attributes, GEMMBN_PROGRAMMATIC_LAUNCH ? 2u : 1u);
}

// kernel<<<blocks, threads, 0, stream>>>(params) for a kernel without a grid barrier, programmatic where
// GEMMBN_PROGRAMMATIC_LAUNCH.
template <class Params>
cudaError_t launch_plain(void (*kernel)(Params), int blocks, int threads, Params& params, cudaStream_t stream) {
  cudaLaunchAttribute attribute = detail::programmatic_serialization();
  return detail::launch_with(kernel, blocks, threads, params, stream, &attribute, GEMMBN_PROGRAMMATIC_LAUNCH ? 1u : 0u);
}

// kernel<<<blocks, threads, 0, stream>>>(params) as a programmatic dependent launch, always: its blocks may start once
// every block of the kernel before it (the GEMM) has triggered its dependents, so the kernel orders its own reads
// (finish_dataflow_kernel: the GEMM's tile flow, tile_flow.h).
template <class Params>
cudaError_t launch_programmatic(void (*kernel)(Params), int blocks, int threads, Params& params, cudaStream_t stream) {
  cudaLaunchAttribute attribute = detail::programmatic_serialization();
  return detail::launch_with(kernel, blocks, threads, params, stream, &attribute, 1u);
}

}  // namespace gemmbn
