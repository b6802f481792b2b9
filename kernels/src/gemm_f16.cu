// GEMM + scale + column statistics, fp16 operands, fp16 output; fp32 accumulation and epilogue.
#include "gemmbn/gemm_runners.h"
#include "gemmbn/gemm_scale_stats.cuh"

namespace gemmbn::detail {

Status run_gemm_f16(int config_index, GemmScaleStatsArgs const& args, cudaStream_t stream) {
  return run_config<cutlass::half_t, kHalfConfigs, kHalfConfigCount>(config_index, args, stream);
}

}  // namespace gemmbn::detail
