// The fused GEMM's runners, one per (operand type, configuration row), each defined in its own
// translation unit (kernels/src/gemm_row.cuh, instantiated by CMake per row).
#pragma once

#include "gemmbn/api.h"

namespace gemmbn::detail {

template <GemmOperands Operands, int Row>
struct GemmRunner {
  static Status run(GemmScaleStatsArgs const& args, cudaStream_t stream);  // explicitly instantiated per row
  static Status workspace_bytes(GemmScaleStatsArgs const& args, size_t& bytes);
};

}  // namespace gemmbn::detail
