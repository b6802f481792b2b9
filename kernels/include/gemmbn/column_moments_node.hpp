// Epilogue visitor node (CUTLASS 3.x sm90 EVT): per-column moments of its input over each CTA tile's rows.
//
//   partial_mean[t, n] = mean_m v[m, n],   partial_m2[t, n] = sum_m (v[m, n] - mean)^2
//   over the rows m < M of M-tile t (where kRaggedTileFromY, api.h: of the full M-tiles only); v is forwarded
//   unchanged to the parent.
//
// NOTES:
// - Reduced once per epilogue subtile, so only the current subtile's columns live in registers (the
//   stock Sm90RowReduction keeps all CTA_N columns per thread and its loops stay rolled under nvcc
//   13.0: a 704 B stack frame).
// - Per thread and column, then Chan merges across lanes (shuffles) and warps (smem) in a fixed order:
//   no cancellation of large sums, no atomics, the same bits on every run. In full tiles of one subtile
//   row the lanes that share columns merge by a butterfly reduce-scatter (each lane ends with its share
//   of the columns), elsewhere by a tree per column (kLaneButterfly says why). A tile of several subtile
//   rows (ping-pong: two of 64) merges them in the writing thread's registers (CUTLASS walks epi_m
//   innermost) and writes one partial per tile: half the partial stores and finish reads of a partial
//   per subtile. Tiles with every row valid (all but a ragged last one) merge equal power-of-two
//   counts without a division (reduce_full_tile); the ragged tile carries counts (reduce_partial_tile).
// - The warp-merge scratch is the epilogue's current D smem stage, free between the store pipeline's
//   acquire and the register-to-smem copy that follows reduce().
// - kMergePerTile (configs.h merge_per_tile; cooperative rows, TF32 row 13): full tiles merge their subtile rows per
//   thread, their lanes once per subtile column, and their warps once per tile, through shared memory of the node's
//   own (CTA_N x 8 warps x (mean, M2) floats), so a tile takes one barrier of the node's instead of two per subtile.
// - batches_tracked (optional) is incremented once per launch by tile (0, 0): the finish kernel runs
//   after the GEMM on the stream and reads the new count for momentum=None.
// - flow (optional, gemmbn/tile_flow.h): each tile inside the problem, once its y is written (not only read out of
//   shared memory) and its partials stored, counts itself for its column tile; the first epilogue lets the finish's
//   programmatic launch start.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "gemmbn/api.h"
#include "gemmbn/moments.cuh"
#include "gemmbn/no_workspace_node.hpp"
#include "gemmbn/tile_flow.h"

namespace gemmbn::epilogue {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

struct ColumnMomentsArguments {
  float* partial_mean = nullptr;  // [ceil(M / CTA_M), N]
  float* partial_m2 = nullptr;    // [ceil(M / CTA_M), N]
  int64_t* batches_tracked = nullptr;
  int* flow = nullptr;    // the finish's dataflow counters, zeroed before the launch (tile_flow.h); null: none
};

template <class CtaTileShapeMNK, bool kMergePerTile = false>
struct Sm90ColumnMoments : NoWorkspaceNode<ColumnMomentsArguments> {
  static constexpr int kTileColumns = decltype(size<1>(CtaTileShapeMNK{}))::value;
  // The warps along M of a cooperative epilogue (two consumer warpgroups: 8) bound the per-tile merge's entries.
  static constexpr int kMaxWarpsM = 8;
  struct TileMergeStorage {
    float mean[kTileColumns * kMaxWarpsM];  // [column][warp_m], this tile's lane-merged moments
    float m2[kTileColumns * kMaxWarpsM];
  };
  struct NoStorage {};
  using SharedStorage = cute::conditional_t<kMergePerTile, TileMergeStorage, NoStorage>;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return (args.partial_mean == nullptr) == (args.partial_m2 == nullptr);
  }

  CUTLASS_HOST_DEVICE Sm90ColumnMoments() {}
  CUTLASS_HOST_DEVICE Sm90ColumnMoments(Params const& params, SharedStorage const& shared)
      : params(params), tile_merge(const_cast<SharedStorage*>(&shared)) {}

  Params params;
  SharedStorage* tile_merge = nullptr;  // used only where kMergePerTile

  // SubtileCoords: (CPY,CPY_M,CPY_N,EPI_M,EPI_N) CTA-relative (m, n) of each value this thread visits.
  // ColumnSlots:   (CPY,CPY_M,CPY_N) register layout with stride 0 along rows: one slot per column.
  template <class SubtileCoords, class Residue, class ColumnSlots, class LaneLayoutMN, class WarpLayoutMN,
            int EpiTileM, int EpiTileN, int kEpiM, int kEpiN, int kThreads>
  struct ConsumerStoreCallbacks : fusion::detail::EmptyConsumerStoreCallbacks {
    static constexpr int kValues = decltype(size(ColumnSlots{}))::value;  // values per thread per subtile
    static constexpr int kLanesM = decltype(size<0>(LaneLayoutMN{}))::value;
    static constexpr int kWarpsM = decltype(size<0>(WarpLayoutMN{}))::value;
    // Cross-warp merge entries (column, warp_m) per subtile and the rounds kThreads threads take for them.
    static constexpr int kPlane = kWarpsM * EpiTileN;
    static constexpr int kRounds = (kPlane + kThreads - 1) / kThreads;
    static constexpr int kSlots = decltype(cosize(ColumnSlots{}))::value;  // columns per thread per subtile
    static constexpr int kRowsPerSlot = kValues / kSlots;                   // rows per thread per column
    static_assert(decltype(size(filter_zeros(ColumnSlots{})))::value == kSlots, "compact column slots");
    static_assert(decltype(size(LaneLayoutMN{}))::value == cutlass::NumThreadsPerWarp, "lanes must tile (M, N)");
    static_assert(kValues % kSlots == 0 && (kRowsPerSlot & (kRowsPerSlot - 1)) == 0 &&
                      (kLanesM & (kLanesM - 1)) == 0, "equal power-of-two counts in full tiles");
    static_assert((kSlots & (kSlots - 1)) == 0, "the butterfly halves the column slots");
    // The lane merge: the butterfly where a tile has one subtile row; the tree where it has several
    // (ping-pong 128-row tiles), where the butterfly measured slower (perf/NOTES.md v9, same-call A/B).
    static constexpr bool kLaneButterfly = kEpiM == 1;
    // Slots left per lane after the butterfly's splitting steps.
    static constexpr int kFinalSlots = kSlots > kLanesM ? kSlots / kLanesM : 1;

    // The butterfly pairs lanes by XOR: a step along M must flip one bit of the lane index that no other
    // step and no column offset uses, i.e. lane(m, n) = lane(m, 0) | lane(0, n) with disjoint bits.
    static constexpr bool lane_m_steps_are_lane_bits() {
      if (LaneLayoutMN{}(0, 0) != 0) return false;
      constexpr int kLanesN = cutlass::NumThreadsPerWarp / kLanesM;
      for (int m = 0; m < kLanesM; ++m) {
        int flipped = 0;
        for (int bit = 1; bit < kLanesM; bit *= 2) {
          if (m & bit) flipped ^= int(LaneLayoutMN{}(bit, 0));
        }
        if (int(LaneLayoutMN{}(m, 0)) != flipped) return false;
        for (int n = 0; n < kLanesN; ++n) {
          const int lane_of_n = int(LaneLayoutMN{}(0, n));
          if ((flipped & lane_of_n) != 0 || int(LaneLayoutMN{}(m, n)) != (flipped | lane_of_n)) return false;
        }
      }
      return true;
    }
    static_assert(lane_m_steps_are_lane_bits(), "lanes along M must differ in their own bits of the lane index");

    // The per-tile merge: entries (column, warp_m) of the whole tile, the rounds for them, and the subtile rows a
    // thread merges in registers before its lanes merge (CUTLASS walks epi_m innermost, so they are consecutive).
    static constexpr int kTilePlane = kWarpsM * EpiTileN * kEpiN;
    static constexpr int kTileRounds = (kTilePlane + kThreads - 1) / kThreads;
    static_assert(!kMergePerTile || (EpiTileN * kEpiN == kTileColumns && kWarpsM <= kMaxWarpsM &&
                                     (kEpiM == 1 || kEpiM == 2)),
                  "the per-tile merge: subtiles tile the CTA's columns, at most kMaxWarpsM warps and two subtile rows");

    CUTLASS_DEVICE ConsumerStoreCallbacks(Params const& params, SharedStorage* tile_merge, SubtileCoords coords,
                                          Residue residue, int m_tile, int n_tile, int n_total, int lane_m, int warp_m,
                                          int thread_idx)
        : params(params), tile_merge(tile_merge), coords(coords), residue(residue), m_tile(m_tile), n_tile(n_tile),
          n_total(n_total), lane_m(lane_m), warp_m(warp_m), thread_idx(thread_idx) {}

    Params const& params;
    SharedStorage* tile_merge;
    SubtileCoords coords;
    Residue residue;  // (rows, cols) of the problem left from the CTA origin
    int m_tile, n_tile, n_total, lane_m, warp_m, thread_idx;
    cutlass::Array<float, kValues> values;  // this subtile's inputs, kept for reduce()
    // The tile's earlier subtile rows of the current columns, per round, in the thread that writes them.
    // Their count is epi_m * EpiTileM: only a tile's last subtile inside the problem can be short.
    cutlass::Array<float, kRounds> carry_mean, carry_m2;
    // The per-tile merge: this thread's column slots of the subtile rows before the current one (epi_m = 0).
    cutlass::Array<float, kMergePerTile ? kSlots : 1> slot_carry_mean, slot_carry_m2;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementInput, FragmentSize> visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                                                           int, int, cutlass::Array<ElementInput, FragmentSize> const& input) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        values[epi_v * FragmentSize + i] = static_cast<float>(input[i]);
      }
      return input;
    }

    template <class SmemTensor, class SyncFn, class VisitResults>
    CUTLASS_DEVICE void reduce(SmemTensor&& smem_buffer, SyncFn const& sync_fn, int epi_m, int epi_n, bool,
                               VisitResults const&) {
      if (params.partial_mean == nullptr) return;
      // Uniform across the CTA: rows of this subtile inside the problem.
      const int rows_left = get<0>(residue) - epi_m * EpiTileM;
      if (rows_left <= 0 || get<1>(residue) <= 0) return;  // beyond the problem (rounded-up tile or cluster)
      static_assert(3 * kWarpsM * EpiTileN * sizeof(float) <=
                        decltype(cosize(smem_buffer.layout()))::value *
                            sizeof(typename cute::remove_cvref_t<SmemTensor>::value_type),
                    "epilogue smem stage too small for the column-moments scratch");
      float* scratch = reinterpret_cast<float*>(raw_pointer_cast(smem_buffer.data()));
      if constexpr (kRaggedTileFromY) {  // full row blocks only; reduce_partial_tile is never instantiated
        if (get<0>(residue) < kEpiM * EpiTileM) return;  // a ragged last row block: the finish reads its rows from y
        if constexpr (kMergePerTile) {
          reduce_full_tile_once(sync_fn, epi_m, epi_n);
        } else {
          reduce_full_tile(scratch, sync_fn, epi_m, epi_n);
        }
        return;
      }
      if constexpr (kMergePerTile) {
        if (get<0>(residue) >= kEpiM * EpiTileM) {  // every row of the tile (uniform across the CTA)
          reduce_full_tile_once(sync_fn, epi_m, epi_n);
          return;
        }
      }
      if (rows_left >= EpiTileM) {
        reduce_full_tile(scratch, sync_fn, epi_m, epi_n);
      } else {
        reduce_partial_tile(scratch, sync_fn, epi_m, epi_n);
      }
    }

    // Every row valid, so every merge joins two halves of equal power-of-two count (chan_merge_equal_halves): no
    // counts, no division, no bounds checks. Columns past N are reduced too and never written.
    template <class SyncFn>
    CUTLASS_DEVICE void reduce_full_tile(float* scratch, SyncFn const& sync_fn, int epi_m, int epi_n) {
      // 1. Per thread and column slot.
      Tensor slot_sum = make_tensor<float>(ColumnSlots{});
      Tensor slot_sq = make_tensor<float>(ColumnSlots{});
      slot_moments(slot_sum, slot_sq);
      // 2. Across the lanes that share columns, 3. into the cross-warp scratch [mean | M2][column][warp_m].
      //    The stage is free: the epilogue synchronized after acquiring it, and the previous subtile's
      //    reads of it ended with a barrier.
      if constexpr (kLaneButterfly) {
        cutlass::Array<float, kSlots> slot_mean, slot_m2;
        slot_arrays(slot_sum, slot_sq, slot_mean, slot_m2);
        merge_lanes_butterfly(scratch, scratch + kPlane, slot_mean, slot_m2, 0.5f * kRowsPerSlot, epi_m, epi_n);
      } else {
        merge_lanes_tree(scratch, slot_sum, slot_sq, epi_m, epi_n);
      }
      sync_fn();
      // One thread per (column, warp) entry; the kWarpsM entries of a column sit in consecutive lanes.
      CUTLASS_PRAGMA_UNROLL
      for (int round = 0; round < kRounds; ++round) {
        int entry = round * kThreads + thread_idx;
        bool valid = entry < kPlane;
        float mean_w = valid ? scratch[entry] : 0.f;
        float m2_w = valid ? scratch[kPlane + entry] : 0.f;
        merge_warps(mean_w, m2_w, 0.5f * kRowsPerSlot * kLanesM);
        if (valid && entry % kWarpsM == 0) {
          accumulate_or_write(round, entry / kWarpsM, epi_m, epi_n, float(EpiTileM), mean_w, m2_w);
        }
      }
      sync_fn();  // the scratch is the D stage the register-to-smem copy writes next
    }

    // The per-tile merge (kMergePerTile), every row of the tile valid, so every merge joins equal power-of-two
    // counts (reduce_full_tile's halving): a thread's slots of its two subtile rows in registers, then the lanes
    // into the node's shared memory once per subtile column, then, at the tile's last subtile, one barrier and the
    // warps of every column. No barrier after the reads: the store after this reduce() synchronizes the epilogue's
    // threads (CUTLASS's tma_store_fn) before any of them reaches the next tile's writes.
    template <class SyncFn>
    CUTLASS_DEVICE void reduce_full_tile_once(SyncFn const& sync_fn, int epi_m, int epi_n) {
      Tensor slot_sum = make_tensor<float>(ColumnSlots{});
      Tensor slot_sq = make_tensor<float>(ColumnSlots{});
      slot_moments(slot_sum, slot_sq);
      cutlass::Array<float, kSlots> slot_mean, slot_m2;
      slot_arrays(slot_sum, slot_sq, slot_mean, slot_m2);
      if constexpr (kEpiM == 2) {
        if (epi_m == 0) {  // CUTLASS unrolls the subtile loops: this folds at compile time
          slot_carry_mean = slot_mean, slot_carry_m2 = slot_m2;
          return;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kSlots; ++j) {
          float mean = slot_carry_mean[j], m2 = slot_carry_m2[j];
          chan_merge_equal_halves(mean, m2, slot_mean[j], slot_m2[j], 0.5f * kRowsPerSlot);
          slot_mean[j] = mean, slot_m2[j] = m2;
        }
      }
      const int column_entries = epi_n * EpiTileN * kWarpsM;
      merge_lanes_butterfly(tile_merge->mean + column_entries, tile_merge->m2 + column_entries, slot_mean, slot_m2,
                            0.5f * kRowsPerSlot * kEpiM, epi_m, epi_n);
      if (epi_n != kEpiN - 1) return;
      sync_fn();  // every subtile column's entries are in
      CUTLASS_PRAGMA_UNROLL
      for (int round = 0; round < kTileRounds; ++round) {
        const int entry = round * kThreads + thread_idx;
        const bool valid = entry < kTilePlane;
        float mean_w = valid ? tile_merge->mean[entry] : 0.f;
        float m2_w = valid ? tile_merge->m2[entry] : 0.f;
        merge_warps(mean_w, m2_w, 0.5f * kRowsPerSlot * kLanesM * kEpiM);
        if (valid && entry % kWarpsM == 0) write_partial(n_tile * kTileColumns + entry / kWarpsM, mean_w, m2_w);
      }
    }

    // Per thread and column slot: the exact two-pass mean (in slot_sum) and M2 of its kRowsPerSlot values.
    template <class SlotTensor>
    CUTLASS_DEVICE void slot_moments(SlotTensor& slot_sum, SlotTensor& slot_sq) {
      fill(slot_sum, 0.f);
      fill(slot_sq, 0.f);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kValues; ++i) slot_sum(i) += values[i];
      Tensor mean = filter_zeros(slot_sum);  // views: one entry per slot
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSlots; ++j) mean(j) *= 1.f / kRowsPerSlot;  // power of two: exact
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kValues; ++i) {
        float d = values[i] - slot_sum(i);
        slot_sq(i) = fmaf(d, d, slot_sq(i));
      }
    }

    // Slot tensors (ColumnSlots' layout) as arrays indexed by slot: the butterfly's halves known at compile time.
    template <class SlotTensor>
    CUTLASS_DEVICE static void slot_arrays(SlotTensor const& slot_sum, SlotTensor const& slot_sq,
                                           cutlass::Array<float, kSlots>& slot_mean,
                                           cutlass::Array<float, kSlots>& slot_m2) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kValues; ++i) {
        if (!first_of_slot(i)) continue;  // folds at compile time
        slot_mean[ColumnSlots{}(i)] = slot_sum(i);
        slot_m2[ColumnSlots{}(i)] = slot_sq(i);
      }
    }

    // The kWarpsM entries of a column, in consecutive lanes, each of 2 half_rows rows: all lanes end with the merge.
    CUTLASS_DEVICE static void merge_warps(float& mean_w, float& m2_w, float half_rows) {
      static_assert(kWarpsM <= cutlass::NumThreadsPerWarp && (kWarpsM & (kWarpsM - 1)) == 0, "warps along M");
      CUTLASS_PRAGMA_UNROLL
      for (int step = 1; step < kWarpsM; step *= 2) {
        const float mean_b = __shfl_xor_sync(0xffffffff, mean_w, step);
        const float m2_b = __shfl_xor_sync(0xffffffff, m2_w, step);
        chan_merge_equal_halves(mean_w, m2_w, mean_b, m2_b, half_rows);  // symmetric: all lanes agree
        half_rows *= 2.f;
      }
    }

    // A butterfly reduce-scatter across the lanes that share columns, each lane left with its share of
    // the columns to write: kSlots - 1 shuffle pairs where the tree takes kSlots * log2(kLanesM). Each slot holds
    // 2 half_count rows; the writers store (column, warp_m) at column * kWarpsM + warp_m of mean_out and m2_out.
    CUTLASS_DEVICE void merge_lanes_butterfly(float* mean_out, float* m2_out, cutlass::Array<float, kSlots> slot_mean,
                                              cutlass::Array<float, kSlots> slot_m2, float half_count, int epi_m,
                                              int epi_n) {
      // At each step a lane keeps half of its window of slots (the upper half if its bit of lane_m is
      // set), sends the other half to its partner and merges what it receives; once kFinalSlots are left,
      // the remaining steps merge symmetrically (both lanes get the same bits) and only the lane with
      // those bits clear writes. The lane ends with slots slot_base + [0, kFinalSlots).
      int slot_base = 0;
      bool writer = true;
      CUTLASS_PRAGMA_UNROLL
      for (int step = kLanesM / 2, width = kSlots; step > 0; step /= 2) {
        const int lane_offset = LaneLayoutMN{}(step, 0);
        const bool upper = (lane_m & step) != 0;
        if (width > kFinalSlots) {
          const int half = width / 2;
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < half; ++j) {
            const float send_mean = upper ? slot_mean[j] : slot_mean[j + half];
            const float send_m2 = upper ? slot_m2[j] : slot_m2[j + half];
            float keep_mean = upper ? slot_mean[j + half] : slot_mean[j];
            float keep_m2 = upper ? slot_m2[j + half] : slot_m2[j];
            const float mean_b = __shfl_xor_sync(0xffffffff, send_mean, lane_offset);
            const float m2_b = __shfl_xor_sync(0xffffffff, send_m2, lane_offset);
            chan_merge_equal_halves(keep_mean, keep_m2, mean_b, m2_b, half_count);
            slot_mean[j] = keep_mean, slot_m2[j] = keep_m2;
          }
          slot_base += upper ? half : 0;
          width = half;
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < kFinalSlots; ++j) {
            const float mean_b = __shfl_xor_sync(0xffffffff, slot_mean[j], lane_offset);
            const float m2_b = __shfl_xor_sync(0xffffffff, slot_m2[j], lane_offset);
            chan_merge_equal_halves(slot_mean[j], slot_m2[j], mean_b, m2_b, half_count);  // symmetric: lanes agree
          }
          writer = writer && !upper;
        }
        half_count *= 2.f;
      }

      Tensor subtile_coords = coords(_, _, _, epi_m, epi_n);
      if (writer) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kFinalSlots; ++j) {
          const int slot = slot_base + j;
          int column = 0;  // of this slot within the subtile: a select per slot, the coordinates are static
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kValues; ++i) {
            if (!first_of_slot(i)) continue;
            column = int(ColumnSlots{}(i)) == slot ? int(get<1>(subtile_coords(i))) - epi_n * EpiTileN : column;
          }
          const int at = column * kWarpsM + warp_m;
          mean_out[at] = slot_mean[j];
          m2_out[at] = slot_m2[j];
        }
      }
    }

    // A tree per column slot towards lane_m == 0, which writes every slot.
    template <class SlotTensor>
    CUTLASS_DEVICE void merge_lanes_tree(float* scratch, SlotTensor& slot_sum, SlotTensor& slot_sq, int epi_m,
                                         int epi_n) {
      Tensor mean = filter_zeros(slot_sum);  // views: one entry per slot
      Tensor m2 = filter_zeros(slot_sq);
      float half_count = 0.5f * kRowsPerSlot;
      CUTLASS_PRAGMA_UNROLL
      for (int step = kLanesM / 2; step > 0; step /= 2) {
        const int lane_offset = LaneLayoutMN{}(step, 0);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kSlots; ++j) {
          const float mean_b = __shfl_down_sync(0xffffffff, mean(j), lane_offset);
          const float m2_b = __shfl_down_sync(0xffffffff, m2(j), lane_offset);
          chan_merge_equal_halves(mean(j), m2(j), mean_b, m2_b, half_count);
        }
        half_count *= 2.f;
      }
      Tensor subtile_coords = coords(_, _, _, epi_m, epi_n);
      if (lane_m == 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kValues; ++i) {
          if (!first_of_slot(i)) continue;  // folds at compile time
          int column = get<1>(subtile_coords(i)) - epi_n * EpiTileN;
          int at = column * kWarpsM + warp_m;
          scratch[at] = slot_sum(i);
          scratch[kPlane + at] = slot_sq(i);
        }
      }
    }

    // One column's moments over this subtile's rows (count, mean, M2), merged into the tile's earlier
    // subtile rows; written once the tile's last subtile with rows inside the problem is in. Only the
    // thread of entry round * kThreads + thread_idx == column * kWarpsM calls it for a column, in both
    // reduce paths, so the carry stays in one thread.
    CUTLASS_DEVICE void accumulate_or_write(int round, int subtile_column, int epi_m, int epi_n, float count,
                                            float mean, float m2) {
      if (epi_m > 0) {  // Chan merge; equal power-of-two halves (two 64-row subtiles) merge exactly
        float carried_rows = float(epi_m * EpiTileM);
        chan_merge_fast(carried_rows, carry_mean[round], carry_m2[round], count, mean, m2);
        mean = carry_mean[round], m2 = carry_m2[round];
      }
      const bool last = epi_m == kEpiM - 1 || get<0>(residue) <= (epi_m + 1) * EpiTileM;
      if (!last) {
        carry_mean[round] = mean, carry_m2[round] = m2;
        return;
      }
      write_partial(n_tile * kTileColumns + epi_n * EpiTileN + subtile_column, mean, m2);
    }

    // This M tile's partials of one column of the problem (columns past N were reduced and are dropped here).
    CUTLASS_DEVICE void write_partial(int column, float mean, float m2) {
      if (column < n_total) {
        const size_t at = static_cast<size_t>(m_tile) * n_total + column;
        params.partial_mean[at] = mean;
        params.partial_m2[at] = m2;
      }
    }

    // The last M-tile (rows past M): per-slot counts, Chan merges with a fast reciprocal.
    template <class SyncFn>
    CUTLASS_DEVICE void reduce_partial_tile(float* scratch, SyncFn const& sync_fn, int epi_m, int epi_n) {
      Tensor subtile_coords = coords(_, _, _, epi_m, epi_n);

      // 1. Per thread and column: sums of (v - first v), then (count, mean, M2).
      Tensor shift = make_tensor<float>(ColumnSlots{});
      Tensor sum1 = make_tensor<float>(ColumnSlots{});
      Tensor sum2 = make_tensor<float>(ColumnSlots{});
      Tensor count = make_tensor<float>(ColumnSlots{});
      CUTLASS_PRAGMA_UNROLL
      for (int i = kValues - 1; i >= 0; --i) {
        shift(i) = values[i];
      }
      fill(sum1, 0.f);
      fill(sum2, 0.f);
      fill(count, 0.f);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kValues; ++i) {
        if (elem_less(subtile_coords(i), residue)) {
          float d = values[i] - shift(i);
          sum1(i) += d;
          sum2(i) = fmaf(d, d, sum2(i));
          count(i) += 1.f;
        }
      }
      Tensor slot_n = filter_zeros(count);
      Tensor slot_mean = filter_zeros(shift);
      Tensor slot_s1 = filter_zeros(sum1);
      Tensor slot_m2 = filter_zeros(sum2);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSlots; ++j) {
        float n = slot_n(j);
        float mean_offset = n > 0.f ? __fdividef(slot_s1(j), n) : 0.f;  // n <= tile rows: exact to ~2 ulp
        slot_mean(j) = n > 0.f ? slot_mean(j) + mean_offset : 0.f;
        slot_m2(j) = fmaxf(fmaf(-slot_s1(j), mean_offset, slot_m2(j)), 0.f);
      }

      // 2. Across the lanes that share columns (tree towards lane_m == 0).
      CUTLASS_PRAGMA_UNROLL
      for (int step = kLanesM / 2; step > 0; step /= 2) {
        int lane_offset = LaneLayoutMN{}(step, 0) - LaneLayoutMN{}(0, 0);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kSlots; ++j) {
          float n_b = __shfl_down_sync(0xffffffff, slot_n(j), lane_offset);
          float mean_b = __shfl_down_sync(0xffffffff, slot_mean(j), lane_offset);
          float m2_b = __shfl_down_sync(0xffffffff, slot_m2(j), lane_offset);
          chan_merge_fast(slot_n(j), slot_mean(j), slot_m2(j), n_b, mean_b, m2_b);
        }
      }

      // 3. Across the warps that share columns, through smem: [count | mean | M2][warp_m][column].
      if (lane_m == 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kValues; ++i) {
          if (!first_of_slot(i)) continue;
          int column = get<1>(subtile_coords(i)) - epi_n * EpiTileN;
          int at = warp_m * EpiTileN + column;
          scratch[at] = count(i);
          scratch[kPlane + at] = shift(i);
          scratch[2 * kPlane + at] = sum2(i);
        }
      }
      sync_fn();
      // The column's thread is the one reduce_full_tile uses (entry = column * kWarpsM), for the carry.
      CUTLASS_PRAGMA_UNROLL
      for (int round = 0; round < kRounds; ++round) {
        int entry = round * kThreads + thread_idx;
        if (entry < kPlane && entry % kWarpsM == 0) {
          int subtile_column = entry / kWarpsM;
          float n = scratch[subtile_column];
          float mean = scratch[kPlane + subtile_column];
          float m2 = scratch[2 * kPlane + subtile_column];
          CUTLASS_PRAGMA_UNROLL
          for (int w = 1; w < kWarpsM; ++w) {
            int at = w * EpiTileN + subtile_column;
            chan_merge_fast(n, mean, m2, scratch[at], scratch[kPlane + at], scratch[2 * kPlane + at]);
          }
          accumulate_or_write(round, subtile_column, epi_m, epi_n, n, mean, m2);
        }
      }
      sync_fn();  // the scratch is the D stage the register-to-smem copy writes next
    }

    // True for the first value index of each column slot (slots repeat along rows with stride 0).
    CUTLASS_DEVICE static constexpr bool first_of_slot(int i) {
      for (int k = 0; k < i; ++k) {
        if (ColumnSlots{}(k) == ColumnSlots{}(i)) return false;
      }
      return true;
    }

    CUTLASS_DEVICE void end() {
      if (params.batches_tracked != nullptr && m_tile == 0 && n_tile == 0 && thread_idx == 0) {
        *params.batches_tracked += 1;
      }
      static_assert(TileFlow::kLanes == cutlass::NumThreadsPerWarp, "a stored tile counts once per lane of its warp");
      if (params.flow != nullptr && thread_idx < cutlass::NumThreadsPerWarp) signal_tile_stored(params.flow);
    }

    // Run by each lane of the warp that issued the tile's TMA stores of y (CUTLASS's epilogue issues them from the whole
    // warp), after the epilogue's last barrier, so after every thread's partials: the lane waits until its stores are
    // written (not only read out of shared memory), then adds its count, release-ordered after them, the partials and
    // batches_tracked. A column tile is complete at TileFlow::kLanes x tiles_m. No warp-wide sync or single-lane section:
    // either made nvcc restructure the epilogue (twice the code, and a spill; perf/NOTES.md v33).
    CUTLASS_DEVICE void signal_tile_stored(int* flow) {
      // The finish's programmatic launch may start (its blocks take SMs as the GEMM's CTAs exit and wait on these
      // counters); a CTA's later calls do nothing more.
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
      if (get<0>(residue) <= 0 || get<1>(residue) <= 0) return;  // a padded tile: nothing stored
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      asm volatile("fence.proxy.async.global;" ::: "memory");
      flow_add_release(TileFlow::tiles_done(flow) + n_tile, 1);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    // Coordinates of every value the thread visits, relative to the CTA tile.
    auto coords = fusion::sm90_partition_for_epilogue<ReferenceSrc>(args.cD, args.epi_tile, args.tiled_copy,
                                                                    args.thread_idx);

    // One register slot per column: partition a (CTA_M, CTA_N) layout that does not move along rows.
    auto column_layout = make_layout(take<0, 2>(CtaTileShapeMNK{}), Stride<_0, _1>{});
    auto column_view = make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)), column_layout);
    auto slots = fusion::sm90_partition_for_epilogue<ReferenceSrc>(column_view, args.epi_tile, args.tiled_copy,
                                                                   args.thread_idx)(_, _, _, 0, 0);
    using ColumnSlots = decltype(make_layout_like(slots.layout()));

    // Which lanes and warps hold the same columns: invert the copy's thread-value layout.
    auto tiler_mn = shape(typename decltype(args.tiled_copy)::Tiler_MN{});
    auto tile_to_tv = [&] {
      if constexpr (ReferenceSrc) return right_inverse(args.tiled_copy.get_layoutS_TV()).with_shape(tiler_mn);
      else return right_inverse(args.tiled_copy.get_layoutD_TV()).with_shape(tiler_mn);
    }();
    // tv index = thread + threads * value; the trailing size-1 mode absorbs the value part, so the
    // warp index wraps instead of growing with the value index.
    using Warps = Int<decltype(args.tiled_copy)::TiledNumThr::value / cutlass::NumThreadsPerWarp>;
    using Lanes = Int<cutlass::NumThreadsPerWarp>;
    auto tile_to_lane = composition(Layout<Shape<Lanes, Warps, _1>, Stride<_1, _0, _0>>{}, tile_to_tv);
    auto tile_to_warp = composition(Layout<Shape<Lanes, Warps, _1>, Stride<_0, _1, _0>>{}, tile_to_tv);
    auto lane_layout_mn = make_layout(filter(get<0>(tile_to_lane)), filter(get<1>(tile_to_lane)));
    auto warp_layout_mn = make_layout(filter(get<0>(tile_to_warp)), filter(get<1>(tile_to_warp)));
    // Linear index along M of this lane / warp (the M modes may be hierarchical, e.g. (4,2)).
    int lane_m = right_inverse(lane_layout_mn)(cutlass::canonical_lane_idx()) % size<0>(lane_layout_mn);
    int warp_m = right_inverse(warp_layout_mn)(args.thread_idx / cutlass::NumThreadsPerWarp) % size<0>(warp_layout_mn);

    constexpr int kEpiTileM = decltype(size<0>(args.epi_tile))::value;
    constexpr int kEpiTileN = decltype(size<1>(args.epi_tile))::value;
    constexpr int kEpiM = decltype(size<3>(coords))::value;  // subtiles along M per CTA tile
    constexpr int kEpiN = decltype(size<4>(coords))::value;  // and along N
    static_assert(kEpiM * kEpiTileM == decltype(size<0>(CtaTileShapeMNK{}))::value, "subtiles tile the CTA rows");
    auto [m_tile, n_tile, k_tile, l_tile] = args.tile_coord_mnkl;
    int n_total = static_cast<int>(get<1>(args.problem_shape_mnkl));
    using Callbacks = ConsumerStoreCallbacks<decltype(coords), decltype(args.residue_cD), ColumnSlots,
                                             decltype(lane_layout_mn), decltype(warp_layout_mn), kEpiTileM, kEpiTileN,
                                             kEpiM, kEpiN, decltype(args.tiled_copy)::TiledNumThr::value>;
    return Callbacks(params, tile_merge, coords, args.residue_cD, static_cast<int>(m_tile), static_cast<int>(n_tile),
                     n_total, lane_m, warp_m, args.thread_idx);
  }
};

}  // namespace gemmbn::epilogue
