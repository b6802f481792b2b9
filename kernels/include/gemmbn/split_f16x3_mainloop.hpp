// The fp32-faithful GEMM mainloop, a collective for CUTLASS's cooperative warp-specialized sm90 kernel
// (its epilogue, tile scheduler and pipelines unchanged):
//
//   acc[m, n] 2^b[n] = sum_kt 2^-a[m, kt] sum_{k in kt} (xh wh + xl wh + xh wl)[m, n, k]
//
// with x's k-tile kt of row m scaled by 2^a[m, kt] and split into fp16 parts xh + xl in registers as
// it is consumed, and W's row n scaled by 2^b[n] and split into wh + wl once by split_weight (format in
// f16_split.cuh). The epilogue multiplies by 2^-b[n] (weight_unscale).
//
// NOTES:
// - Each k-tile (32 columns) is summed on the tensor cores in its own accumulator (6 wgmmas: 3 products
//   x 2 k-slices), then promoted into the fp32 accumulator the epilogue reads: acc += acc_tile 2^-a.
//   So the tensor cores never add more than 96 terms, which keeps their accumulation (coarser than
//   FFMA's) out of the error, and the per-(row, k-tile) scale lets x take any fp32 range.
// - x is loaded by TMA as two 128x16 fp32 halves per stage (64-byte rows, no swizzle): each thread reads
//   one 16-byte vector per row and slice, a quarter warp two consecutive rows, with no bank conflict.
//   split_weight orders W's columns within each 16-column slice to match (split::slice_column).
// - The consumer splits the next k-tile while the current one's wgmmas run (two register buffers),
//   then waits for them, releases the stage and promotes. Its two warpgroups keep each other's gaps
//   (wait + promotion) filled on the tensor cores.
// - Accumulators: 64 (tensor-core k-tile) + 64 (fp32) registers per thread for a 128x128 tile; a
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

namespace gemmbn::mainloop {

using namespace cute;

struct SplitF16x3Arguments {
  float const* x = nullptr;                   // [M, K] row-major fp32
  cutlass::half_t const* w_split = nullptr;   // [N, split::split_columns(K)] from split_weight
};

// ScaleTiles: k-tiles per x scale and fp32 promotion (1 or 2); Turns: the consumer warpgroups take
// turns issuing their wgmmas (named barriers kTurnBarrier0/1).
template <int Stages, class ClusterShape_, int TileN, int ScaleTiles = 1, bool Turns = false>
struct SplitF16x3Mainloop {
  static constexpr int kTileM = 128;  // two consumer warpgroups of 64 rows
  static constexpr int kTileK = split::kTileK;
  static constexpr int kThreads = 256;
  static constexpr int kScaleTiles = ScaleTiles;
  static constexpr bool kTurns = Turns;
  static constexpr uint32_t kTurnBarrier0 = 0, kTurnBarrier1 = 1;  // user ids (after CUTLASS's reserved ones)
  static_assert(ScaleTiles == 1 || ScaleTiles == 2, "one or two k-tiles per scale group");

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
  };
  static constexpr uint32_t TmaTransactionBytes =
      uint32_t(sizeof(float) * kTileM * kTileK + sizeof(cutlass::half_t) * TileN * 2 * kTileK);
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
            TmaTransactionBytes};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    // TMA: 16-byte rows (fp32 x: K % 4; the split weight's rows are whole k-tiles) and bases.
    return K % 4 == 0 && args.x != nullptr && args.w_split != nullptr &&
           reinterpret_cast<uintptr_t>(args.x) % 16 == 0 && reinterpret_cast<uintptr_t>(args.w_split) % 16 == 0;
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

  // Producer (one elected thread): per stage, x's two halves and W's k-tile (multicast along the cluster).
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

    constexpr uint32_t cluster_m = size<0>(ClusterShape{});
    const uint32_t rank_m = block_rank_in_cluster % cluster_m;
    auto tma_x = params.tma_x.get_slice(0);
    auto tma_w = params.tma_w.get_slice(rank_m);
    Tensor tXgX = tma_x.partition_S(gXhalf);
    Tensor tXsX = tma_x.partition_D(sX);
    Tensor tWgW = tma_w.partition_S(gW);
    Tensor tWsW = tma_w.partition_D(sW);
    uint16_t mcast_mask_w = 0;
    if constexpr (cluster_m > 1) {
      for (uint32_t m = 0; m < cluster_m; ++m) mcast_mask_w |= uint16_t(1) << m;  // cluster (M, 1): ranks 0..M-1
    }

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      const int k_tile = *k_tile_iter;
      CUTLASS_PRAGMA_UNROLL
      for (int half = 0; half < split::kSlices; ++half) {
        copy(params.tma_x.with(*barrier), tXgX(_, _, _, split::kSlices * k_tile + half),
             tXsX(_, _, _, split::kSlices * stage + half));
      }
      copy(params.tma_w.with(*barrier, mcast_mask_w), tWgW(_, _, _, k_tile), tWsW(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
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

  // One scale group of x (kScaleTiles k-tiles) in registers: fp16 hi and lo A fragments of its slices,
  // and each row's unscale.
  template <class Fragment>
  struct SplitGroup {
    Fragment hi, lo;
    float unscale[2];  // rows g, g + 8
  };

  // Consumer: y-tile accumulators in `accum` (fp32, the epilogue's), one scale group at a time.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& storage, Params const&) {
    constexpr int kGroupSlices = kScaleTiles * split::kSlices;
    TiledMma tiled_mma;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto warp_group_mma = tiled_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
    Tensor sW = make_tensor(make_smem_ptr(storage.w.data()), SmemLayoutW{});
    Tensor tCrW = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sW));  // (MMA, N, 4 slices, PIPE)
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);
    auto a_shape = make_tensor(make_smem_ptr(static_cast<cutlass::half_t const*>(nullptr)),
                               Layout<Shape<Int<kTileM>, Int<kScaleTiles * kTileK>>>{});
    using Fragment = decltype(thread_mma.partition_fragment_A(a_shape));  // (MMA, 1, group slices)
    static_assert(slices_follow_values<kGroupSlices>(typename Fragment::layout_type{}), "A fragment layout");
    SplitGroup<Fragment> group_a{thread_mma.partition_fragment_A(a_shape), thread_mma.partition_fragment_A(a_shape)};
    SplitGroup<Fragment> group_b{thread_mma.partition_fragment_A(a_shape), thread_mma.partition_fragment_A(a_shape)};
    Tensor acc_group = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
    static_assert(decltype(size(acc_group))::value == decltype(size(accum))::value, "accumulator layouts");

    const int lane = thread_idx % cutlass::NumThreadsPerWarp;
    const int row = 16 * (thread_idx / cutlass::NumThreadsPerWarp) + lane / 4;  // row g of this lane in the tile
    const int quad = lane % 4;
    float const* smem_x = storage.x.data();

    // The group's `tiles` k-tiles from stage `first` on (waited for here) -> per row: max |x| over the
    // quad (the row's columns of the group), scale, split. Slices of absent tiles are left alone.
    auto split_group = [&](PipelineState first, int tiles, auto& out) {
      float4 v[kScaleTiles][split::kSlices][2];
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kScaleTiles; ++t) {
        if (t < tiles) pipeline.consumer_wait(first);
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < split::kSlices; ++s) {
          float const* half = smem_x + (split::kSlices * first.index() + s) * kTileM * split::kSliceK;
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < 2; ++r) {
            v[t][s][r] = t < tiles ? load_shared_float4(half + (row + 8 * r) * split::kSliceK + 4 * quad)
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
        ++first;
      }
      float scale[2];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        float m = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int t = 0; t < kScaleTiles; ++t) {
          CUTLASS_PRAGMA_UNROLL
          for (int s = 0; s < split::kSlices; ++s) {
            const float4 q = v[t][s][r];
            m = fmaxf(m, fmaxf(fmaxf(fabsf(q.x), fabsf(q.y)), fmaxf(fabsf(q.z), fabsf(q.w))));
          }
        }
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
        split::pow2_scale(m, scale[r], out.unscale[r]);
      }
      // Register 4 slice + j holds values 2j, 2j + 1 of the slice (slices_follow_values).
      uint32_t* hi = reinterpret_cast<uint32_t*>(raw_pointer_cast(out.hi.data()));
      uint32_t* lo = reinterpret_cast<uint32_t*>(raw_pointer_cast(out.lo.data()));
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kScaleTiles; ++t) {
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < split::kSlices; ++s) {
          const int slice = split::kSlices * t + s;
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < 2; ++r) {
            const float4 q = v[t][s][r];
            const float4 xs = make_float4(q.x * scale[r], q.y * scale[r], q.z * scale[r], q.w * scale[r]);
            // Registers: 0 (row g, positions 2q, 2q+1), 1 (row g+8, same), 2 (row g, 2q+8, 2q+9), 3 (row g+8).
            split::split_pair(xs.x, xs.y, hi[4 * slice + r], lo[4 * slice + r]);
            split::split_pair(xs.z, xs.w, hi[4 * slice + 2 + r], lo[4 * slice + 2 + r]);
          }
        }
      }
    };

    // acc_group = sum over the group's Tiles k-tiles (from stage `first`) of xh wh + xl wh + xh wl.
    auto issue_wgmmas = [&](PipelineState first, auto tiles, auto const& in) {
      warpgroup_fence_operand(acc_group);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < decltype(tiles)::value; ++t) {
        const int stage = first.index();
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < split::kSlices; ++s) {
          const int slice = split::kSlices * t + s;
          cute::gemm(tiled_mma, in.hi(_, _, slice), tCrW(_, _, s, stage), acc_group);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
          cute::gemm(tiled_mma, in.lo(_, _, slice), tCrW(_, _, s, stage), acc_group);
          cute::gemm(tiled_mma, in.hi(_, _, slice), tCrW(_, _, split::kSlices + s, stage), acc_group);
        }
        ++first;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(acc_group);
    };

    // accum += acc_group 2^-a[row]; value i of the 64xN C fragment sits on row g + 8 ((i / 2) % 2).
    auto promote = [&](auto const& in) {
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) = fmaf(acc_group(i), in.unscale[(i >> 1) & 1], accum(i));
      warpgroup_fence_operand(accum);
    };

    // Turns (kTurns): the warpgroups issue their groups' wgmmas alternately, warpgroup 0 first, so the
    // tensor cores finish one warpgroup's group while the other's waits, and each warpgroup's wait and
    // promotion fall behind the other's wgmmas instead of both at once.
    bool first_group = true;
    auto take_turn = [&] {
      if constexpr (kTurns) {
        if (warp_group == 1) cutlass::arch::NamedBarrier::sync(kThreads, kTurnBarrier0);
        else if (!first_group) cutlass::arch::NamedBarrier::sync(kThreads, kTurnBarrier1);
      }
    };
    auto pass_turn = [&](bool last_group) {
      if constexpr (kTurns) {
        if (warp_group == 0) cutlass::arch::NamedBarrier::arrive(kThreads, kTurnBarrier0);
        else if (!last_group) cutlass::arch::NamedBarrier::arrive(kThreads, kTurnBarrier1);
      }
    };

    // One group: its wgmmas, the next group's split behind them, then wait, release, promote.
    auto step = [&](auto const& current, auto& next) {
      const int tiles = k_tile_count < kScaleTiles ? k_tile_count : kScaleTiles;
      take_turn();
      if (tiles == kScaleTiles) issue_wgmmas(smem_pipe_read, Int<kScaleTiles>{}, current);
      else issue_wgmmas(smem_pipe_read, Int<1>{}, current);  // kScaleTiles <= 2: a short last group has one
      pass_turn(k_tile_count == tiles);
      first_group = false;
      PipelineState next_read = smem_pipe_read;
      next_read.advance(tiles);
      const int remaining = k_tile_count - tiles;
      if (remaining > 0) split_group(next_read, remaining < kScaleTiles ? remaining : kScaleTiles, next);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_group);
      for (int t = 0; t < tiles; ++t) {
        pipeline.consumer_release(smem_pipe_read);
        ++smem_pipe_read;
      }
      promote(current);
      k_tile_count = remaining;
    };

    clear(accum);
    if (k_tile_count <= 0) return;
    split_group(smem_pipe_read, k_tile_count < kScaleTiles ? k_tile_count : kScaleTiles, group_a);
    CUTLASS_PRAGMA_NO_UNROLL
    while (k_tile_count > 0) {  // two groups per trip, so the register buffers have fixed names
      step(group_a, group_b);
      if (k_tile_count == 0) break;
      step(group_b, group_a);
    }
  }

  // Every stage was released in mma().
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace gemmbn::mainloop
