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

// select_config (kernels/src/gemm_dispatch.cpp) picks a row by shape. Kept rows are the ones that won
// somewhere in perf/tune_gemm.py's interleaved sweeps on an H200 (GEMM + statistics, L2 flushed):
// - 16384x4096->4096: the ping-pong 64x256 row with a 2x1 cluster, swizzle 8, in every dtype (TF32
//   1.585 ms vs cuBLAS mm 1.601; bf16 0.804 vs addmm 0.803). Cooperative 128x256 rows ran 1.72-1.81 ms
//   in TF32 whatever their epilogue subtile (4 stages), k-depth (8 stages) or cluster; 4x1 and 2x2
//   clusters 9-13% slower (dropped).
// - 1024x8192->8192 (short M, long K): TF32 ping-pong without a cluster 0.366 ms (cuBLAS addmm 0.354),
//   the 2x1 row above 0.377+; bf16 the cooperative 128x256 row 0.195 (ping-pong 0.201, addmm 0.175).
inline constexpr TileConfig kTf32Configs[] = {
    {64, 256, 32, 2, 1, 32, 1, 0, 8},   // 0: ping-pong, a warpgroup per 64-row tile; W multicast to 2 CTAs
    {64, 256, 32, 1, 1, 32, 1, 0, 8},   // 1: the same without multicast (short M)
    {128, 256, 32, 1, 1, 16, 0, 0, 1},  // 2: cooperative 128x256, 128x16 epilogue subtile (4 stages, not 3)
};
inline constexpr TileConfig kHalfConfigs[] = {  // bf16 and fp16 share the shapes
    {64, 256, 64, 2, 1, 32, 1, 0, 8},   // 0: ping-pong
    {128, 256, 64, 2, 1, 0, 0, 0, 1},   // 1: cooperative 128x256 (short M)
};

inline constexpr int kTf32ConfigCount = sizeof(kTf32Configs) / sizeof(TileConfig);
inline constexpr int kHalfConfigCount = sizeof(kHalfConfigs) / sizeof(TileConfig);

inline constexpr int config_count(DType dtype) { return dtype == DType::f32 ? kTf32ConfigCount : kHalfConfigCount; }
inline constexpr TileConfig const& config_at(DType dtype, int index) {
  return dtype == DType::f32 ? kTf32Configs[index] : kHalfConfigs[index];
}

// Index into the dtype's table for this problem (one rule, measured rows; see gemm_dispatch.cpp).
int select_config(DType dtype, int M, int N, int K);

}  // namespace gemmbn
