// One row of a GEMM configuration table in its own translation unit. CMake generates a stub per
// (operand type, row) that defines GEMMBN_OPERAND (0 tf32, 1 bf16, 2 f16) and GEMMBN_ROW, then includes this.
#include "gemmbn/gemm_runners.h"
#include "gemmbn/gemm_scale_stats.cuh"

namespace gemmbn::detail {

#if GEMMBN_OPERAND == 0
using RowElement = float;  // TF32 tensor cores, fp32 output
inline constexpr DType kRowType = DType::f32;
#elif GEMMBN_OPERAND == 1
using RowElement = cutlass::bfloat16_t;
inline constexpr DType kRowType = DType::bf16;
#elif GEMMBN_OPERAND == 2
using RowElement = cutlass::half_t;
inline constexpr DType kRowType = DType::f16;
#else
#error "GEMMBN_OPERAND must be 0 (tf32), 1 (bf16) or 2 (f16)"
#endif

template <DType Type, int Row>
Status GemmRunner<Type, Row>::run(GemmScaleStatsArgs const& args, cudaStream_t stream) {
  static_assert(Row < config_count(Type), "CMake's row count exceeds the table in configs.h");
  if constexpr (Type == DType::f32) {
    return GemmScaleStatsKernel<RowElement, kTf32Configs, Row>::run(args, stream);
  } else {
    return GemmScaleStatsKernel<RowElement, kHalfConfigs, Row>::run(args, stream);
  }
}

template struct GemmRunner<kRowType, GEMMBN_ROW>;

}  // namespace gemmbn::detail
