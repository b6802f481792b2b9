// The fused GEMM: CUTLASS 3.x sm90a, TMA + wgmma, warp-specialized persistent kernel (cooperative or
// ping-pong, per configuration row); the fp32-faithful split GEMM swaps in its own mainloop under the same
// epilogue (split_f16x3_mainloop.hpp, or split_f16x3_presplit_mainloop.hpp on rows whose x split_rows splits first).
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
#include "gemmbn/row_affine_node.hpp"
#include "gemmbn/split_f16x3_mainloop.hpp"
#include "gemmbn/split_f16x3_presplit_mainloop.hpp"

namespace gemmbn::detail {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// Element of x, W (unless split), y, bias and scale per operand type.
template <GemmOperands Operands>
using OperandElement = cute::conditional_t<Operands == GemmOperands::bf16, cutlass::bfloat16_t,
                                           cute::conditional_t<Operands == GemmOperands::f16, cutlass::half_t, float>>;

// CUTLASS's own mainloop for native operands, sized to the shared memory the epilogue leaves.
template <class Element, class TileShape, class ClusterShape, class KernelSchedule, int EpilogueBytes>
struct MainloopFor {
  static constexpr int kAlignment = 16 / sizeof(Element);
  using type = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,     // x [M, K]
      Element, cutlass::layout::ColumnMajor, kAlignment,  // W [N, K] = K x N column-major
      float, TileShape, ClusterShape, cutlass::gemm::collective::StageCountAutoCarveout<EpilogueBytes>,
      KernelSchedule>::CollectiveOp;
};
// The split mainloops (x split in registers, or before the GEMM by split_rows): as many stages as fit beside the
// epilogue (less 2 KB for the kernel's barriers, scheduler storage and the 1024-byte alignment of the stages).
// Presplit: configs.h's field (0: x split in registers; 1: x split before).
template <int Presplit, int Stages, class Cluster, int TileN, int PromoteTiles>
using SplitMainloop = cute::conditional_t<
    Presplit != 0, mainloop::SplitF16x3PresplitMainloop<Stages, Cluster, TileN, PromoteTiles>,
    mainloop::SplitF16x3Mainloop<Stages, Cluster, TileN, PromoteTiles>>;
template <class TileShape, class ClusterShape, int EpilogueBytes, int PromoteTiles, int Presplit>
struct SplitMainloopFor {
  static constexpr int kTileN = cute::size<1>(TileShape{});
  using Probe = SplitMainloop<Presplit, 2, ClusterShape, kTileN, PromoteTiles>;
  static constexpr int kStages =
      (cutlass::gemm::collective::detail::sm90_smem_capacity_bytes - EpilogueBytes - 2048) /
      (Probe::kStageBytes + int(sizeof(typename Probe::PipelineStorage)) / 2);
  static_assert(cute::is_same_v<TileShape, typename Probe::TileShape>, "split rows: 128 x N x split::kTileK tiles");
  static_assert(kStages >= 4, "the register split's consumer holds up to four stages (wgmmas i - 1 and i, split of "
                "i + 1, loads of i + 2)");
  using type = SplitMainloop<Presplit, kStages, ClusterShape, kTileN, PromoteTiles>;
};

template <GemmOperands Operands, int Index>
struct GemmScaleStatsKernel {
  using Element = OperandElement<Operands>;
  static constexpr bool kSplit = Operands == GemmOperands::f32_split;
  static constexpr TileConfig kConfig = config_at(Operands, Index);
  using TileShape = Shape<Int<kConfig.tile_m>, Int<kConfig.tile_n>, Int<kConfig.tile_k>>;
  using ClusterShape = Shape<Int<kConfig.cluster_m>, Int<kConfig.cluster_n>, _1>;
  static constexpr int kClusterSize = kConfig.cluster_m * kConfig.cluster_n;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows
  using KernelSchedule = cute::conditional_t<kConfig.pingpong != 0, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                             cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = cute::conditional_t<kConfig.pingpong != 0, cutlass::epilogue::TmaWarpSpecialized,
                                               cutlass::epilogue::TmaWarpSpecializedCooperative>;
  // Subtiles of epilogue_rows x epilogue_n (a width of 0 leaves the subtile to CUTLASS).
  using EpilogueTile = cute::conditional_t<kConfig.epilogue_n == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                           Shape<Int<epilogue_rows(kConfig)>, Int<cute::max(kConfig.epilogue_n, 1)>>>;

  // Epilogue visitor tree: y = ((acc u + b) s) g + h in one node (row_affine_node.hpp; u: the split GEMM's 2^-b[n]),
  // rounded to Element, then the statistics node where the row has one.
  using Affine = epilogue::Sm90RowAffine<TileShape, Element, kSplit>;
  // Partial mean, M2 of y as stored (after rounding to Element), so the statistics describe exactly
  // the values finish_normalize normalizes, as PyTorch's BatchNorm sees its (rounded) input. Rows without the
  // statistics node store the affine's result alone.
  static_assert(kConfig.merge_per_tile == 0 || (kConfig.statistics != 0 && kConfig.pingpong == 0),
                "merge_per_tile: cooperative rows with the statistics node");
  using Moments = epilogue::Sm90ColumnMoments<TileShape, kConfig.merge_per_tile != 0>;
  using Output = cute::conditional_t<kConfig.statistics != 0, fusion::Sm90EVT<Moments, Affine>, Affine>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile, float, float,
      void, cutlass::layout::RowMajor, kAlignment,     // no source C
      Element, cutlass::layout::RowMajor, kAlignment,  // D = y
      EpilogueSchedule, Output>::CollectiveOp;

  static_assert(!kSplit || kConfig.pingpong == 0, "the split mainloop is written for the cooperative kernel");
  static constexpr int kEpilogueBytes = static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage));
  using CollectiveMainloop = typename cute::conditional_t<
      kSplit, SplitMainloopFor<TileShape, ClusterShape, kEpilogueBytes, kConfig.promote_tiles, kConfig.presplit>,
      MainloopFor<Element, TileShape, ClusterShape, KernelSchedule, kEpilogueBytes>>::type;

  static_assert(kConfig.stream_k == 0 || kConfig.pingpong == 0, "CUTLASS's stream-K takes cooperative kernels only");
  static_assert(kConfig.presplit == 0 || (kSplit && kConfig.stream_k == 0),
                "presplit rows: split GEMM only, x's pairs in the workspace (no stream-K one beside them)");
  using TileScheduler = cute::conditional_t<kConfig.stream_k != 0, cutlass::gemm::StreamKScheduler,
                                            cutlass::gemm::PersistentScheduler>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // Bytes of workspace the launch needs (stream-K rows: partial accumulators and their flags; else 0).
  static Status workspace_bytes(GemmScaleStatsArgs const& a, size_t& bytes) {
    typename Gemm::Arguments arguments;
    if (Status s = make_arguments(a, arguments); !s) return s;
    bytes = Gemm::get_workspace_size(arguments);
    return Status::success();
  }

  static Status run(GemmScaleStatsArgs const& a, cudaStream_t stream) {
    typename Gemm::Arguments arguments;
    if (Status s = make_arguments(a, arguments); !s) return s;
    if (Gemm::can_implement(arguments) != cutlass::Status::kSuccess) {
      return Status::invalid("CUTLASS cannot implement this GEMM (shape or alignment)");
    }
    const size_t workspace_needed = Gemm::get_workspace_size(arguments);
    if (workspace_needed > 0 && (a.workspace == nullptr || a.workspace_bytes < workspace_needed)) {
      return Status::invalid("this configuration row needs a workspace of gemm_workspace_bytes bytes");
    }
    // Every check that can fail comes before the first work on the stream (the workspace memset).
    if (cudaError_t e = allow_shared_storage(arguments.hw_info.device_id); e != cudaSuccess) {
      return Status::from_cuda(e, "raising the GEMM's shared memory limit");
    }
    if (workspace_needed > 0) {
      // Zeroes the stream-K flags on the stream (a memset node under graph capture); no host sync.
      if (Kernel::initialize_workspace(arguments, a.workspace, stream) != cutlass::Status::kSuccess) {
        return {Status::cutlass_error, cudaSuccess, "initializing the stream-K workspace"};
      }
    }
    // The kernel's parameters (TMA descriptors, scheduler) built directly and launched below instead of
    // through GemmUniversalAdapter::initialize/run, which set two function attributes on every call;
    // here the shared-memory limit is set once per device and the cluster (at most 8 CTAs) is portable.
    typename Kernel::Params params = Kernel::to_underlying_arguments(arguments, a.workspace);
    return launch(params, stream);
  }

  // CUTLASS's arguments for the call: operands, epilogue tree, device and the tile order.
  static Status make_arguments(GemmScaleStatsArgs const& a, typename Gemm::Arguments& arguments) {
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(a.M, a.K, 1));
    auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(a.N, a.K, 1));
    auto stride_c = cutlass::make_cute_packed_stride(StrideC{}, make_shape(a.M, a.N, 1));
    auto stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(a.M, a.N, 1));

    typename Affine::Arguments affine{static_cast<Element const*>(a.bias), static_cast<Element const*>(a.scale),
                                      a.gain, a.shift, a.weight_unscale};
    typename Output::Arguments epilogue_tree = [&] {
      if constexpr (kConfig.statistics != 0) {
        return typename Output::Arguments{affine, {a.partial_mean, a.partial_m2, a.batches_tracked, a.tile_flow}};  // Moments
      } else {
        return affine;
      }
    }();

    typename CollectiveMainloop::Arguments mainloop_arguments = [&] {
      if constexpr (kSplit && kConfig.presplit != 0) {  // x's pairs in the workspace (split_rows wrote them)
        return typename CollectiveMainloop::Arguments{static_cast<cutlass::half_t const*>(a.workspace),
                                                      static_cast<cutlass::half_t const*>(a.weight_split), a.x_scale};
      } else if constexpr (kSplit) {
        return typename CollectiveMainloop::Arguments{static_cast<float const*>(a.x),
                                                      static_cast<cutlass::half_t const*>(a.weight_split), a.x_scale};
      } else {
        return typename CollectiveMainloop::Arguments{static_cast<Element const*>(a.x), stride_a,
                                                      static_cast<Element const*>(a.weight), stride_b};
      }
    }();

    cutlass::KernelHardwareInfo hw_info;
    cudaError_t device_error = current_device_info(hw_info.device_id, hw_info.sm_count);
    if (device_error != cudaSuccess) return Status::from_cuda(device_error, "querying the current device");
    if constexpr (kClusterSize > 1) {
      device_error = max_active_clusters(hw_info.device_id, hw_info.max_active_clusters);
      if (device_error != cudaSuccess) return Status::from_cuda(device_error, "querying the GEMM's cluster occupancy");
    }

    arguments = typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {a.M, a.N, a.K, 1},
        mainloop_arguments,
        {epilogue_tree, nullptr, stride_c, static_cast<Element*>(a.y), stride_d},
        hw_info};
    using RasterOrder = decltype(arguments.scheduler.raster_order);
    const int raster = a.raster >= 0 ? a.raster : kConfig.raster;
    arguments.scheduler.raster_order = raster == 1   ? RasterOrder::AlongM
                                       : raster == 2 ? RasterOrder::AlongN
                                                     : RasterOrder::Heuristic;
    arguments.scheduler.max_swizzle_size = a.swizzle > 0 ? a.swizzle : unpadded_swizzle(kConfig, a.M, a.N);
    if constexpr (kConfig.stream_k != 0) {
      using Decomposition = decltype(arguments.scheduler.decomposition_mode);
      // splits > 1: plain split-K into that many K ranges per tile; 1: CUTLASS's data-parallel waves plus
      // stream-K for the remainder; -1: select_splits's choice. Partial sums are added in a fixed order either way.
      const int splits = a.splits == -1 ? select_splits(a.M, a.N) : a.splits;
      arguments.scheduler.splits = splits > 1 ? splits : 1;
      arguments.scheduler.decomposition_mode = splits > 1 ? Decomposition::SplitK : Decomposition::Heuristic;
      arguments.scheduler.reduction_mode = decltype(arguments.scheduler.reduction_mode)::Deterministic;
    }
    return Status::success();
  }

  // Clusters of the row's shape resident at once: the persistent grid. Without it CUTLASS assumes 18-SM GPCs: on an
  // H200's 132 SMs that gives 2-CTA clusters 132 CTAs but 4-CTA ones 116 (perf/NOTES.md v37).
  static cudaError_t max_active_clusters(int device, int& clusters) {
    return cached_per_device(device, clusters, [device](int& resident) {
      if (cudaError_t e = allow_shared_storage(device); e != cudaSuccess) return e;
      cudaLaunchAttribute cluster = cluster_attribute();
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(kConfig.cluster_m, kConfig.cluster_n, 1);
      config.blockDim = Kernel::get_block_shape();
      config.dynamicSmemBytes = Kernel::SharedStorageSize;
      config.attrs = &cluster;
      config.numAttrs = 1;
      return cudaOccupancyMaxActiveClusters(&resident, &cutlass::device_kernel<Kernel>, &config);
    });
  }

  static cudaLaunchAttribute cluster_attribute() {
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kConfig.cluster_m;
    cluster.val.clusterDim.y = kConfig.cluster_n;
    cluster.val.clusterDim.z = 1;
    return cluster;
  }

  // cudaFuncSetAttribute for the kernel's dynamic shared memory, once per device (attributes are per
  // device context); concurrent first calls both set it, which is harmless.
  static cudaError_t allow_shared_storage(int device) {
    int done = 0;
    return cached_per_device(device, done, [](int& set) {
      set = 1;
      return cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(Kernel::SharedStorageSize));
    });
  }

  // One cudaLaunchKernelEx with the row's cluster shape on the caller's stream.
  static Status launch(typename Kernel::Params& params, cudaStream_t stream) {
    static_assert(kClusterSize <= 8, "portable cluster sizes only (no opt-in attribute)");
    cudaLaunchAttribute cluster = cluster_attribute();
    cudaLaunchConfig_t config = {};
    config.gridDim = Kernel::get_grid_shape(params);
    config.blockDim = Kernel::get_block_shape();
    config.dynamicSmemBytes = Kernel::SharedStorageSize;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    void* kernel_params[] = {&params};
    cudaError_t e = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>),
                                        kernel_params);
    return Status::from_cuda(e, "launching the CUTLASS GEMM");
  }
};

}  // namespace gemmbn::detail
