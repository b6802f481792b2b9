// One row of a GEMM configuration table in its own translation unit. CMake generates a stub per
// (operand type, row) that defines GEMMBN_OPERAND (a GemmOperands value: 0 tf32, 1 bf16, 2 f16,
// 3 f32_split) and GEMMBN_ROW, then includes this.
#include "gemmbn/gemm_runners.h"
#include "gemmbn/gemm_scale_stats.cuh"

namespace gemmbn::detail {

#if GEMMBN_OPERAND < 0 || GEMMBN_OPERAND > 3
#error "GEMMBN_OPERAND must be 0 (tf32), 1 (bf16), 2 (f16) or 3 (f32_split)"
#endif
inline constexpr GemmOperands kRowOperands = static_cast<GemmOperands>(GEMMBN_OPERAND);

template <GemmOperands Operands, int Row>
Status GemmRunner<Operands, Row>::run(GemmScaleStatsArgs const& args, cudaStream_t stream) {
  static_assert(Row < config_count(Operands), "CMake's row count exceeds the table in configs.h");
  return GemmScaleStatsKernel<Operands, Row>::run(args, stream);
}

template <GemmOperands Operands, int Row>
Status GemmRunner<Operands, Row>::workspace_bytes(GemmScaleStatsArgs const& args, size_t& bytes) {
  return GemmScaleStatsKernel<Operands, Row>::workspace_bytes(args, bytes);
}

template struct GemmRunner<kRowOperands, GEMMBN_ROW>;

}  // namespace gemmbn::detail
