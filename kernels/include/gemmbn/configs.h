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
  // 1: the epilogue carries the statistics node (partials of y per tile). 0: it does not, so the row serves only
  // launches without partials (the eval forward, a training forward taking its statistics from y), and its epilogue
  // has the registers the node would hold.
  int statistics = 1;
  // Split GEMM only: 0: the mainloop splits x in registers (split_f16x3_mainloop.hpp); 1: row_scales splits x into its
  // fp16 pairs before the GEMM (into the launch's workspace) and both operands reach the tensor cores from shared
  // memory (split_f16x3_presplit_mainloop.hpp).
  int presplit = 0;
  // Rows with the statistics node, cooperative: 1 merges the node's warps once per tile (in shared memory of its own)
  // instead of once per epilogue subtile (column_moments_node.hpp kMergePerTile): TF32 row 13 (perf/NOTES.md v59, v60).
  int merge_per_tile = 0;
};

// Rows per epilogue subtile: CUTLASS's sm90 epilogue takes 128 rows per subtile in cooperative kernels,
// 64 in ping-pong ones.
inline constexpr int epilogue_rows(TileConfig const& c) {
  const int subtile_rows = c.pingpong ? 64 : 128;
  return c.tile_m < subtile_rows ? c.tile_m : subtile_rows;
}
// Rows per statistics partial: the CTA tile's (the moments node merges its subtile rows in registers).
inline constexpr int partial_rows(TileConfig const& c) { return c.tile_m; }

// select_config (kernels/src/gemm_dispatch.cpp) picks a row by shape (rule there). Each row won somewhere in
// perf/tune_gemm.py's interleaved sweeps on an H200; perf/NOTES.md, "The configuration tables' evidence",
// has the measurements behind every row and every row dropped. In short:
// - ping-pong 128x128 tiles beat 64x256 ones: a third less L2 -> shared-memory traffic per flop (cycles,
//   and energy under the power limit);
// - at M <= 2048 16-bit takes the c1x2 row, and TF32 the cooperative 128x256 one where the 2x1 cluster pads a
//   tile (the clustered rows' old "cliffs" were padded tiles: unpadded_swizzle below); both also at any M where
//   N <= 1024 and K > 4096 (x read once per 256 columns instead of 128: perf/NOTES.md v22), 16-bit launches without
//   partials excepted (the 256x128 row below: v50);
// - few tiles take the 64x128 and 64x64 rows (one tile on each of a few SMs otherwise), and short K the
//   64x128 row in 16-bit; 49-64 tiles (TF32 up to K = 4096) the 64x128 tiles on a 2x1 cluster (TF32 row 8, 16-bit
//   row 7: W's L2 reads halved; perf/NOTES.md v30);
// - under a wave of tiles with K >= 512, one data-parallel wave of cooperative tiles (both math warpgroups on a CTA's
//   one tile; ping-pong leaves one idle there) on a 2x1 cluster where it pads nothing: 128x96 ones where they fill
//   more than half a wave (more SMs busy, each with 3/4 of a 128x128 tile's work), else 128x128 past 64 tiles; TF32's
//   stream-K row where the cluster would pad (rows 4-6: perf/NOTES.md v20, v21; the 128x256 stream-K rows and 16-bit's
//   128x128 one never won); the same tiles with x multicast instead of W (128x128: TF32 row 10, 16-bit row 9; 128x96:
//   TF32 row 11, 16-bit row 10) where W's tiles have at least half as many readers as x's: every M tile reads W's
//   tiles in step, so L2's request coalescer merges their unicast loads, and the multicast halves x's (perf/NOTES.md
//   v47, v48, v50);
// - wider ping-pong epilogue subtiles spill (the moments node holds the subtile beside the accumulators);
// - launches without partials (eval, the training forward with its statistics from y) take row 0 without the moments
//   node at short K (and TF32 wherever row 0 runs): the node's per-value work is what the ping-pong epilogue cannot
//   hide there, and without it 16-bit's 64-column subtiles fit (perf/NOTES.md v23, v24); from K = 2048 both take
//   cuBLAS's cooperative 256x128 tile with x multicast (one operand tile loaded per 128x128 step against row 0's
//   1.5; with the node it lost: perf/NOTES.md v43, v44); large outputs at 512 < K <= 1024 that row's tile on a 2x2
//   cluster, x and W both multicast (TF32 row 12, 16-bit 11; perf/NOTES.md v52, v53). Such rows (statistics = 0) refuse
//   partials; CMake GEMMBN_EXPERIMENT_ROWS=ON adds experimental rows that no rule picks.
inline constexpr TileConfig kTf32Configs[] = {
    {128, 128, 32, 2, 1, 32, 1, 0, 8},  // 0: ping-pong 128x128, W multicast to 2 CTAs
    {128, 256, 32, 1, 1, 16, 0, 0, 8},  // 1: cooperative 128x256, 128x16 epilogue subtile (4 stages, not 3)
    {64, 128, 32, 1, 1, 32, 1, 0, 8},   // 2: ping-pong 64x128 (few tiles: small M x N)
    {64, 64, 32, 1, 1, 32, 1, 0, 8},    // 3: ping-pong 64x64 (fewer still)
    {128, 128, 32, 2, 1, 32, 0, 0, 8},        // 4: cooperative 128x128, W multicast to 2 CTAs (one wave, long K)
    {128, 96, 32, 2, 1, 32, 0, 0, 8},         // 5: row 4 on 128x96 tiles (one wave of them, N a multiple of 96)
    {128, 128, 32, 1, 1, 32, 0, 0, 8, 1, 1},  // 6: cooperative 128x128, stream-K (row 4 where its cluster pads)
    {128, 128, 32, 2, 1, 32, 1, 0, 8, 1, 0, 0},  // 7: row 0 without the statistics node (launches without partials)
    {64, 128, 32, 2, 1, 32, 1, 0, 8},            // 8: row 2, W multicast to 2 CTAs (half its L2 reads of W)
    // 9: cooperative 256x128 without the node, x multicast (16-bit row 8's); its 128x16 epilogue subtiles leave the
    // mainloop 4 stages, not 3 (fp32 y: 16 KB less shared memory), which long K needs (perf/NOTES.md v45)
    {256, 128, 32, 1, 2, 16, 0, 0, 8, 1, 0, 0},
    {128, 128, 32, 1, 2, 32, 0, 1, 8},  // 10: row 4 with x multicast, along M (one wave, W's tiles read in step: v47)
    {128, 96, 32, 1, 2, 32, 0, 1, 8},   // 11: row 5 with x multicast, along M (the same for 128x96 tiles: v50)
    {128, 128, 32, 2, 2, 32, 1, 0, 8, 1, 0, 0},  // 12: row 7 on a 2x2 cluster, both operands multicast (tall, v52)
    // 13: the cooperative 256x128 tile (row 9) with the statistics node merged once per tile (16-bit experiment row
    // 16's): long-K training forwards past 2048 tiles on devices under 4 TB/s of DRAM (v59, v60)
    {256, 128, 32, 1, 2, 16, 0, 0, 8, 1, 0, 1, 0, 1},
#if GEMMBN_EXPERIMENT_ROWS  // EXPERIMENT (CMake option; perf/NOTES.md v23, v45, v48, v50): picked by no rule
    {128, 128, 32, 2, 1, 64, 1, 0, 8, 1, 0, 0},   // 14: row 7, 64-column epilogue subtiles
    {128, 256, 32, 2, 1, 16, 0, 0, 8, 1, 0, 0},   // 15: cooperative 128x256 without the node, W multicast, 4 stages
    {128, 128, 32, 2, 1, 16, 0, 0, 8},            // 16: row 4 with 128x16 subtiles: 6 stages, not 5
    // 17: the 64x128 pair (row 8) with x multicast, along M: it won only where W's tiles had 8x x's readers (v50)
    {64, 128, 32, 1, 2, 32, 1, 1, 8},
#endif
};
inline constexpr TileConfig kHalfConfigs[] = {  // bf16 and fp16 share the shapes
    {128, 128, 64, 2, 1, 32, 1, 0, 8},  // 0: ping-pong 128x128, W multicast to 2 CTAs
    {128, 128, 64, 1, 2, 32, 1, 0, 8},  // 1: ping-pong 128x128, x multicast to 2 CTAs (short M)
    {64, 128, 64, 1, 1, 32, 1, 0, 8},   // 2: ping-pong 64x128 (few tiles: small M x N)
    {64, 64, 64, 1, 1, 32, 1, 0, 8},    // 3: ping-pong 64x64 (fewer still)
    {128, 128, 64, 2, 1, 32, 0, 0, 8},  // 4: cooperative 128x128, W multicast to 2 CTAs (one wave, long K)
    {128, 96, 64, 2, 1, 32, 0, 0, 8},   // 5: row 4 on 128x96 tiles (one wave of them, N a multiple of 96)
    {128, 128, 64, 2, 1, 64, 1, 0, 8, 1, 0, 0},  // 6: row 0 without the statistics node, 64-column epilogue subtiles
    {64, 128, 64, 2, 1, 32, 1, 0, 8},            // 7: row 2, W multicast to 2 CTAs (half its L2 reads of W)
    {256, 128, 64, 1, 2, 0, 0, 0, 8, 1, 0, 0},   // 8: cooperative 256x128 without the node, x multicast (cuBLAS's tile)
    {128, 128, 64, 1, 2, 32, 0, 1, 8},           // 9: row 4 with x multicast, along M (one wave, W read in step: v47)
    {128, 96, 64, 1, 2, 32, 0, 1, 8},            // 10: row 5 with x multicast, along M (TF32 row 11's: v50)
    {128, 128, 64, 2, 2, 64, 1, 0, 8, 1, 0, 0},  // 11: row 6 on a 2x2 cluster, both operands multicast (tall, v52)
#if GEMMBN_EXPERIMENT_ROWS  // EXPERIMENT (CMake option; perf/NOTES.md v23, v48, v50): picked by no rule
    {128, 128, 64, 2, 1, 32, 1, 0, 8, 1, 0, 0},  // 12: row 6 with 32-column subtiles
    {128, 192, 64, 2, 1, 32, 1, 0, 8, 1, 0, 0},  // 13: ping-pong 128x192, W multicast (QuACK's tile; NOTES v39, v43)
    {64, 128, 64, 1, 2, 32, 1, 1, 8},            // 14: row 7 with x multicast, along M (TF32 row 16's: v50)
    // 15-16: cuBLAS's cooperative 256x128 tile (row 8) with the statistics node, its warps merged per subtile (v43's
    // row 11) and once per tile (v59)
    {256, 128, 64, 1, 2, 32, 0, 0, 8, 1, 0, 1, 0, 0},
    {256, 128, 64, 1, 2, 32, 0, 0, 8, 1, 0, 1, 0, 1},
#endif
};

// The fp32-faithful split GEMM: 128x128 tiles (the tensor-core group and fp32 accumulators take 128
// registers per thread), k-tiles of split::kTileK = 32 columns, cooperative only (its mainloops are
// written for it); promotion every 4 k-tiles, raster along M with swizzle 4 (perf/NOTES.md, "The
// configuration tables' evidence"). Row 1 spreads fewer tiles than SMs over every SM along K: the
// backward's dW = dz^T x has N x K outputs and M-long reductions (perf/NOTES.md, v16). Rows 2-3 take x split
// before the GEMM (split_rows): its consumers only issue wgmmas, which outruns row 0 with the pass from N = 768
// (perf/NOTES.md v39, v41).
inline constexpr TileConfig kSplitConfigs[] = {
    {128, 128, 32, 1, 1, 32, 0, 1, 4, 4},           // 0: x split in registers, promotion every 128 columns
    {128, 128, 32, 1, 1, 32, 0, 1, 4, 4, 1},        // 1: row 0, stream-K
    {128, 128, 32, 2, 1, 32, 0, 1, 4, 4, 0, 1, 1},  // 2: x split before the GEMM, W multicast to 2 CTAs
    {128, 128, 32, 1, 1, 32, 0, 1, 4, 4, 0, 1, 1},  // 3: row 2 without the cluster (where it would pad a tile)
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

// Tiles CUTLASS's persistent schedulers walk for an M x N output on a row: each dimension of the tile grid rounded
// up to a multiple of swizzle x the cluster's extent along it. A padded tile takes a CTA's turn for nothing.
inline constexpr int64_t grid_tiles(TileConfig const& c, int M, int N, int swizzle) {
  const int64_t tiles_m = (int64_t(M) + c.tile_m - 1) / c.tile_m, tiles_n = (int64_t(N) + c.tile_n - 1) / c.tile_n;
  const int64_t step_m = int64_t(swizzle) * c.cluster_m, step_n = int64_t(swizzle) * c.cluster_n;
  return (tiles_m + step_m - 1) / step_m * step_m * ((tiles_n + step_n - 1) / step_n * step_n);
}
// Whether the row's cluster alone pads the grid (an odd number of tiles along a 2-CTA cluster's dimension).
inline constexpr bool cluster_pads(TileConfig const& c, int M, int N) {
  TileConfig unclustered = c;
  unclustered.cluster_m = unclustered.cluster_n = 1;
  return grid_tiles(c, M, N, 1) != grid_tiles(unclustered, M, N, 1);
}

// Whether s is a swizzle the persistent tile scheduler takes (a call's override, a row's).
inline constexpr bool is_swizzle(long s) { return s == 1 || s == 2 || s == 4 || s == 8; }
// The swizzle a launch passes (the call's own swizzle overrides it): the largest power of two up to the row's whose
// tile order pads no tile beyond the cluster's: 256x8192->8192 has 2 M tiles, which the c2x1 rows' swizzle 2 pads to
// 4, each padded tile a CTA's turn for nothing. These were the "cliffs" of the clustered rows at short M and small N;
// where nothing pads, the swizzle hardly matters (perf/NOTES.md v19).
inline constexpr int unpadded_swizzle(TileConfig const& c, int M, int N) {
  int swizzle = c.swizzle;
  while (swizzle > 1 && grid_tiles(c, M, N, swizzle) > grid_tiles(c, M, N, 1)) swizzle /= 2;
  return swizzle;
}

// A stream-K row's split of each tile's K range when the call leaves it to the rule (splits = -1): the most splits
// (3 or 2) that keep the 128x128 tiles' work units within one 132-SM wave where the tiles fill between a quarter and
// half of it, else 1, CUTLASS's stream-K heuristic (perf/NOTES.md v16, v29).
inline constexpr int select_splits(int M, int N) {
  constexpr int64_t kWave = 132;
  const int64_t tiles = ((int64_t(M) + 127) / 128) * ((int64_t(N) + 127) / 128);
  if (4 * tiles <= kWave || 2 * tiles > kWave) return 1;
  return 3 * tiles <= kWave ? 3 : 2;
}

// Index into the operands' table for this problem (one rule, measured rows; see gemm_dispatch.cpp); dram_gbps: as
// gemm_selected_config's (api.h).
int select_config(GemmOperands operands, int M, int N, int K, bool statistics, int dram_gbps = kCurrentDeviceDram);

}  // namespace gemmbn
