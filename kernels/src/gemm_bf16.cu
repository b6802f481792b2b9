// GEMM + scale + column statistics, bf16 operands, bf16 output; fp32 accumulation and epilogue.
#include "gemmbn/gemm_runners.h"
#include "gemmbn/gemm_scale_stats.cuh"

namespace gemmbn::detail {

Status run_gemm_bf16(int config_index, GemmScaleStatsArgs const& args, cudaStream_t stream) {
  return run_config<cutlass::bfloat16_t, kHalfConfigs, kHalfConfigCount>(config_index, args, stream);
}

}  // namespace gemmbn::detail
