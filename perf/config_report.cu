// Shared memory and mainloop stages of every row of the GEMM configuration tables, on the host (no GPU):
// CUTLASS sizes the mainloop's stages from what the epilogue leaves of the 227 KB, so check a row's
// stage count here before spending device time on it.   make config-report
#include <cstdio>
#include <utility>

#include "gemmbn/gemm_scale_stats.cuh"

namespace {

using namespace gemmbn;

template <GemmOperands Operands, int Row>
void report_row(const char* type) {
  using Kernel = detail::GemmScaleStatsKernel<Operands, Row>;
  using Epilogue = typename Kernel::CollectiveEpilogue;
  constexpr TileConfig c = config_at(Operands, Row);
  std::printf("%-5s row %d  %3dx%3dx%2d cluster %dx%d %-11s epilogue %3dx%-3d  stages %d  smem: epilogue %6zu B, total %6zu B\n",
              type, Row, c.tile_m, c.tile_n, c.tile_k, c.cluster_m, c.cluster_n, c.pingpong ? "ping-pong" : "cooperative",
              int(cute::size<0>(typename Epilogue::EpilogueTile{})), int(cute::size<1>(typename Epilogue::EpilogueTile{})),
              int(Kernel::CollectiveMainloop::DispatchPolicy::Stages), sizeof(typename Epilogue::SharedStorage),
              sizeof(typename Kernel::Kernel::SharedStorage));
}

template <GemmOperands Operands, int... Rows>
void report_table(const char* type, std::integer_sequence<int, Rows...>) {
  (report_row<Operands, Rows>(type), ...);
}

}  // namespace

int main() {
  report_table<GemmOperands::tf32>("tf32", std::make_integer_sequence<int, kTf32ConfigCount>{});
  report_table<GemmOperands::bf16>("bf16", std::make_integer_sequence<int, kHalfConfigCount>{});
  report_table<GemmOperands::f16>("fp16", std::make_integer_sequence<int, kHalfConfigCount>{});
  report_table<GemmOperands::f32_split>("split", std::make_integer_sequence<int, kSplitConfigCount>{});
}
