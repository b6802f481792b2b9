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
  // Split GEMM only (1 elsewhere): k-tiles summed on the tensor cores between fp32 promotions
  // (split_f16x3_mainloop.hpp).
  int promote_tiles = 1;
};

// Rows per statistics partial: the epilogue subtile's height (CUTLASS's sm90 epilogue takes 128 rows
// per subtile in cooperative kernels, 64 in ping-pong ones), so a 256-row tile writes two partials.
inline constexpr int partial_rows(TileConfig const& c) {
  const int subtile_rows = c.pingpong ? 64 : 128;
  return c.tile_m < subtile_rows ? c.tile_m : subtile_rows;
}

// select_config (kernels/src/gemm_dispatch.cpp) picks a row by shape: TF32 row 1 at M <= 2048, else row 0.
// Kept rows won somewhere in perf/tune_gemm.py's interleaved sweeps on an H200 (GEMM + statistics, L2
// flushed, ms):
// - 16384x4096->4096: ping-pong 64x256, 2x1 cluster, swizzle 8 in every dtype (TF32 1.553-1.585 vs cuBLAS mm
//   1.601; bf16 0.788-0.804 vs addmm 0.780-0.803). Cooperative 128x256 TF32 rows ran 1.72-1.81 whatever
//   their epilogue subtile (4 stages), k-depth (8 stages) or cluster; 4x1 and 2x2 clusters lost 9-13%.
// - TF32 at M <= 2048: cooperative 128x256 without a cluster, 128x16 epilogue subtile, swizzle 8: 0.360 vs
//   row 0 0.389 at 1024x8192->8192, 0.752 vs 0.755 at 2048x8192->8192, 0.189 vs 0.197 at 2048x4096->4096.
// - 16-bit cooperative rows at 16384x4096->4096 (H200, 2026-12-01, three runs): 256x128 with a 1x2
//   cluster (cuBLAS nvjet's tile; two 128-row statistics partials per tile) 0.869-0.887 ms and 128x256
//   with 2x1 0.884-0.901, against row 0's 0.776-0.787 (bf16; fp16 alike): dropped.
// - Dropped for cliffs: the tile order of the persistent scheduler can double a short-M GEMM's time. The
//   bf16 cooperative 128x256 row (2x1 cluster) ran 0.372 vs row 0's 0.388 at 2048x8192->8192 with swizzle
//   8 but 0.386 vs 0.207 at 1024x8192->8192; a TF32 ping-pong row without a cluster ran 0.735 at swizzle 8
//   and 1.406 at swizzle 1 at 2048x8192->8192, the reverse at 1024. Row 0 showed no cliff at any size.
inline constexpr TileConfig kTf32Configs[] = {
    {64, 256, 32, 2, 1, 32, 1, 0, 8},   // 0: ping-pong, a warpgroup per 64-row tile; W multicast to 2 CTAs
    {128, 256, 32, 1, 1, 16, 0, 0, 8},  // 1: cooperative 128x256, 128x16 epilogue subtile (4 stages, not 3)
    {128, 128, 32, 2, 1, 32, 1, 0, 8},  // EXPERIMENT 2: ping-pong 128x128, W multicast
};
inline constexpr TileConfig kHalfConfigs[] = {  // bf16 and fp16 share the shapes
    {64, 256, 64, 2, 1, 32, 1, 0, 8},   // 0: ping-pong
    {128, 128, 64, 2, 1, 32, 1, 0, 8},  // EXPERIMENT 1: ping-pong 128x128 (less L2 traffic per flop), W multicast
    {128, 128, 64, 1, 2, 32, 1, 0, 8},  // EXPERIMENT 2: ping-pong 128x128, x multicast
};

// The fp32-faithful split GEMM: 128x128 tiles (the tensor-core group and fp32 accumulators take 128
// registers per thread), k-tiles of split::kTileK = 32 columns, cooperative only (its mainloop is
// written for it). Measured with perf/tune_gemm.py on an H200 at 16384x4096->4096 (row_scales + GEMM
// + statistics, L2 flushed; 786f642): promotion every 4 k-tiles 3.00-3.05 ms, every 2 3.36, every 8
// 3.32; a 2x1 cluster multicasting W 3.56 (and 3.39 vs 3.20 in the per-k-tile design). Raster along M,
// swizzle 4 was the best order (3.00 vs 3.05 for the heuristic with swizzle 8). 128x64 epilogue
// subtiles (half the statistics merges, one stage less) ran 3.27 vs 3.01 (4bcc231's run). With x's
// loads a k-tile ahead of its split (891f87e): 2.63 ms, against 3.47 for the same row without in
// that run.
inline constexpr TileConfig kSplitConfigs[] = {
    {128, 128, 32, 1, 1, 32, 0, 1, 4, 4},  // 0: promotion every 128 columns
};

inline constexpr int kTf32ConfigCount = sizeof(kTf32Configs) / sizeof(TileConfig);
inline constexpr int kHalfConfigCount = sizeof(kHalfConfigs) / sizeof(TileConfig);
inline constexpr int kSplitConfigCount = sizeof(kSplitConfigs) / sizeof(TileConfig);

inline constexpr int config_count(GemmOperands operands) {
  switch (operands) {
    case GemmOperands::tf32: return kTf32ConfigCount;
    case GemmOperands::f32_split: return kSplitConfigCount;
    default: return kHalfConfigCount;
  }
}
inline constexpr TileConfig const& config_at(GemmOperands operands, int index) {
  switch (operands) {
    case GemmOperands::tf32: return kTf32Configs[index];
    case GemmOperands::f32_split: return kSplitConfigs[index];
    default: return kHalfConfigs[index];
  }
}

// Index into the operands' table for this problem (one rule, measured rows; see gemm_dispatch.cpp).
int select_config(GemmOperands operands, int M, int N, int K);

}  // namespace gemmbn
