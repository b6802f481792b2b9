// The fused GEMM: CUTLASS 3.x sm90a, TMA + wgmma, warp-specialized persistent kernel (cooperative or
// ping-pong, per configuration row).
// Included only by kernels/src/gemm_row.cuh, which instantiates one configuration row per translation unit.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "gemmbn/api.h"
#include "gemmbn/column_moments_node.hpp"
#include "gemmbn/configs.h"
#include "gemmbn/device_info.h"

namespace gemmbn::detail {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

template <class Element, TileConfig const* Table, int Index>
struct GemmScaleStatsKernel {
  static constexpr TileConfig kConfig = Table[Index];
  using TileShape = Shape<Int<kConfig.tile_m>, Int<kConfig.tile_n>, Int<kConfig.tile_k>>;
  using ClusterShape = Shape<Int<kConfig.cluster_m>, Int<kConfig.cluster_n>, _1>;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using KernelSchedule = cute::conditional_t<kConfig.pingpong != 0, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                             cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = cute::conditional_t<kConfig.pingpong != 0, cutlass::epilogue::TmaWarpSpecialized,
                                               cutlass::epilogue::TmaWarpSpecializedCooperative>;
  // The statistics node needs subtiles spanning the CTA tile's rows; a width of 0 leaves it to CUTLASS.
  using EpilogueTile = cute::conditional_t<kConfig.epilogue_n == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                           Shape<Int<kConfig.tile_m>, Int<cute::max(kConfig.epilogue_n, 1)>>>;

  // Epilogue visitor tree, leaves first:
  using Acc = fusion::Sm90AccFetch;                                      // acc = x @ W^T
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, Element, float>;  // b[n]
  using Scale = fusion::Sm90RowBroadcast<0, TileShape, Element, float>; // s[n]
  using Gain = fusion::Sm90RowBroadcast<0, TileShape, float, float>;    // gain[n] (eval: folded BN)
  using Shift = fusion::Sm90RowBroadcast<0, TileShape, float, float>;   // shift[n]
  using AddBias = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, float, float, kRound>,  // acc + b
                                  Acc, Bias>;
  using MulScale = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,  // (acc + b) s
                                   AddBias, Scale>;
  using Affine = fusion::Sm90EVT<  // y = (acc + b) s gain + shift, rounded to Element
      fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Element, float, kRound>, MulScale, Gain, Shift>;
  // Partial mean, M2 of y as stored (after rounding to Element), so the statistics describe exactly
  // the values finish_normalize normalizes, as PyTorch's BatchNorm sees its (rounded) input.
  using Output = fusion::Sm90EVT<epilogue::Sm90ColumnMoments<TileShape>, Affine>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile, float, float,
      void, cutlass::layout::RowMajor, kAlignment,     // no source C
      Element, cutlass::layout::RowMajor, kAlignment,  // D = y
      EpilogueSchedule, Output>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,     // x [M, K]
      Element, cutlass::layout::ColumnMajor, kAlignment,  // W [N, K] = K x N column-major
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static Status run(GemmScaleStatsArgs const& a, cudaStream_t stream) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    auto stride_a = cutlass::make_cute_packed_stride(StrideA{}, make_shape(a.M, a.K, 1));
    auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, make_shape(a.N, a.K, 1));
    auto stride_c = cutlass::make_cute_packed_stride(StrideC{}, make_shape(a.M, a.N, 1));
    auto stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(a.M, a.N, 1));

    typename Output::Arguments epilogue_tree{
        {                                                                   // Affine
            {                                                               // MulScale
                {{}, {static_cast<Element const*>(a.bias), Element(0.f), {}}, {}},  // AddBias(Acc, Bias)
                {static_cast<Element const*>(a.scale), Element(1.f), {}},          // Scale
                {}},
            {a.gain, 1.f, {}},   // Gain
            {a.shift, 0.f, {}},  // Shift
            {}},
        {a.partial_mean, a.partial_m2, a.batches_tracked}};  // Moments

    cutlass::KernelHardwareInfo hw_info;
    cudaError_t device_error = current_device_info(hw_info.device_id, hw_info.sm_count);
    if (device_error != cudaSuccess) return Status::from_cuda(device_error, "querying the current device");

    typename Gemm::Arguments arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {a.M, a.N, a.K, 1},
        {static_cast<Element const*>(a.x), stride_a, static_cast<Element const*>(a.weight), stride_b},
        {epilogue_tree, nullptr, stride_c, static_cast<Element*>(a.y), stride_d},
        hw_info};
    using RasterOrder = decltype(arguments.scheduler.raster_order);
    const int raster = a.raster >= 0 ? a.raster : kConfig.raster;
    arguments.scheduler.raster_order = raster == 1   ? RasterOrder::AlongM
                                       : raster == 2 ? RasterOrder::AlongN
                                                     : RasterOrder::Heuristic;
    arguments.scheduler.max_swizzle_size = a.swizzle > 0 ? a.swizzle : kConfig.swizzle;

    Gemm gemm;
    if (gemm.can_implement(arguments) != cutlass::Status::kSuccess) {
      return Status::invalid("CUTLASS cannot implement this GEMM (shape or alignment)");
    }
    if (Gemm::get_workspace_size(arguments) != 0) {
      return {Status::cutlass_error, cudaSuccess, "unexpected CUTLASS workspace request"};
    }
    if (gemm.initialize(arguments, nullptr, stream) != cutlass::Status::kSuccess) {
      return Status::from_cuda(cudaGetLastError(), "initializing the CUTLASS GEMM");
    }
    if (gemm.run(stream) != cutlass::Status::kSuccess) {
      cudaError_t e = cudaGetLastError();
      return e != cudaSuccess ? Status::from_cuda(e, "launching the CUTLASS GEMM")
                              : Status{Status::cutlass_error, cudaSuccess, "launching the CUTLASS GEMM"};
    }
    return Status::from_cuda(cudaGetLastError(), "launching the CUTLASS GEMM");
  }
};

}  // namespace gemmbn::detail
