// GEMM configurations: a table per operand type, one function picks a row. Each row is compiled
// once (kernels/src/gemm_<type>.cu instantiates every row of its table).
#pragma once

#include "gemmbn/api.h"

namespace gemmbn {

struct TileConfig {
  int tile_m, tile_n, tile_k;  // CTA tile
  int cluster_m, cluster_n;    // thread-block cluster (TMA multicast)
};

// 128x256 tiles with a 2x1 cluster were the fastest probes at 16384x4096x4096 (measurements.md):
// TF32 1.43 ms, bf16 0.85 ms with the statistics epilogue.
inline constexpr TileConfig kTf32Configs[] = {
    {128, 256, 32, 2, 1},
};
inline constexpr TileConfig kHalfConfigs[] = {  // bf16 and fp16 share the shapes
    {128, 256, 64, 2, 1},
};

inline constexpr int kTf32ConfigCount = sizeof(kTf32Configs) / sizeof(TileConfig);
inline constexpr int kHalfConfigCount = sizeof(kHalfConfigs) / sizeof(TileConfig);

// Index into the dtype's table for this problem.
int select_config(DType dtype, int M, int N, int K);
const TileConfig& config_at(DType dtype, int index);

}  // namespace gemmbn
