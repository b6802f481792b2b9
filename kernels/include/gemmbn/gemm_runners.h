// One runner per operand type, each defined in its own translation unit (kernels/src/gemm_<type>.cu).
#pragma once

#include "gemmbn/api.h"

namespace gemmbn::detail {

Status run_gemm_tf32(int config_index, GemmScaleStatsArgs const& args, cudaStream_t stream);
Status run_gemm_bf16(int config_index, GemmScaleStatsArgs const& args, cudaStream_t stream);
Status run_gemm_f16(int config_index, GemmScaleStatsArgs const& args, cudaStream_t stream);

}  // namespace gemmbn::detail
