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
  // 1: CUTLASS's stream-K scheduler (cooperative rows only): whole tiles for the full waves, the last
  // partial wave's tiles split along K over every SM, partial accumulators summed in a workspace in a
  // fixed order (deterministic; gemm_workspace_bytes). 0: one persistent CTA per tile, no workspace.
  int stream_k = 0;
};

// Rows per epilogue subtile: CUTLASS's sm90 epilogue takes 128 rows per subtile in cooperative kernels,
// 64 in ping-pong ones.
inline constexpr int epilogue_rows(TileConfig const& c) {
  const int subtile_rows = c.pingpong ? 64 : 128;
  return c.tile_m < subtile_rows ? c.tile_m : subtile_rows;
}
// Rows per statistics partial: the CTA tile's (the moments node merges its subtile rows in registers).
inline constexpr int partial_rows(TileConfig const& c) { return c.tile_m; }

// select_config (kernels/src/gemm_dispatch.cpp) picks a row by shape (rule there). Kept rows won
// somewhere in perf/tune_gemm.py's interleaved sweeps on an H200 (GEMM + statistics, L2 flushed, ms;
// 2026-12-01 unless said otherwise; "64x256" is the ping-pong 64x256 c2x1 row that was row 0 until then):
// - Ping-pong 128x128 tiles beat 64x256 ones: a third less L2 -> shared-memory traffic per flop, which
//   is both cycles at full clock and energy under the power limit (perf/clocks_under_load.py). bf16 at
//   16384x4096->4096: 0.728 vs 0.768 (tune_gemm), 0.719 vs 0.763 at 1980 MHz and 0.849 vs 0.873
//   power-limited at ~1400 MHz (clocks_under_load); 4096x4096->4096 0.188 vs 0.203, 65536x1024->1024
//   0.294 vs 0.309, 16384x8192->512 0.198 vs 0.209, 4096x8192->2048 0.186 vs 0.200. TF32 (c2x1): equal
//   at 16384x4096->4096 (1.531 vs 1.526; 1.667 vs 1.678 power-limited), ahead at 4096x4096->4096 (0.370
//   vs 0.390), 4096x8192->2048 (0.352 vs 0.378), 65536x512->512, 4096x512->8192, 256x4096->4096.
// - Cliffs of the c2x1 128-row tiles at short M: 1024x8192->8192 at swizzle 8 ran 0.485 ms in bf16 (0.190
//   at swizzle 1) and 0.971 in TF32; at 2048x4096->4096 bf16 0.112 vs c1x2's 0.103. So M <= 2048 takes
//   the c1x2 row in 16-bit (0.188 at 1024x8192->8192, 0.103 at 2048x4096->4096) and the cooperative
//   128x256 row in TF32 (0.358-0.373 vs 64x256's 0.38-0.39 at 1024x8192->8192). The c1x2 row has cliffs
//   of its own at small N and large M (0.528 vs 0.294 at 65536x1024->1024, 0.489 vs 0.198 at
//   16384x8192->512), hence not beyond M = 2048. A row enters the rule only after a sweep over M.
// - The cooperative 128x256 TF32 row at large M depends on the power state: 1.433 vs 1.531 at full clock,
//   1.70 vs 1.54 in a long sweep at the power limit; not chosen there. Its 32 tiles at M = 256 leave most
//   SMs idle (0.106 vs 0.070), so it takes only 512 < M <= 2048.
// - Small problems (perf/gpu_session.sh tune-small, a820b05 + these rows; GEMM + statistics ms, TF32 / bf16,
//   "T" = 128x128 tiles): the 128-row rows put one tile on each of a few SMs. 64x64 (row 3) wins at
//   128x1024->512 (T 4: 0.011 / 0.011 vs 0.040 / 0.030 for the rows chosen before; cuBLAS mm 0.012 /
//   0.008), 256x1024->1024 (T 16: 0.013 / 0.011 vs 0.031 / 0.029), 1024x1024->1024 (T 64: 0.017 / 0.014
//   vs 64x128's 0.019 / 0.016); 64x128 (row 2) at 256x4096->4096 (T 64: 0.042 vs 64x64's 0.055 in TF32,
//   0.027 vs 0.028 bf16), 256x8192->8192 in TF32 (T 128: 0.167 vs 0.178 for 128x256 and 0.251 for
//   128x128; bf16 keeps c1x2 128x128: 0.073 vs 0.087), 4096x1024->1024 (T 256, short K: 0.039 / 0.030 vs
//   128x128 c2x1's 0.044 / 0.037). Ties within 5%: 512x2048->2048 (0.028 vs 0.029 TF32, 0.019 vs 0.018
//   bf16). Unchanged where T >= 256 with K >= 4096: 1024x4096->4096 (128x256 0.110, c1x2 0.055 vs
//   64x128's 0.169 / 0.086), 2048x4096->4096 and 1024x8192->8192.
// - Stream-K rows (perf/gpu_session.sh tune-stream-k, 9 shapes, heuristic order; GEMM + statistics ms):
//   the TF32 cooperative 128x128 row wins under a wave of tiles with long K: 256x8192->8192 0.126 vs
//   64x128's 0.175 (cuBLAS mm 0.102), 4096x8192->512 0.108 vs 0.111 for row 0 (64x128 slower still).
//   Elsewhere the persistent rows stay ahead: 16384x4096->4096 TF32 1.483 vs 1.730 / 1.972 (stream-K
//   128x256 / 128x128), bf16 0.723 vs 0.889; 1024x4096->4096, 1024x8192->8192, 16384x8192->512 and the
//   short-K shapes by 5-25%. Plain split-K (2 or 4 ways) never won. bf16's stream-K row won only at
//   4096x8192->512 (0.064 vs 0.068) and lost at 256x8192->8192 (0.128 vs c1x2's 0.073): not in the rule.
// - Short K with many tiles (perf/gpu_session.sh tune-epilogue, cb201cd: its butterfly lane merge serves
//   the 64x128 row, not the 128-row ping-pong ones; heuristic order, swizzle 1; TF32 / bf16): the 64x128
//   row (2) wins at K = 512 in 16-bit everywhere measured, 16384x512->8192 (T 8192) 0.417 vs 0.494 for
//   row 0, 4096x512->8192 0.113 vs 0.143, 65536x512->512 0.108 vs 0.142, 16384x512->2048 0.108 vs 0.141,
//   and in TF32 up to T 2048 (0.167 / 0.156 / 0.167 vs 0.175 / 0.174 / 0.173; at T 8192 row 0 0.613 vs
//   0.637). At K = 1024 it wins in 16-bit at T 1024 (16384x1024->1024 0.086 vs 0.092, 4096x1024->4096
//   0.079 vs 0.094) but not at T 4096 (65536x1024->1024 0.320 vs 0.294); TF32 keeps row 0 there.
//   Measured at M >= 4096 only.
// - Wider ping-pong epilogue subtiles spill (the moments node keeps the subtile's values in registers
//   beside the 128x128 accumulators): epilogue_n 64 280 B (TF32) / 200 B (bf16) of stack, 128 792 B.
// - Dropped earlier (at 16384x4096->4096): 16-bit cooperative 256x128 c1x2 (cuBLAS nvjet's tile) 0.869-0.887
//   and 128x256 c2x1 0.884-0.901 vs 64x256's 0.776-0.787; cooperative TF32 rows with 4 or 8 stages; 4x1 and
//   2x2 clusters (9-13% slower); a TF32 ping-pong row without a cluster (0.735 at swizzle 8, 1.406 at
//   swizzle 1 at 2048x8192->8192, the reverse at 1024).
inline constexpr TileConfig kTf32Configs[] = {
    {128, 128, 32, 2, 1, 32, 1, 0, 8},  // 0: ping-pong 128x128, W multicast to 2 CTAs
    {128, 256, 32, 1, 1, 16, 0, 0, 8},  // 1: cooperative 128x256, 128x16 epilogue subtile (4 stages, not 3)
    {64, 128, 32, 1, 1, 32, 1, 0, 8},   // 2: ping-pong 64x128 (few tiles: small M x N)
    {64, 64, 32, 1, 1, 32, 1, 0, 8},    // 3: ping-pong 64x64 (fewer still)
    {128, 128, 32, 1, 1, 32, 0, 0, 8, 1, 1},  // 4: cooperative 128x128, stream-K
    {128, 256, 32, 1, 1, 16, 0, 0, 8, 1, 1},  // 5: row 1, stream-K
};
inline constexpr TileConfig kHalfConfigs[] = {  // bf16 and fp16 share the shapes
    {128, 128, 64, 2, 1, 32, 1, 0, 8},  // 0: ping-pong 128x128, W multicast to 2 CTAs
    {128, 128, 64, 1, 2, 32, 1, 0, 8},  // 1: ping-pong 128x128, x multicast to 2 CTAs (short M)
    {64, 128, 64, 1, 1, 32, 1, 0, 8},   // 2: ping-pong 64x128 (few tiles: small M x N)
    {64, 64, 64, 1, 1, 32, 1, 0, 8},    // 3: ping-pong 64x64 (fewer still)
    {128, 128, 64, 2, 1, 32, 0, 0, 8, 1, 1},  // 4: cooperative 128x128, W multicast to 2 CTAs, stream-K
    {128, 256, 64, 1, 1, 16, 0, 0, 8, 1, 1},  // 5: cooperative 128x256, stream-K
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
int select_config(GemmOperands operands, int M, int N, int K, bool statistics);

}  // namespace gemmbn
