// The producer both fp32-faithful split mainloops run (split_f16x3_mainloop.hpp, x split in registers;
// split_f16x3_presplit_mainloop.hpp, x split before the GEMM). They differ only in how x reaches a stage, so
// the caller passes that copy; W's split k-tile and the tile's row scales come the same way in both.
#pragma once

#include <cute/arch/copy_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

namespace gemmbn::mainloop {

// One elected thread fills stages: per k-tile, copy_x(barrier, k_tile, stage), then W's split k-tile (TMA,
// multicast to every CTA of the (M, 1) cluster, which all read the same W tile) and the row scales of the tile's
// rows from m_coord (a bulk copy into `scale_stages`, so the consumers need no tile coordinate).
//   params: the mainloop's (tma_w, x_scale); gW: W's k-tiles of this CTA's column tile (TileN, split columns, k-tile);
//   sW: W's stages.
template <int TileM, class ClusterShape, class Params, class Pipeline, class PipelineState, class TensorGW,
          class TensorSW, class MCoord, class KTileIterator, class CopyX>
CUTLASS_DEVICE void load_split_stages(Params const& params, Pipeline pipeline, PipelineState smem_pipe_write,
                                      TensorGW const& gW, TensorSW const& sW, uint32_t block_rank_in_cluster,
                                      MCoord m_coord, float* scale_stages, KTileIterator k_tile_iter, int k_tile_count,
                                      CopyX const& copy_x) {
  using namespace cute;
  constexpr uint32_t kScaleBytes = sizeof(float) * TileM;
  constexpr uint32_t cluster_m = size<0>(ClusterShape{});
  auto tma_w = params.tma_w.get_slice(block_rank_in_cluster % cluster_m);
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
    copy_x(*barrier, k_tile, stage);
    copy(params.tma_w.with(*barrier, mcast_mask_w), tWgW(_, _, _, k_tile), tWsW(_, _, _, stage));
    SM90_BULK_COPY_G2S::copy(params.x_scale + int64_t(m_coord) * TileM, barrier, scale_stages + stage * TileM,
                             kScaleBytes);
    ++k_tile_iter;
    ++smem_pipe_write;
  }
}

}  // namespace gemmbn::mainloop
