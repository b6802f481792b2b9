// The backward's last pass over G = grad_y^T x (python/gemmbn/backward.py): the weight's gradient and the
// scale's gradient where s = 0, in one read of G and W (PyTorch ops took three passes over G).
#include "gemmbn/api.h"
#include "gemmbn/elementwise.cuh"

namespace gemmbn {
namespace {

constexpr int kRowThreads = 256;

// Per row n (a block): dweight[n, k] = s[n] G[n, k], rounded once to T;  w_dot_g[n] = sum_k W[n, k] G[n, k]
// (fp32 products, each thread's sum in fp64, the block's threads added in a fixed order).
template <class T>
__global__ void __launch_bounds__(kRowThreads) weight_grads_kernel(WeightGradsArgs a) {
  __shared__ double thread_dots[kRowThreads];
  using Vec = Vector16<T>;
  constexpr int V = Vec::kSize;
  const int64_t n = blockIdx.x;
  const float s = to_float(static_cast<const T*>(a.scale)[n]);
  const float* g_row = a.g + n * a.K;
  const T* w_row = static_cast<const T*>(a.weight) + n * a.K;
  T* dw_row = static_cast<T*>(a.dweight) + n * a.K;
  double dot = 0;
#pragma unroll 1  // unrolled, the 16-bit instantiations spilled 8 bytes (ptxas, nvcc 13.0)
  for (int k = static_cast<int>(threadIdx.x) * V; k < a.K; k += kRowThreads * V) {
    Vec w, dw;
    w.load(w_row + k);
    float g[V];
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {  // 16-byte loads of G (K is a multiple of 4, so rows are aligned)
      const float4 four = reinterpret_cast<const float4*>(g_row + k)[q];
      g[4 * q] = four.x, g[4 * q + 1] = four.y, g[4 * q + 2] = four.z, g[4 * q + 3] = four.w;
    }
    float partial = 0.f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      partial = fmaf(w.get(i), g[i], partial);
      dw.set(i, s * g[i]);
    }
    dw.store(dw_row + k);
    dot += partial;
  }
  thread_dots[threadIdx.x] = dot;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int t = 0; t < kRowThreads; ++t) total += thread_dots[t];  // fixed order
    a.w_dot_g[n] = static_cast<float>(total);
  }
}

}  // namespace

Status weight_grads(const WeightGradsArgs& a, cudaStream_t stream) {
  if (a.N < 1 || a.K < 1) return Status::invalid("N and K must be positive");
  if (a.K % (16 / dtype_size(a.dtype)) != 0) return Status::invalid("K must be a multiple of 16 bytes of the dtype");
  if (!a.g || !a.weight || !a.scale || !a.dweight || !a.w_dot_g) {
    return Status::invalid("g, weight, scale, dweight and w_dot_g are required");
  }
  if (!is_aligned16(a.g) || !is_aligned16(a.weight) || !is_aligned16(a.dweight)) {
    return Status::invalid("g, weight and dweight must be 16-byte aligned");
  }
  return with_element_type(a.dtype, [&](auto element) -> Status {
    weight_grads_kernel<decltype(element)><<<a.N, kRowThreads, 0, stream>>>(a);
    return Status::from_cuda(cudaGetLastError(), "launching weight_grads");
  });
}

}  // namespace gemmbn
