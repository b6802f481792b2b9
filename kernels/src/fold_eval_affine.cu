// Eval-mode BatchNorm folded into a per-column affine the GEMM epilogue applies.
#include "gemmbn/api.h"
#include "gemmbn/elementwise.cuh"

namespace gemmbn {
namespace {

// gain[n] = s[n] g[n],  shift[n] = beta[n] + (b[n] s[n] - running_mean[n]) g[n],  g = gamma / sqrt(running_var + eps),
// with the linear layer's bias b and scale s folded in (null: b = 0, s = 1); in fp64, rounded once to fp32.
template <class T>
__global__ void fold_eval_affine_kernel(FoldEvalAffineArgs a) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= a.N) return;
  const double g = load_or(static_cast<const T*>(a.gamma), n, 1.0) /
                   sqrt(static_cast<double>(to_float(static_cast<const T*>(a.running_var)[n])) + a.eps);
  const double beta = load_or(static_cast<const T*>(a.beta), n, 0.0);
  const double mean = to_float(static_cast<const T*>(a.running_mean)[n]);
  const double s = load_or(static_cast<const T*>(a.scale), n, 1.0), b = load_or(static_cast<const T*>(a.bias), n, 0.0);
  a.gain[n] = static_cast<float>(s * g);
  a.shift[n] = static_cast<float>(beta + (b * s - mean) * g);
}

}  // namespace

Status fold_eval_affine(const FoldEvalAffineArgs& a, cudaStream_t stream) {
  if (a.N < 1) return Status::invalid("N must be positive");
  if (!a.running_mean || !a.running_var || !a.gain || !a.shift) {
    return Status::invalid("running statistics, gain and shift are required");
  }
  return with_element_type(a.dtype, [&](auto element) -> Status {
    fold_eval_affine_kernel<decltype(element)><<<(a.N + 255) / 256, 256, 0, stream>>>(a);
    return Status::from_cuda(cudaGetLastError(), "launching fold_eval_affine");
  });
}

}  // namespace gemmbn
