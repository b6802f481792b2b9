// Validation, configuration choice and per-type dispatch of the fused GEMM; device queries.
#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "gemmbn/api.h"
#include "gemmbn/configs.h"
#include "gemmbn/device_info.h"
#include "gemmbn/gemm_runners.h"
#include "gemmbn/switches.h"

#ifndef GEMMBN_CUBLAS_PRODUCT  // CMake sets it (0 or 1)
#define GEMMBN_CUBLAS_PRODUCT 0
#endif

namespace gemmbn {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

std::atomic<int64_t> host_marks[kHostMarks] = {};  // host_mark_ns's values

// The shape rules' measures: a wave is 132 SMs on an H100/H200; short K is where a mainloop leaves each tile's fixed
// cost exposed, long K where the mainloop dwarfs the epilogue; problems are counted in 128x128 output tiles.
constexpr int kWave = 132, kShortK = 1024, kLongK = 4096;
// Rows select_config and train_statistics_from_y both name: row 0 (ping-pong 128x128, both tables), and the
// cooperative 256x128 row without the statistics node (TF32 row 9, 16-bit row 8), which launches without partials
// take from K = kWideTileK.
constexpr int kWide = 0, kTf32WideTile = 9, kHalfWideTile = 8, kWideTileK = 2048, kYPassMaxTiles = 2048;
constexpr int wide_tile_row(GemmOperands operands) {
  return operands == GemmOperands::tf32 ? kTf32WideTile : kHalfWideTile;
}
static_assert(config_at(GemmOperands::tf32, kTf32WideTile).tile_m == 256 &&
                  config_at(GemmOperands::tf32, kTf32WideTile).statistics == 0 &&
                  config_at(GemmOperands::bf16, kHalfWideTile).tile_m == 256 &&
                  config_at(GemmOperands::bf16, kHalfWideTile).statistics == 0,
              "configs.h's cooperative 256x128 rows: TF32 row 9, 16-bit row 8");
// The one-wave cooperative rows with x multicast (a 1x2 cluster) instead of W: 128x128 tiles (row 4's: TF32 row 10,
// 16-bit 9) and 128x96 ones (row 5's: TF32 row 11, 16-bit 10).
constexpr int kTf32OneWaveX = 10, kHalfOneWaveX = 9, kTf32OneWave96X = 11, kHalfOneWave96X = 10;
// Row 0's tile without the statistics node on a 2x2 cluster, x and W both multicast (TF32 row 12, 16-bit 11), for
// launches without partials at 512 < K <= 1024 with N <= kTallN, from kTf32TallMinM / kHalfTallMinM rows: from
// kTallTiles 128x128 tiles, or from kTallM rows; 16-bit also from kHalfTallTiles tiles at any M (perf/NOTES.md v52,
// v53, v55, v56), on devices whose DRAM peaks under kLowDramGbps: an H100 SXM (3.35 TB/s), where the cluster won;
// not an H200 (4.8 TB/s), where row 0's tile alone ran 1.5-7% faster at every such shape (v54).
constexpr int kTf32TallRow = 12, kHalfTallRow = 11, kTallM = 65536, kTallN = 8192, kTallTiles = 2048;
constexpr int kTf32TallMinM = 8192, kHalfTallMinM = 32768, kHalfTallTiles = 5120;
// TF32's cooperative 256x128 tile with the node merged once per tile (row 13): launches with partials past
// kYPassMaxTiles tiles with K >= kLongK, where its 1x2 cluster pads nothing, on devices under kLowDramGbps (training
// forwards 3.4-8.6% faster than on row 0 on an H100 SXM, slower on an H200: perf/NOTES.md v59, v60).
constexpr int kTf32WideNodeRow = 13;
static_assert(config_at(GemmOperands::tf32, kTf32WideNodeRow).tile_m == 256 &&
                  config_at(GemmOperands::tf32, kTf32WideNodeRow).statistics == 1 &&
                  config_at(GemmOperands::tf32, kTf32WideNodeRow).merge_per_tile == 1,
              "configs.h's TF32 row 13: the cooperative 256x128 tile with the node merged once per tile");
// Device DRAM peaks (GB/s) under which the clauses above apply: an H100 SXM's 3352, not an H200's 4915.
constexpr int kLowDramGbps = 4000;
// Whether a device with this DRAM peak (GB/s; kCurrentDeviceDram: the current device's) peaks under kLowDramGbps; an
// unknown one does not (the rows it would take otherwise run anywhere, at the losses measured on the H100).
bool low_dram_device(int dram_gbps) {
  if (dram_gbps == kCurrentDeviceDram) dram_gbps = device_dram_gbps();
  return dram_gbps > 0 && dram_gbps < kLowDramGbps;
}
constexpr bool one_wave_x_row(GemmOperands operands, int row, int tile_n) {
  return config_at(operands, row).cluster_n == 2 && config_at(operands, row).pingpong == 0 &&
         config_at(operands, row).tile_n == tile_n && config_at(operands, row).statistics == 1;
}
static_assert(one_wave_x_row(GemmOperands::tf32, kTf32OneWaveX, 128) &&
                  one_wave_x_row(GemmOperands::bf16, kHalfOneWaveX, 128) &&
                  one_wave_x_row(GemmOperands::tf32, kTf32OneWave96X, 96) &&
                  one_wave_x_row(GemmOperands::bf16, kHalfOneWave96X, 96),
              "configs.h's one-wave rows with x multicast: TF32 rows 10 and 11, 16-bit rows 9 and 10");
constexpr bool tall_row(GemmOperands operands, int row) {
  const TileConfig& c = config_at(operands, row);
  return c.tile_m == 128 && c.tile_n == 128 && c.cluster_m == 2 && c.cluster_n == 2 && c.statistics == 0;
}
static_assert(tall_row(GemmOperands::tf32, kTf32TallRow) && tall_row(GemmOperands::bf16, kHalfTallRow),
              "configs.h's 2x2-cluster rows without the statistics node: TF32 row 12, 16-bit row 11");
// Whether a row's grid has at most twice as many tiles along N (readers of each x tile) as along M (readers of each W
// tile): one wave's M tiles then read W's tiles in step, L2's request coalescer merges those unicast loads, and
// multicasting x saves more than multicasting W (perf/NOTES.md v47, v50).
bool w_read_in_step(TileConfig const& c, int M, int N) {
  return (int64_t(N) + c.tile_n - 1) / c.tile_n <= 2 * ((int64_t(M) + c.tile_m - 1) / c.tile_m);
}
// Narrow outputs: x, the large operand at long K, is read once per tile column, so few of them matter.
constexpr int kNarrowN = 1024;
// 128-wide tiles along one dimension of the output, and in all.
int64_t tiles_along(int extent) { return (int64_t(extent) + 127) / 128; }
int64_t tiles_128(int M, int N) { return tiles_along(M) * tiles_along(N); }

// Whether a row's tile grid spans more 128-column blocks along N than the output has: a 256-wide tile, or a 2-CTA
// cluster along N, over an odd number of them computes a tile column for nothing.
bool pads_along_n(TileConfig const& c, int N) {
  const int64_t tiles_n = (int64_t(N) + c.tile_n - 1) / c.tile_n;
  const int64_t grid_columns = (tiles_n + c.cluster_n - 1) / c.cluster_n * c.cluster_n * c.tile_n;
  return grid_columns > tiles_along(N) * 128;
}

// The waves a row's grid spans (a partial last wave counts whole).
int64_t waves(TileConfig const& c, int M, int N) { return (grid_tiles(c, M, N, 1) + kWave - 1) / kWave; }
// A launch's time in whole waves of its grid, each weighted by the row's tile area: the measure that compares two
// rows' grids at short K, where a tile's time goes with its area.
int64_t wave_cost(TileConfig const& c, int M, int N) { return waves(c, M, N) * c.tile_m * c.tile_n; }

// The table's first row without the statistics node (configs.h puts row 0's tile there), or -1.
constexpr int first_row_without_statistics(GemmOperands operands) {
  for (int row = 0; row < config_count(operands); ++row) {
    if (config_at(operands, row).statistics == 0) return row;
  }
  return -1;
}
static_assert(first_row_without_statistics(GemmOperands::tf32) > 0 &&
                  first_row_without_statistics(GemmOperands::bf16) > 0,
              "select_config gives launches without partials a row without the statistics node");

// GEMMBN_SPLIT_ROW: a split row without stream-K that select_config takes wherever it takes one of those (for A/B runs
// of the two mainloops: perf/NOTES.md v39), or -1.
int forced_split_row() {
  static const int index = static_cast<int>(integer_switch("GEMMBN_SPLIT_ROW", -1));
  const bool valid = index >= 0 && index < kSplitConfigCount && !config_at(GemmOperands::f32_split, index).stream_k;
  return valid ? index : -1;
}

// GEMMBN_PLAIN_ROW / GEMMBN_STATISTICS_ROW: a row of this table without / with the statistics node that select_config
// takes for launches without / with partials (eval or a training forward with its statistics from y / the epilogue's)
// past the small and one-wave rows (for A/B runs of wider tiles, such as GEMMBN_NO_STATISTICS_ROWS's: perf/NOTES.md
// v42, v43), or -1 where unset or not such a row.
int forced_row(GemmOperands operands, bool statistics) {
  static const int plain = static_cast<int>(integer_switch("GEMMBN_PLAIN_ROW", -1));
  static const int with_node = static_cast<int>(integer_switch("GEMMBN_STATISTICS_ROW", -1));
  const int index = statistics ? with_node : plain;
  const bool valid = index >= 0 && index < config_count(operands) &&
                     config_at(operands, index).statistics == int(statistics) && !config_at(operands, index).stream_k;
  return valid ? index : -1;
}

// Bytes of x's fp16 pairs (split_rows's output) for a presplit row.
size_t presplit_bytes(int M, int K) { return sizeof(uint16_t) * size_t(M) * size_t(split_weight_columns(K)); }

}  // namespace

#ifndef GEMMBN_TF32_ROWS
#error "CMake defines GEMMBN_TF32_ROWS, GEMMBN_HALF_ROWS and GEMMBN_SPLIT_ROWS (rows compiled per table)"
#endif
static_assert(GEMMBN_TF32_ROWS == kTf32ConfigCount && GEMMBN_HALF_ROWS == kHalfConfigCount &&
                  GEMMBN_SPLIT_ROWS == kSplitConfigCount,
              "CMakeLists.txt compiles a different number of rows than configs.h lists: update GEMMBN_*_ROWS");

// Row by shape. The clauses, in order (the numbers behind each: perf/NOTES.md, "The configuration tables' evidence"):
// - small problems, counted in 128x128 tiles: 64x64 tiles up to 32 of them, or 64 with K <= 1024;
// - under a wave with K >= 512: TF32 up to 64 tiles with K > 4096 its stream-K row; 49-64 tiles the 64x128 pair row;
//   else the most of one wave: cooperative 128x96 where it fills over half a wave, else the 64x128 row up to 64
//   tiles, else cooperative 128x128; the cooperative rows with x multicast (c1x2) where W's tiles are read in step,
//   else with W's (c2x1), where the cluster pads nothing; else TF32's stream-K row past K = 4096;
// - launches without partials past a wave at K <= 1024, and TF32's wherever it would take row 0: row 0's tile without
//   the statistics node, whose per-value work costs time even where it is idle; on a 2x2 cluster (x and W both
//   multicast) at 512 < K <= 1024 with N <= 8192 from 2048 tiles or M = 65536 (M >= 8192 in TF32, 32768 in 16-bit;
//   16-bit also from 5120 tiles at any M), where the cluster pads nothing, on devices with DRAM under 4 TB/s (the
//   H100, not the H200);
// - the 64x128 row (its butterfly lane merge where the epilogue dominates): TF32 under a wave, K <= 1024 up to two
//   waves, then K <= 512 (TF32 up to 16 waves) and 16-bit K <= 1024 up to 8 waves;
// - N <= 1024 with K > 4096: row 1 (x, the large operand, read once per 256 columns), but for 16-bit launches without
//   partials;
// - launches without partials past a wave from K = 2048 and M > 512: cuBLAS's cooperative 256x128 tile without the
//   node (TF32 row 9, 16-bit row 8), which loads one operand tile per 128x128 of output against row 0's 1.5
//   (perf/NOTES.md v43, v44);
// - larger problems: ping-pong 128x128 (row 0); at M <= 2048 the 1x2-cluster row in 16-bit, and in TF32 the 64x128
//   row up to M = 512, then the cooperative 128x256 row where a 2x1 cluster would pad a tile; TF32 launches with
//   partials past 2048 tiles with K >= 4096 on devices under 4 TB/s of DRAM: the 256x128 tile with the node (row 13).
// The split GEMM has one tile shape: under a wave with K past kShortK its stream-K row (x split in registers); elsewhere
// from N = 768 x split before the GEMM, on a 2x1 cluster where it pads nothing; below, x split in registers (row 0):
// the pass over x costs per row what the faster mainloop saves per column tile, so it pays from N = 768 on
// (perf/NOTES.md v39, v41).
int select_config(GemmOperands operands, int M, int N, int K, bool statistics, int dram_gbps) {
  constexpr int kShortM = 2048, kFewRows = 512;
  constexpr int kShortMRow = 1, kNarrow = 2, kSmall = 3;  // rows of kTf32Configs / kHalfConfigs
  constexpr int kOneWave = 4, kOneWave96 = 5, kStreamK = 6;  // kStreamK: TF32's only
  constexpr int kShorterK = 512;
  constexpr int kSplitRegisters = 0, kSplitStreamK = 1, kSplitPresplitPair = 2, kSplitPresplit = 3, kPresplitN = 768;
  const bool tf32 = operands == GemmOperands::tf32, short_k = K <= kShortK;
  const int narrow_pair = tf32 ? 8 : 7;  // 64x128 tiles in 2x1 clusters
  const int64_t tiles = tiles_128(M, N);
  const auto pads = [&](int row) { return cluster_pads(config_at(operands, row), M, N); };
  // An x-multicast row pays where W's tiles are read in step and its cluster pads nothing (v47, v50).
  const auto x_multicast_pays = [&](int row) { return w_read_in_step(config_at(operands, row), M, N) && !pads(row); };
  if (operands == GemmOperands::f32_split) {
    if (tiles < kWave && !short_k) return kSplitStreamK;
    if (const int forced = forced_split_row(); forced >= 0) return forced;
    if (N < kPresplitN) return kSplitRegisters;
    return pads(kSplitPresplitPair) ? kSplitPresplit : kSplitPresplitPair;
  }
  if (tiles <= 32 || (tiles <= 64 && short_k)) return kSmall;
  if (tiles < kWave && K >= kShorterK) {
    const TileConfig& narrow = config_at(operands, kOneWave96);
    const int64_t narrow_tiles = grid_tiles(narrow, M, N, 1);
    // 128x96 tiles filling more than half of one wave (a partial last column of them loses at K >= 4096).
    const bool narrow_fills = 2 * narrow_tiles > kWave && narrow_tiles <= kWave;
    const bool narrow_wave = narrow_fills && !pads(kOneWave96);
    // TF32 past K = 4096: its stream-K row (split-K 2 or 3 from 34 tiles, select_splits) even where 128x96 tiles
    // would fill a wave (v29).
    if (tf32 && tiles <= 64 && K > kLongK) return kStreamK;
    // 49-64 tiles (TF32 up to K = 4096): 64x128 tiles sharing W's loads in pairs, half the L2 reads of W (v30).
    if (tiles > 48 && tiles <= 64 && !pads(narrow_pair)) return narrow_pair;
    if (tiles <= 64) return narrow_wave ? kOneWave96 : kNarrow;
    // x multicast instead of W wherever W's tiles are read in step (w_read_in_step; at K = 512 to 8192: v47, v50).
    if (narrow_fills && (N % narrow.tile_n == 0 || K < kLongK)) {
      const int x_row = tf32 ? kTf32OneWave96X : kHalfOneWave96X;
      if (x_multicast_pays(x_row)) return x_row;
      if (narrow_wave) return kOneWave96;
    }
    const int one_wave_x = tf32 ? kTf32OneWaveX : kHalfOneWaveX;
    if (x_multicast_pays(one_wave_x)) return one_wave_x;
    if (!pads(kOneWave)) return kOneWave;
    if (tf32 && K > kLongK) return kStreamK;
  }
  if (const int forced = forced_row(operands, statistics); forced >= 0) return forced;
  const int wide = statistics ? kWide : first_row_without_statistics(operands);
  if (!statistics && short_k && tiles >= kWave) {
    // Large outputs at 512 < K <= 1024: multicasting W as well as x took 1-10% off eval and 0-7% off the training
    // forward on an H100 from 2048 tiles (TF32 from M = 8192, 16-bit from 32768 or from 5120 tiles: level at 4096
    // tiles under M = 32768) up to N = 8192 and at M = 65536 down to N = 256; it tied or lost at 1024 tiles and fewer
    // with M <= 32768 (perf/NOTES.md v52, v53, v55, v56), and lost on an H200 (v54). The device is asked last: only
    // launches of those shapes pay for the query.
    const int tall = tf32 ? kTf32TallRow : kHalfTallRow, tall_min_m = tf32 ? kTf32TallMinM : kHalfTallMinM;
    const bool large = N <= kTallN && (M >= kTallM || (M >= tall_min_m && tiles >= kTallTiles) ||
                                       (!tf32 && tiles >= kHalfTallTiles));
    return K > kShorterK && large && !pads(tall) && low_dram_device(dram_gbps) ? tall : wide;
  }
  if ((tf32 && tiles < kWave) || (short_k && tiles <= 2 * kWave)) return kNarrow;
  // Short K with more tiles, statistics on (launches without took their row above): the epilogue dominates and the
  // 64x128 row's one subtile row per tile takes the butterfly lane merge.
  if (K <= kShorterK && (!tf32 || tiles <= 16 * kWave)) return kNarrow;
  if (!tf32 && short_k && tiles <= 8 * kWave) return kNarrow;
  // N <= 1024 with K > 4096: x, the large operand, is read once per N tile; row 1 halves that (TF32 256-wide tiles,
  // 16-bit x multicast to a 1x2 cluster) where its tiles along N pad nothing (v22).
  // 16-bit launches without partials take the 256x128 row below instead: it outran row 1 there (v50).
  if (K > kLongK && N <= kNarrowN && !pads_along_n(config_at(operands, kShortMRow), N) && (statistics || tf32)) {
    return kShortMRow;
  }
  if (!statistics && K >= kWideTileK && tiles >= kWave && M > kFewRows) return wide_tile_row(operands);
  if (tf32) {
    if (M <= kFewRows) return kNarrow;
    if (M <= kShortM && pads(kWide)) return kShortMRow;
    const bool wide_node = statistics && K >= kLongK && tiles > kYPassMaxTiles && !pads(kTf32WideNodeRow);
    return wide_node && low_dram_device(dram_gbps) ? kTf32WideNodeRow : wide;  // the device asked last
  }
  return M <= kShortM ? kShortMRow : kWide;
}

// Where the training statistics come from: finish_normalize's pass over y where it costs less than the epilogue's
// per-tile reductions, since the GEMM without partials takes a row without the statistics node (v24-v26, v43, v44; the
// numbers: perf/NOTES.md, "The configuration tables' evidence"). Wherever that is cuBLAS's 256x128 tile against row 0
// with the node, from a wave to 2048 tiles (K >= 2048; 16-bit with M > 2048). Past a wave of 128x128
// tiles with K <= 1024 (16-bit: 2048), unless the epilogue's 64x128 grid fills its last wave enough better than the y
// pass's 128x128 one to outweigh the node (wave_cost; over three waves it never does); and TF32 with N <= 1024 and
// K > 4096 past a wave, where the cooperative 128x256 row's epilogue follows each tile's mainloop instead of overlapping
// the next one. Never the split GEMM (its mainloop dwarfs the epilogue), never under a wave (the one-wave and small
// rows keep their node). GEMMBN_STATISTICS_SOURCE=epilogue|y overrides it (tests run both sources; perf A/B runs).
bool train_statistics_from_y(GemmOperands operands, int M, int N, int K) {
  if (const char forced = forced_choice("GEMMBN_STATISTICS_SOURCE")) return forced == 'y';
  const bool half = operands == GemmOperands::bf16 || operands == GemmOperands::f16;
  const int64_t tiles = tiles_128(M, N);
  if (operands == GemmOperands::f32_split || tiles <= kWave) return false;
  const int epilogue_row = select_config(operands, M, N, K, true), y_pass_row = select_config(operands, M, N, K, false);
  const TileConfig& epilogue = config_at(operands, epilogue_row);
  // Where the launch without partials takes the 256x128 row and the one with them row 0, up to 2048 tiles: that row's
  // speed outweighs the pass over y there, and past it no longer (perf/NOTES.md v43, v44, v46).
  if (epilogue_row == kWide && y_pass_row == wide_tile_row(operands) && tiles <= kYPassMaxTiles) {
    return true;
  }
  if (K > kLongK) {
    return operands == GemmOperands::tf32 && N <= kNarrowN && epilogue.pingpong == 0 && epilogue.tile_n == 256;
  }
  if (K > (half ? 2 : 1) * kShortK) return false;
  const TileConfig& y_pass = config_at(operands, y_pass_row);
  return waves(y_pass, M, N) > 3 || wave_cost(y_pass, M, N) <= wave_cost(epilogue, M, N);
}

// Where the training forward's product comes from: cuBLAS (the operators call torch's mm; the finish's product variant
// adds bias and scale and takes the statistics from y) or gemmbn's GEMM. cuBLAS's long-K kernels outrun ours by more
// than the y pass costs in 16-bit at K > 4096 from 256 to 2048 tiles of 128x128. An experiment, compiled in by CMake
// GEMMBN_CUBLAS_PRODUCT (off; else never): synchronized the forward ran slower (cuBLAS's host path) and the training
// step no faster (perf/NOTES.md v28, "The configuration tables' evidence").
bool train_product_by_cublas(GemmOperands operands, int M, int N, int K) {
  if (!GEMMBN_CUBLAS_PRODUCT || (operands != GemmOperands::bf16 && operands != GemmOperands::f16)) return false;
  if (const char forced = forced_choice("GEMMBN_TRAIN_PRODUCT")) return forced == 'c';
  const int64_t tiles = tiles_128(M, N);
  return K > kLongK && tiles >= 256 && tiles <= 2048;
}

int gemm_config_count(GemmOperands operands) { return config_count(operands); }

int gemm_selected_config(GemmOperands operands, int M, int N, int K, bool statistics, int dram_gbps) {
  return select_config(operands, M, N, K, statistics, dram_gbps);
}

int device_dram_gbps() {
  int gbps = 0;
  return current_dram_gbps(gbps) == cudaSuccess ? gbps : 0;
}

bool gemm_config_row(GemmOperands operands, int config, int M, int N, int K, int out[kConfigFields],
                     bool statistics) {
  if (config < 0) config = select_config(operands, M, N, K, statistics);
  if (config < 0 || config >= config_count(operands)) return false;
  const TileConfig& c = config_at(operands, config);
  const int row[kConfigFields] = {c.tile_m,   c.tile_n,   c.tile_k, c.cluster_m,     c.cluster_n, c.epilogue_n,
                                  c.pingpong, c.raster, unpadded_swizzle(c, M, N), c.promote_tiles, c.stream_k,
                                  c.statistics, c.presplit, c.merge_per_tile, partial_rows(c)};
  for (int i = 0; i < kConfigFields; ++i) out[i] = row[i];
  return true;
}

namespace {

// A runtime row index to its instantiation (each row's runner lives in its own translation unit).
template <GemmOperands Operands, int... Rows>
Status run_row(int row, GemmScaleStatsArgs const& args, cudaStream_t stream, std::integer_sequence<int, Rows...>) {
  using Runner = Status (*)(GemmScaleStatsArgs const&, cudaStream_t);
  static constexpr Runner runners[] = {&detail::GemmRunner<Operands, Rows>::run...};
  return runners[row](args, stream);
}
template <GemmOperands Operands, int... Rows>
Status row_workspace(int row, GemmScaleStatsArgs const& args, size_t& bytes, std::integer_sequence<int, Rows...>) {
  using Query = Status (*)(GemmScaleStatsArgs const&, size_t&);
  static constexpr Query queries[] = {&detail::GemmRunner<Operands, Rows>::workspace_bytes...};
  return queries[row](args, bytes);
}

template <GemmOperands Operands>
Status run_row(int row, GemmScaleStatsArgs const& args, cudaStream_t stream) {
  return run_row<Operands>(row, args, stream, std::make_integer_sequence<int, config_count(Operands)>{});
}
template <GemmOperands Operands>
Status row_workspace(int row, GemmScaleStatsArgs const& args, size_t& bytes) {
  return row_workspace<Operands>(row, args, bytes, std::make_integer_sequence<int, config_count(Operands)>{});
}

// The table row the call runs (args.config, or select_config's choice), once the row and schedule
// overrides are checked: shared by the launch and the workspace query.
Status resolve_row(GemmScaleStatsArgs const& args, GemmOperands operands, int& row) {
  if (args.config >= config_count(operands)) return Status::invalid("config is not a row of the operands' table");
  if (args.raster > 2) return Status::invalid("raster must be 0 (heuristic), 1 (along M) or 2 (along N)");
  if (args.swizzle > 0 && !is_swizzle(args.swizzle)) {
    return Status::invalid("swizzle must be 1, 2, 4 or 8");
  }
  const bool statistics = args.partial_mean != nullptr;
  row = args.config >= 0 ? args.config : select_config(operands, args.M, args.N, args.K, statistics);
  if ((statistics || args.batches_tracked) && config_at(operands, row).statistics == 0) {
    return Status::invalid("this configuration row has no statistics node: partials and batches_tracked need a row "
                           "with one (statistics = 1)");
  }
  if (args.splits > 1 && config_at(operands, row).stream_k == 0) {
    return Status::invalid("splits > 1 needs a stream-K configuration row (stream_k = 1)");
  }
  return Status::success();
}

}  // namespace

Status gemm_workspace_bytes(const GemmScaleStatsArgs& args, size_t& bytes) {
  bytes = 0;
  if (args.M < 1 || args.N < 1 || args.K < 1) return Status::invalid("M, N and K must be positive");
  const GemmOperands operands = gemm_operands(args);
  int row = 0;
  if (Status s = resolve_row(args, operands, row); !s) return s;
  if (config_at(operands, row).presplit) {
    bytes = presplit_bytes(args.M, args.K);
    return Status::success();
  }
  if (config_at(operands, row).stream_k == 0) return Status::success();  // no device query needed
  switch (operands) {
    case GemmOperands::tf32: return row_workspace<GemmOperands::tf32>(row, args, bytes);
    case GemmOperands::bf16: return row_workspace<GemmOperands::bf16>(row, args, bytes);
    case GemmOperands::f16: return row_workspace<GemmOperands::f16>(row, args, bytes);
    case GemmOperands::f32_split: return row_workspace<GemmOperands::f32_split>(row, args, bytes);
  }
  return Status::invalid("unknown operand types");
}

Status gemm_scale_stats(const GemmScaleStatsArgs& args, cudaStream_t stream) {
  if (args.M < 1 || args.N < 1 || args.K < 1) return Status::invalid("M, N and K must be positive");
  const int vector = 16 / dtype_size(args.dtype);
  if (args.K % vector != 0) return Status::invalid("K must be a multiple of 16 bytes of the dtype (TMA rows)");
  if (args.N % vector != 0) return Status::invalid("N must be a multiple of 16 bytes of the dtype (TMA rows)");
  const GemmOperands operands = gemm_operands(args);
  const bool split = operands == GemmOperands::f32_split;
  if ((args.weight_split == nullptr) != (args.weight_unscale == nullptr) ||
      (args.weight_split == nullptr) != (args.x_scale == nullptr)) {
    return Status::invalid("weight_split, weight_unscale and x_scale go together");
  }
  if (args.weight_split && args.dtype != DType::f32) return Status::invalid("the split GEMM takes float32 x");
  if (!args.x || !(split || args.weight) || !args.y) return Status::invalid("x, weight and y must not be null");
  for (const void* p : {args.x, args.weight, args.weight_split, static_cast<const void*>(args.x_scale),
                        static_cast<const void*>(args.y), args.bias, args.scale, static_cast<const void*>(args.gain),
                        static_cast<const void*>(args.shift), static_cast<const void*>(args.workspace)}) {
    if (p && !aligned16(p)) return Status::invalid("every array must start on a 16-byte boundary");
  }
  if ((args.partial_mean == nullptr) != (args.partial_m2 == nullptr)) {
    return Status::invalid("partial_mean and partial_m2 go together");
  }
  if (args.tile_flow && !args.partial_mean) return Status::invalid("tile_flow counts the tiles' partials: it needs them");
  int row = 0;
  if (Status s = resolve_row(args, operands, row); !s) return s;
  if (config_at(operands, row).presplit &&
      (args.workspace == nullptr || args.workspace_bytes < presplit_bytes(args.M, args.K))) {
    return Status::invalid("this configuration row needs a workspace of gemm_workspace_bytes bytes (x's pairs)");
  }
  note_host_mark(HostMark::gemm_launching);
  Status launched = Status::invalid("unknown operand types");
  switch (operands) {
    case GemmOperands::tf32: launched = run_row<GemmOperands::tf32>(row, args, stream); break;
    case GemmOperands::bf16: launched = run_row<GemmOperands::bf16>(row, args, stream); break;
    case GemmOperands::f16: launched = run_row<GemmOperands::f16>(row, args, stream); break;
    case GemmOperands::f32_split: {
      // x's per-row scales first (and on presplit rows its pairs, into the workspace): the split mainloop reads them
      // with each stage.
      const bool presplit = config_at(operands, row).presplit != 0;
      launched = row_scales({static_cast<const float*>(args.x), args.M, args.K, args.x_scale, args.x_row_max_bits,
                             presplit ? args.workspace : nullptr},
                            stream);
      if (launched) launched = run_row<GemmOperands::f32_split>(row, args, stream);
      break;
    }
  }
  if (launched) note_host_mark(HostMark::gemm_enqueued);
  return launched;
}

void note_host_mark(HostMark mark) { host_marks[int(mark)].store(monotonic_ns(), std::memory_order_relaxed); }

int64_t host_mark_ns(HostMark mark) { return host_marks[int(mark)].load(std::memory_order_relaxed); }

int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
}

cudaError_t current_device_info(int& device, int& sm_count) {
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  return cached_per_device(device, sm_count, [device](int& count) {
    return cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  });
}

cudaError_t current_dram_gbps(int& gbps) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  return cached_per_device(device, gbps, [device](int& peak) {
    int clock_khz = 0, bus_bits = 0;
    cudaError_t e = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
    peak = int(2 * int64_t(clock_khz) * (bus_bits / 8) / 1000000);  // kHz x bytes per transfer -> GB/s
    return e;
  });
}

Status device_support(int device) {
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) return Status::from_cuda(e, "querying the device's compute capability");
  if (major != 9 || minor != 0) {
    return {Status::unsupported, cudaSuccess, "the fused kernels are built for sm_90a (Hopper: H100/H200)"};
  }
  return Status::success();
}

}  // namespace gemmbn
