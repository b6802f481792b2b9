// The fp32-faithful GEMM mainloop with x split before the GEMM, a collective for CUTLASS's cooperative
// warp-specialized sm90 kernel (its epilogue, tile scheduler and pipelines unchanged):
//
//   acc[m, n] 2^a[m] 2^b[n] = sum_g sum_{k in g} (xh wh + xl wh + xh wl)[m, n, k]
//
// the sum of split_f16x3_mainloop.hpp, but with x's row m already scaled by 2^a[m] and split into xh + xl by
// split_rows (the pass that makes x_scale), in split_weight's format (f16_split.cuh). Both operands reach the
// tensor cores from shared memory (SS wgmma), so the consumer warps only issue wgmmas and promote.
//
// NOTES:
// - Why: the register split of split_f16x3_mainloop.hpp keeps the consumers latency-bound (perf/NOTES.md v5);
//   here they do what a 16-bit GEMM's do, for the price of one write and one read
//   more of x's bytes (split_rows writes the pairs, 4 bytes per value, as x's fp32). perf/NOTES.md v38.
// - Each stage holds one 32-column k-tile of both operands as 64 split columns (32 hi, then 32 lo), so the
//   six wgmmas of a k-tile read k-blocks (hi s, hi s), (lo s, hi s), (hi s, lo s) of x and W. Both operands
//   order their columns alike (split::slice_column), so the products pair the same k.
// - Promotion as in split_f16x3_mainloop.hpp: PromoteTiles k-tiles on the tensor cores, then into fp32 after the
//   warpgroup's wgmmas drain. (Staggering the two warpgroups' drains, or promoting every 8 k-tiles, gained too
//   little; every 8 also doubled the error on hard inputs: perf/NOTES.md v39.)
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "gemmbn/f16_split.cuh"
#include "gemmbn/split_f16x3_producer.hpp"

namespace gemmbn::mainloop {

using namespace cute;

struct SplitF16x3PresplitArguments {
  cutlass::half_t const* x_split = nullptr;  // [M, split::split_columns(K)] from split_rows
  cutlass::half_t const* w_split = nullptr;  // [N, split::split_columns(K)] from split_weight
  float const* x_scale = nullptr;            // [ceil(M / 128) 128] from split_rows: 2^a[m]
};

// PromoteTiles: k-tiles per fp32 promotion.
template <int Stages, class ClusterShape_, int TileN, int PromoteTiles>
struct SplitF16x3PresplitMainloop {
  static constexpr int kTileM = split::kRowBlock;  // two consumer warpgroups of 64 rows
  static constexpr int kTileK = split::kTileK;
  static constexpr int kSplitK = 2 * kTileK;  // split columns per k-tile
  static constexpr int kThreads = 256;
  static constexpr int kPromoteTiles = PromoteTiles;
  static_assert(PromoteTiles >= 1, "k-tiles per promotion");

  // --- what CUTLASS's kernel and adapter read ---------------------------------------------------
  using TileShape = Shape<Int<kTileM>, Int<TileN>, Int<kTileK>>;
  using ClusterShape = ClusterShape_;
  using DispatchPolicy = cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<
      Stages, ClusterShape, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using ArchTag = cutlass::arch::Sm90;
  using ElementA = cutlass::half_t;
  using ElementB = cutlass::half_t;
  using StrideA = cute::Stride<int64_t, _1, int64_t>;  // row-major [M, split columns]
  using StrideB = cute::Stride<int64_t, _1, int64_t>;  // row-major [N, split columns]
  using ElementAccumulator = float;
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<cutlass::half_t, cutlass::half_t, float, Shape<_64, Int<TileN>, _16>>(),
      Layout<Shape<_2, _1, _1>>{}));
  using GmemTiledCopyA = SM90_TMA_LOAD;
  using GmemTiledCopyB = cute::conditional_t<size<0>(ClusterShape{}) == 1, SM90_TMA_LOAD, SM90_TMA_LOAD_MULTICAST>;
  using TransformA = cute::identity;
  using TransformB = cute::identity;
  using MainloopPipeline = cutlass::PipelineTmaAsync<Stages>;
  using PipelineState = cutlass::PipelineState<Stages>;
  using PipelineStorage = typename MainloopPipeline::SharedStorage;
  static constexpr int NumProducerThreadEvents = 1;
  static_assert(size<1>(ClusterShape{}) == 1, "the cluster shares W along M only");
  static_assert(size(TiledMma{}) == kThreads, "two consumer warpgroups");

  // --- shared memory ----------------------------------------------------------------------------
  using SmemLayoutX = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<cutlass::half_t>{},
                                             make_shape(Int<kTileM>{}, Int<kSplitK>{}, Int<Stages>{})));
  using SmemLayoutW = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<cutlass::half_t>{},
                                             make_shape(Int<TileN>{}, Int<kSplitK>{}, Int<Stages>{})));
  struct TensorStorage {
    // 1024-byte alignment: TMA's 128-byte swizzle is a function of the absolute address.
    alignas(1024) cute::array_aligned<cutlass::half_t, cosize_v<SmemLayoutX>, 1024> x;
    alignas(1024) cute::array_aligned<cutlass::half_t, cosize_v<SmemLayoutW>, 1024> w;
    alignas(128) cute::array_aligned<float, kTileM * Stages, 128> x_scale;  // (row, stage)
  };
  static constexpr uint32_t kScaleBytes = sizeof(float) * kTileM;
  static constexpr uint32_t TmaTransactionBytes =
      uint32_t(sizeof(cutlass::half_t) * (kTileM + TileN) * kSplitK) + kScaleBytes;
  static constexpr int kStageBytes = int(TmaTransactionBytes);

  // --- parameters -------------------------------------------------------------------------------
  using Arguments = SplitF16x3PresplitArguments;
  using TileSplit = Shape<Int<kTileM>, Int<TileN>, Int<kSplitK>>;  // one k-tile of both operands' split columns
  struct Params {
    using TMA_X = decltype(make_tma_copy_A_sm90(
        GmemTiledCopyA{},
        make_tensor(static_cast<cutlass::half_t const*>(nullptr), repeat_like(StrideA{}, int32_t(0)), StrideA{}),
        SmemLayoutX{}(_, _, 0), TileSplit{}, ClusterShape{}));
    using TMA_W = decltype(make_tma_copy_B_sm90(
        GmemTiledCopyB{},
        make_tensor(static_cast<cutlass::half_t const*>(nullptr), repeat_like(StrideB{}, int32_t(0)), StrideB{}),
        SmemLayoutW{}(_, _, 0), TileSplit{}, ClusterShape{}));
    TMA_X tma_x;
    TMA_W tma_w;
    float const* x_scale;
    uint32_t tma_transaction_bytes = TmaTransactionBytes;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    const int64_t split_k = split::split_columns(K);
    const auto batches = L;
    auto operand = [split_k, batches](cutlass::half_t const* p, auto rows) {
      return make_tensor(p, make_layout(make_shape(rows, int32_t(split_k), batches),
                                        make_stride(split_k, _1{}, int64_t(rows) * split_k)));
    };
    return {make_tma_copy_A_sm90(GmemTiledCopyA{}, operand(args.x_split, M), SmemLayoutX{}(_, _, 0), TileSplit{},
                                 ClusterShape{}),
            make_tma_copy_B_sm90(GmemTiledCopyB{}, operand(args.w_split, N), SmemLayoutW{}(_, _, 0), TileSplit{},
                                 ClusterShape{}),
            args.x_scale, TmaTransactionBytes};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    // TMA: both operands' rows are whole k-tiles of fp16 (128 bytes); 16-byte bases.
    return args.x_split != nullptr && args.w_split != nullptr && args.x_scale != nullptr &&
           reinterpret_cast<uintptr_t>(args.x_split) % 16 == 0 && reinterpret_cast<uintptr_t>(args.w_split) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(args.x_scale) % 16 == 0;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_x.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_w.get_tma_descriptor());
  }

  // Both operands by k-tiles of 64 split columns (the kernel counts k-tiles on x's: one per 32 columns of K).
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_MNKL, Params const& params) const {
    using X = Underscore;
    auto [M, N, K, L] = problem_shape_MNKL;
    const int k_tiles = (K + kTileK - 1) / kTileK;
    Tensor mX = params.tma_x.get_tma_tensor(make_shape(M, k_tiles * kSplitK, L));
    Tensor mW = params.tma_w.get_tma_tensor(make_shape(N, k_tiles * kSplitK, L));
    Tensor gX_mkl = local_tile(mX, TileSplit{}, make_coord(_, _, _), Step<_1, X, _1>{});  // (128,64,m,kt,l)
    Tensor gW_nkl = local_tile(mW, TileSplit{}, make_coord(_, _, _), Step<X, _1, _1>{});  // (N,64,n,kt,l)
    return cute::make_tuple(gX_mkl, gW_nkl);
  }

  // Producer (one elected thread): per stage, x's k-tile, then W's and the row scales (load_split_stages).
  template <class LoadInputs, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           LoadInputs const& load_inputs, BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                           int k_tile_count, int, uint32_t block_rank_in_cluster, TensorStorage& storage) {
    if (!cute::elect_one_sync()) return;
    Tensor sX = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(storage.x.data()), SmemLayoutX{}));
    Tensor sW = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(storage.w.data()), SmemLayoutW{}));
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor gX = get<0>(load_inputs)(_, _, m_coord, _, l_coord);  // (128, 64, kt)
    Tensor gW = get<1>(load_inputs)(_, _, n_coord, _, l_coord);  // (N, 64, kt)
    auto tma_x = params.tma_x.get_slice(0);
    Tensor tXgX = tma_x.partition_S(gX);
    Tensor tXsX = tma_x.partition_D(sX);
    load_split_stages<kTileM, ClusterShape>(
        params, pipeline, smem_pipe_write, gW, sW, block_rank_in_cluster, m_coord, storage.x_scale.data(),
        k_tile_iter, k_tile_count,
        [&](auto& barrier, int k_tile, int stage) {
          copy(params.tma_x.with(barrier), tXgX(_, _, _, k_tile), tXsX(_, _, _, stage));
        });
  }

  CUTLASS_DEVICE void load_tail(MainloopPipeline pipeline, PipelineState smem_pipe_write) {
    if (cute::elect_one_sync()) pipeline.producer_tail(smem_pipe_write);
  }

  // Consumer: y-tile accumulators in `accum` (fp32, the epilogue's), one k-tile at a time, one k-tile's
  // wgmmas in flight while the next are issued.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& storage, Params const&) {
    TiledMma tiled_mma;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto warp_group_mma = tiled_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
    Tensor sX = make_tensor(make_smem_ptr(storage.x.data()), SmemLayoutX{});
    Tensor sW = make_tensor(make_smem_ptr(storage.w.data()), SmemLayoutW{});
    Tensor tCrX = warp_group_mma.make_fragment_A(warp_group_mma.partition_A(sX));  // (MMA, 1, 4 k-blocks, PIPE)
    Tensor tCrW = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sW));  // (MMA, 1, 4 k-blocks, PIPE)
    Tensor acc_group = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));  // the tensor cores' group sum
    static_assert(decltype(size(acc_group))::value == decltype(size(accum))::value, "accumulator layouts");

    const int lane = thread_idx % cutlass::NumThreadsPerWarp;
    const int row = 16 * (thread_idx / cutlass::NumThreadsPerWarp) + lane / 4;  // row g of this lane in the tile

    // acc_group (+)= the stage's k-tile of xh wh + xl wh + xh wl (a fresh sum when `first`); k-blocks 0, 1 are the
    // hi parts of the two 16-column slices, 2, 3 their lo parts.
    auto issue_wgmmas = [&](int stage, bool first) {
      warpgroup_fence_operand(acc_group);
      warpgroup_arrive();
      tiled_mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < split::kSlices; ++s) {
        cute::gemm(tiled_mma, tCrX(_, _, s, stage), tCrW(_, _, s, stage), acc_group);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        cute::gemm(tiled_mma, tCrX(_, _, split::kSlices + s, stage), tCrW(_, _, s, stage), acc_group);
        cute::gemm(tiled_mma, tCrX(_, _, s, stage), tCrW(_, _, split::kSlices + s, stage), acc_group);
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(acc_group);
    };

    clear(accum);
    if (k_tile_count <= 0) return;
    float scale[2];  // 2^a of rows g, g + 8, read from the tile's first stage
    bool first_tile = true, holding = false;  // holding: a stage whose wgmmas may still run is not yet released
    PipelineState smem_pipe_release = smem_pipe_read;
    // One promotion group: up to kPromoteTiles k-tiles into acc_group, each k-tile's wgmmas in flight while the next
    // k-tile is waited for and issued.
    auto run_group = [&] {
      for (int t = 0; t < kPromoteTiles && k_tile_count > 0; ++t, --k_tile_count) {
        pipeline.consumer_wait(smem_pipe_read);
        if (first_tile) {
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < 2; ++r) scale[r] = storage.x_scale[smem_pipe_read.index() * kTileM + row + 8 * r];
          first_tile = false;
        }
        issue_wgmmas(smem_pipe_read.index(), t == 0);
        ++smem_pipe_read;
        warpgroup_wait<1>();  // all but this k-tile's wgmmas: the previous stage is free
        if (holding) {
          pipeline.consumer_release(smem_pipe_release);
          ++smem_pipe_release;
        }
        holding = true;
      }
    };
    // The warpgroup's wgmmas drain at each group's end: the promotion needs the group's last ones. (Two group
    // accumulators taking turns, the promotion of one beside the other's wgmmas, make ptxas serialize every wgmma:
    // C7514, an accumulator read while a wgmma is in flight; perf/NOTES.md v38.)
    while (k_tile_count > 0) {
      run_group();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_group);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += acc_group(i);
      warpgroup_fence_operand(accum);
    }
    warpgroup_wait<0>();  // (the last group drained already; said here so ptxas need not insert it)
    pipeline.consumer_release(smem_pipe_release);  // the last k-tile's stage
    // accum 2^-a[row]; value i of the 64xN C fragment sits on row g + 8 ((i / 2) % 2).
    const float unscale[2] = {split::inverse_pow2(scale[0]), split::inverse_pow2(scale[1])};
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); ++i) accum(i) *= unscale[(i >> 1) & 1];
  }

  // Every stage was released in mma().
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace gemmbn::mainloop
