// The fp32-faithful GEMM mainloop, a collective for CUTLASS's cooperative warp-specialized sm90 kernel
// (its epilogue, tile scheduler and pipelines unchanged):
//
//   acc[m, n] 2^a[m] 2^b[n] = sum_g sum_{k in g} (xh wh + xl wh + xh wl)[m, n, k]
//
// with x's row m scaled by 2^a[m] (row_scales, a pre-pass) and split into fp16 parts xh + xl in
// registers as it is consumed, and W's row n scaled by 2^b[n] and split into wh + wl once by
// split_weight (format in f16_split.cuh). The mainloop ends with acc 2^-a[m]; the epilogue multiplies
// by 2^-b[n] (weight_unscale).
//
// NOTES:
// - Each promotion group g (PromoteTiles k-tiles of 32 columns: 6 wgmmas a k-tile, 3 products x 2
//   k-slices) is summed on the tensor cores in its own accumulator, then added into the fp32
//   accumulator the epilogue reads. The tensor cores thus add at most 96 PromoteTiles terms before a
//   rounding to fp32, which keeps their accumulation (coarser than FFMA's) out of the error.
// - Scales per row, not per (row, k-tile): a k-tile scale would need a promotion (wgmma drain + an
//   FFMA per accumulator) every k-tile and a max over the row's quad (two shuffles) on the consumer's
//   critical path, where the consumer warps stalled with the tensor pipe half idle (perf/NOTES.md, v5).
// - x is loaded by TMA as two 128x16 fp32 halves per stage (64-byte rows, no swizzle): each thread reads
//   one 16-byte vector per row and slice, a quarter warp two consecutive rows, with no bank conflict.
//   split_weight orders W's columns within each 16-column slice to match (split::slice_column). Each
//   stage also brings the tile's 128 row scales (a 512-byte bulk copy): mma() sees no tile coordinate.
// - The consumer splits k-tile i+1 while k-tile i's wgmmas run (two register buffers); it waits only
//   for k-tile i-1's (wgmma.wait_group 1) before overwriting that buffer, and drains at the end of a
//   promotion group. x's shared-memory loads run a k-tile ahead of its split (k-tile i+2's are issued
//   once i+1 is split): the loads' latency had been the consumers' main stall (perf/NOTES.md, v5).
// - Accumulators: 64 (tensor-core group) + 64 (fp32) registers per thread for a 128x128 tile; a
//   128x256 tile would need 256 and does not fit.
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

struct SplitF16x3Arguments {
  float const* x = nullptr;                   // [M, K] row-major fp32
  cutlass::half_t const* w_split = nullptr;   // [N, split::split_columns(K)] from split_weight
  float const* x_scale = nullptr;             // [ceil(M / 128) 128] from row_scales: 2^a[m]
};

// PromoteTiles: k-tiles per fp32 promotion.
template <int Stages, class ClusterShape_, int TileN, int PromoteTiles>
struct SplitF16x3Mainloop {
  static constexpr int kTileM = split::kRowBlock;  // two consumer warpgroups of 64 rows
  static constexpr int kTileK = split::kTileK;
  static constexpr int kThreads = 256;
  static constexpr int kPromoteTiles = PromoteTiles;
  static_assert(PromoteTiles >= 1, "k-tiles per promotion");

  // --- what CUTLASS's kernel and adapter read ---------------------------------------------------
  using TileShape = Shape<Int<kTileM>, Int<TileN>, Int<kTileK>>;
  using ClusterShape = ClusterShape_;
  using DispatchPolicy = cutlass::gemm::MainloopSm90TmaGmmaRmemAWarpSpecialized<
      Stages, ClusterShape, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using ArchTag = cutlass::arch::Sm90;
  using ElementA = float;
  using ElementB = cutlass::half_t;
  using StrideA = cute::Stride<int64_t, _1, int64_t>;  // row-major [M, K]
  using StrideB = cute::Stride<int64_t, _1, int64_t>;  // row-major [N, split columns]
  using ElementAccumulator = float;
  using TiledMma = decltype(make_tiled_mma(
      GMMA::rs_op_selector<cutlass::half_t, cutlass::half_t, float, Shape<_64, Int<TileN>, _16>>(),
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

  // The A registers' layout this mainloop writes: lane (g = lane / 4, q = lane % 4) of warp w holds
  // rows 16 w + g (+8) and k-positions 2q (+1) (+8), in value order (k+1, row+8, k+8).
  static_assert(cute::is_same_v<typename TiledMma::Atom::Traits::ALayout, GMMA::ALayout_64x16>,
                "A fragment layout of the 64xNx16 RS wgmma");

  // --- shared memory ----------------------------------------------------------------------------
  using SmemLayoutX = Layout<Shape<Int<kTileM>, Int<split::kSliceK>, Int<split::kSlices * Stages>>,
                             Stride<Int<split::kSliceK>, _1, Int<kTileM * split::kSliceK>>>;  // (m, k, half)
  using SmemLayoutW = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<cutlass::half_t>{},
                                             make_shape(Int<TileN>{}, Int<2 * kTileK>{}, Int<Stages>{})));
  struct TensorStorage {
    // 1024-byte alignment: TMA's 128-byte swizzle is a function of the absolute address.
    alignas(1024) cute::array_aligned<float, cosize_v<SmemLayoutX>, 1024> x;
    alignas(1024) cute::array_aligned<cutlass::half_t, cosize_v<SmemLayoutW>, 1024> w;
    alignas(128) cute::array_aligned<float, kTileM * Stages, 128> x_scale;  // (row, stage)
  };
  static constexpr uint32_t kScaleBytes = sizeof(float) * kTileM;
  static constexpr uint32_t TmaTransactionBytes =
      uint32_t(sizeof(float) * kTileM * kTileK + sizeof(cutlass::half_t) * TileN * 2 * kTileK) + kScaleBytes;
  static constexpr int kStageBytes = int(TmaTransactionBytes);

  // --- parameters -------------------------------------------------------------------------------
  using Arguments = SplitF16x3Arguments;
  using TileX = Shape<Int<kTileM>, Int<TileN>, Int<split::kSliceK>>;  // one x half per TMA copy
  using TileW = Shape<Int<kTileM>, Int<TileN>, Int<2 * kTileK>>;
  struct Params {
    using TMA_X = decltype(make_tma_copy_A_sm90(
        GmemTiledCopyA{},
        make_tensor(static_cast<float const*>(nullptr), repeat_like(StrideA{}, int32_t(0)), StrideA{}),
        SmemLayoutX{}(_, _, 0), TileX{}, ClusterShape{}));
    using TMA_W = decltype(make_tma_copy_B_sm90(
        GmemTiledCopyB{},
        make_tensor(static_cast<cutlass::half_t const*>(nullptr), repeat_like(StrideB{}, int32_t(0)), StrideB{}),
        SmemLayoutW{}(_, _, 0), TileW{}, ClusterShape{}));
    TMA_X tma_x;
    TMA_W tma_w;
    float const* x_scale;
    uint32_t tma_transaction_bytes = TmaTransactionBytes;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    const int64_t split_k = split::split_columns(K);
    Tensor x = make_tensor(args.x, make_layout(make_shape(M, K, L), make_stride(int64_t(K), _1{}, int64_t(M) * K)));
    Tensor w = make_tensor(args.w_split, make_layout(make_shape(N, int32_t(split_k), L),
                                                     make_stride(split_k, _1{}, int64_t(N) * split_k)));
    return {make_tma_copy_A_sm90(GmemTiledCopyA{}, x, SmemLayoutX{}(_, _, 0), TileX{}, ClusterShape{}),
            make_tma_copy_B_sm90(GmemTiledCopyB{}, w, SmemLayoutW{}(_, _, 0), TileW{}, ClusterShape{}),
            args.x_scale, TmaTransactionBytes};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    // TMA: 16-byte rows (fp32 x: K % 4; the split weight's rows are whole k-tiles) and bases.
    return K % 4 == 0 && args.x != nullptr && args.w_split != nullptr && args.x_scale != nullptr &&
           reinterpret_cast<uintptr_t>(args.x) % 16 == 0 && reinterpret_cast<uintptr_t>(args.w_split) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(args.x_scale) % 16 == 0;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_x.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_w.get_tma_descriptor());
  }

  // (x by 32-column k-tiles: the kernel counts k-tiles on it, W's split k-tiles, x by 16-column halves)
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_MNKL, Params const& params) const {
    using X = Underscore;
    auto [M, N, K, L] = problem_shape_MNKL;
    const int k_tiles = (K + kTileK - 1) / kTileK;
    Tensor mX = params.tma_x.get_tma_tensor(make_shape(M, k_tiles * kTileK, L));  // padded K: TMA zero-fills
    Tensor mW = params.tma_w.get_tma_tensor(make_shape(N, k_tiles * 2 * kTileK, L));
    Tensor gX_mkl = local_tile(mX, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});       // (128,32,m,kt,l)
    Tensor gW_nkl = local_tile(mW, TileW{}, make_coord(_, _, _), Step<X, _1, _1>{});           // (N,64,n,kt,l)
    Tensor gXhalf_mkl = local_tile(mX, TileX{}, make_coord(_, _, _), Step<_1, X, _1>{});      // (128,16,m,2kt,l)
    return cute::make_tuple(gX_mkl, gW_nkl, gXhalf_mkl);
  }

  // Producer (one elected thread): per stage, x's two halves, then W's k-tile and the row scales
  // (load_split_stages).
  template <class LoadInputs, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           LoadInputs const& load_inputs, BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                           int k_tile_count, int, uint32_t block_rank_in_cluster, TensorStorage& storage) {
    if (!cute::elect_one_sync()) return;
    Tensor sX = make_tensor(make_smem_ptr(storage.x.data()), SmemLayoutX{});
    Tensor sW = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(storage.w.data()), SmemLayoutW{}));
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor gXhalf = get<2>(load_inputs)(_, _, m_coord, _, l_coord);  // (128, 16, 2 kt)
    Tensor gW = get<1>(load_inputs)(_, _, n_coord, _, l_coord);      // (N, 64, kt)
    auto tma_x = params.tma_x.get_slice(0);
    Tensor tXgX = tma_x.partition_S(gXhalf);
    Tensor tXsX = tma_x.partition_D(sX);
    load_split_stages<kTileM, ClusterShape>(
        params, pipeline, smem_pipe_write, gW, sW, block_rank_in_cluster, m_coord, storage.x_scale.data(),
        k_tile_iter, k_tile_count,
        [&](auto& barrier, int k_tile, int stage) {
          CUTLASS_PRAGMA_UNROLL
          for (int half = 0; half < split::kSlices; ++half) {
            copy(params.tma_x.with(barrier), tXgX(_, _, _, split::kSlices * k_tile + half),
                 tXsX(_, _, _, split::kSlices * stage + half));
          }
        });
  }

  CUTLASS_DEVICE void load_tail(MainloopPipeline pipeline, PipelineState smem_pipe_write) {
    if (cute::elect_one_sync()) pipeline.producer_tail(smem_pipe_write);
  }

  // A fragment (value, m, slice) stored as value + 8 slice, so two fp16 values share a 32-bit register.
  template <int Slices, class FragmentLayout>
  static constexpr bool slices_follow_values(FragmentLayout layout) {
    if (size<0>(layout) != 8 || size<1>(layout) != 1 || size<2>(layout) != Slices) return false;
    for (int s = 0; s < Slices; ++s) {
      for (int v = 0; v < 8; ++v) {
        if (layout(v, 0, s) != v + 8 * s) return false;
      }
    }
    return true;
  }

  CUTLASS_DEVICE static float4 load_shared_float4(float const* p) {
    float4 v;
    const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(address));
    return v;
  }

  // One k-tile of x in registers: fp16 hi and lo A fragments of its two slices.
  template <class Fragment>
  struct SplitTile {
    Fragment hi, lo;
  };

  // Consumer: y-tile accumulators in `accum` (fp32, the epilogue's), one k-tile at a time.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& storage, Params const&) {
    TiledMma tiled_mma;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto warp_group_mma = tiled_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
    Tensor sW = make_tensor(make_smem_ptr(storage.w.data()), SmemLayoutW{});
    Tensor tCrW = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sW));  // (MMA, N, 4 slices, PIPE)
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);
    auto a_shape = make_tensor(make_smem_ptr(static_cast<cutlass::half_t const*>(nullptr)),
                               Layout<Shape<Int<kTileM>, Int<kTileK>>>{});
    using Fragment = decltype(thread_mma.partition_fragment_A(a_shape));  // (MMA, 1, 2 slices)
    static_assert(slices_follow_values<split::kSlices>(typename Fragment::layout_type{}), "A fragment layout");
    SplitTile<Fragment> tile_a{thread_mma.partition_fragment_A(a_shape), thread_mma.partition_fragment_A(a_shape)};
    SplitTile<Fragment> tile_b{thread_mma.partition_fragment_A(a_shape), thread_mma.partition_fragment_A(a_shape)};
    Tensor acc_group = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
    static_assert(decltype(size(acc_group))::value == decltype(size(accum))::value, "accumulator layouts");

    const int lane = thread_idx % cutlass::NumThreadsPerWarp;
    const int row = 16 * (thread_idx / cutlass::NumThreadsPerWarp) + lane / 4;  // row g of this lane in the tile
    const int quad = lane % 4;
    float const* smem_x = storage.x.data();
    float scale[2];  // 2^a of rows g, g + 8, read from the tile's first stage

    // x's k-tile in `stage` -> registers (the loads), then scaled and split into the A registers.
    struct XTile {
      float4 v[split::kSlices][2];  // (slice, row g / g + 8): columns 4q..4q+3
    };
    auto load_stage = [&](int stage, XTile& x) {
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < split::kSlices; ++s) {
        float const* half = smem_x + (split::kSlices * stage + s) * kTileM * split::kSliceK;
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) x.v[s][r] = load_shared_float4(half + (row + 8 * r) * split::kSliceK + 4 * quad);
      }
    };
    auto convert = [&](XTile const& x, auto& out) {
      // Register 4 slice + j holds values 2j, 2j + 1 of the slice (slices_follow_values).
      uint32_t* hi = reinterpret_cast<uint32_t*>(raw_pointer_cast(out.hi.data()));
      uint32_t* lo = reinterpret_cast<uint32_t*>(raw_pointer_cast(out.lo.data()));
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < split::kSlices; ++s) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) {
          const float4 q = x.v[s][r];
          // Registers: 0 (row g, positions 2q, 2q+1), 1 (row g+8, same), 2 (row g, 2q+8, 2q+9), 3 (row g+8).
          split::split_pair(q.x * scale[r], q.y * scale[r], hi[4 * s + r], lo[4 * s + r]);
          split::split_pair(q.z * scale[r], q.w * scale[r], hi[4 * s + 2 + r], lo[4 * s + 2 + r]);
        }
      }
    };
    // k-tile i+2's loads are issued right after k-tile i+1 is split, so no split waits on them (faster than
    // loading each k-tile where it is split: perf/NOTES.md v5).
    XTile ahead;
    PipelineState smem_pipe_ahead = smem_pipe_read;  // the k-tile `ahead` comes from next

    // acc_group (+)= the stage's k-tile of xh wh + xl wh + xh wl (a fresh sum when `first`).
    auto issue_wgmmas = [&](int stage, auto const& in, bool first) {
      warpgroup_fence_operand(acc_group);
      warpgroup_arrive();
      tiled_mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < split::kSlices; ++s) {
        cute::gemm(tiled_mma, in.hi(_, _, s), tCrW(_, _, s, stage), acc_group);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        cute::gemm(tiled_mma, in.lo(_, _, s), tCrW(_, _, s, stage), acc_group);
        cute::gemm(tiled_mma, in.hi(_, _, s), tCrW(_, _, split::kSlices + s, stage), acc_group);
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(acc_group);
    };

    // Stages [released, released + count) are free once their wgmmas are complete.
    PipelineState smem_pipe_release = smem_pipe_read;
    auto release = [&](int count) {
      for (; count > 0; --count) {
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
    };

    // One k-tile: its wgmmas; the next tile's split once the previous tile's wgmmas are done; at a
    // promotion group's end, the drain and accum += acc_group.
    int tile_in_group = 0, unreleased = 0;
    auto step = [&](auto const& current, auto& next) {
      issue_wgmmas(smem_pipe_read.index(), current, tile_in_group == 0);
      ++smem_pipe_read;
      ++unreleased;
      const bool group_ends = ++tile_in_group == kPromoteTiles || k_tile_count == 1;
      if (k_tile_count > 1) {
        warpgroup_wait<1>();  // the previous k-tile's wgmmas: its stage and `next`'s registers are free
        release(unreleased - 1);
        unreleased = 1;
        convert(ahead, next);
        if (k_tile_count > 2) {
          pipeline.consumer_wait(smem_pipe_ahead);
          load_stage(smem_pipe_ahead.index(), ahead);
          ++smem_pipe_ahead;
        }
      }
      if (group_ends) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_group);
        release(unreleased);
        unreleased = 0;
        warpgroup_fence_operand(accum);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += acc_group(i);
        warpgroup_fence_operand(accum);
        tile_in_group = 0;
      }
      --k_tile_count;
    };

    clear(accum);
    if (k_tile_count <= 0) return;
    pipeline.consumer_wait(smem_pipe_read);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < 2; ++r) scale[r] = storage.x_scale[smem_pipe_read.index() * kTileM + row + 8 * r];
    {
      XTile x;
      load_stage(smem_pipe_read.index(), x);
      convert(x, tile_a);
    }
    ++smem_pipe_ahead;
    if (k_tile_count > 1) {
      pipeline.consumer_wait(smem_pipe_ahead);
      load_stage(smem_pipe_ahead.index(), ahead);
      ++smem_pipe_ahead;
    }
    CUTLASS_PRAGMA_NO_UNROLL
    while (k_tile_count > 0) {  // two k-tiles per trip, so the register buffers have fixed names
      step(tile_a, tile_b);
      if (k_tile_count == 0) break;
      step(tile_b, tile_a);
    }
    warpgroup_wait<0>();  // (the last group drained already; said here so ptxas need not insert it)
    // accum 2^-a[row]; value i of the 64xN C fragment sits on row g + 8 ((i / 2) % 2).
    const float unscale[2] = {split::inverse_pow2(scale[0]), split::inverse_pow2(scale[1])};
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); ++i) accum(i) *= unscale[(i >> 1) & 1];
  }

  // Every stage was released in mma().
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace gemmbn::mainloop
