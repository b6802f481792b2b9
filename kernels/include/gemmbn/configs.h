// GEMM configurations: a table per operand type, one function picks a row. Each row is compiled in its
// own translation unit (CMake generates one per (type, row) from kernels/src/gemm_row.cuh), so a build
// runs them in parallel and adding a row is adding a line here (and bumping the row count in CMake).
#pragma once

#include "gemmbn/api.h"

namespace gemmbn {

struct TileConfig {
  // Compile time: one kernel instantiation per row.
  int tile_m, tile_n, tile_k;  // CTA tile
  int cluster_m, cluster_n;    // thread-block cluster (TMA multicast of the operand the CTAs share)
  int epilogue_n;              // epilogue subtile width in columns (0: CUTLASS's choice); spans tile_m rows
  int pingpong;                // 0: cooperative (both consumer warpgroups on one tile); 1: ping-pong (a
                               // warpgroup per tile, one's epilogue overlapping the other's mainloop)
  // Run time: the persistent tile scheduler's order (GemmScaleStatsArgs may override both).
  int raster;                  // 0: CUTLASS's heuristic, 1: along M, 2: along N
  int swizzle;                 // max swizzle size (1, 2, 4 or 8)
};

// Row 0 is the default (select_config). Measured at 16384x4096->4096 on an H200, candidates timed
// interleaved (perf/tune_gemm.py): the ping-pong 64x256 row with a 2x1 cluster and swizzle 8 was the
// fastest GEMM + statistics in every dtype (TF32 1.01x cuBLAS mm, bf16 1.03x cuBLAS addmm, fp16 1.00x),
// ahead of the cooperative 128x256 row (the shared/measurements.md probe's best). The other rows are
// kept as measured alternatives for shape-dependent selection.
inline constexpr TileConfig kTf32Configs[] = {
    {64, 256, 32, 2, 1, 32, 1, 0, 8},   // ping-pong: a warpgroup per 64-row tile
    {128, 256, 32, 2, 1, 0, 0, 0, 1},   // cooperative: both warpgroups on a 128-row tile
    {64, 256, 32, 4, 1, 32, 1, 0, 8},   // wider multicast of W
    {64, 256, 32, 1, 1, 32, 1, 0, 8},   // no multicast
    {128, 256, 32, 2, 1, 16, 0, 0, 1},  // cooperative with a 128x16 epilogue subtile: 4 mainloop stages, not 3
    {128, 256, 32, 1, 1, 16, 0, 0, 1},  // the same without multicast
    {128, 256, 16, 2, 1, 16, 0, 0, 1},  // half-depth k-blocks: twice the stages in flight
    {64, 256, 32, 2, 2, 32, 1, 0, 8},   // 2x2 cluster: x multicast too (less L2 traffic per tile)
};
inline constexpr TileConfig kHalfConfigs[] = {  // bf16 and fp16 share the shapes
    {64, 256, 64, 2, 1, 32, 1, 0, 8},
    {128, 256, 64, 2, 1, 0, 0, 0, 1},
    {64, 256, 64, 4, 1, 32, 1, 0, 8},
    {64, 256, 64, 2, 2, 32, 1, 0, 8},   // 2x2 cluster: x multicast too
    {128, 128, 64, 2, 1, 0, 0, 0, 1},   // smaller tile: more tiles when M*N is small
};

inline constexpr int kTf32ConfigCount = sizeof(kTf32Configs) / sizeof(TileConfig);
inline constexpr int kHalfConfigCount = sizeof(kHalfConfigs) / sizeof(TileConfig);

inline constexpr int config_count(DType dtype) { return dtype == DType::f32 ? kTf32ConfigCount : kHalfConfigCount; }
inline constexpr TileConfig const& config_at(DType dtype, int index) {
  return dtype == DType::f32 ? kTf32Configs[index] : kHalfConfigs[index];
}

// Index into the dtype's table for this problem.
int select_config(DType dtype, int M, int N, int K);

}  // namespace gemmbn
