// GEMM + scale + column statistics, fp32 operands on TF32 tensor cores; fp32 accumulation and epilogue.
#include "gemmbn/gemm_runners.h"
#include "gemmbn/gemm_scale_stats.cuh"

namespace gemmbn::detail {

Status run_gemm_tf32(int config_index, GemmScaleStatsArgs const& args, cudaStream_t stream) {
  return run_config<float, kTf32Configs, kTf32ConfigCount>(config_index, args, stream);
}

}  // namespace gemmbn::detail
