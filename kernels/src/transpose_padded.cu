// The split GEMM's operands where the reduction runs down the columns (the backward's dW = dz^T x and
// dx = dz W in fp32 "highest"): a tiled transpose through shared memory, so that both the reads and the
// writes are coalesced (PyTorch's strided copy of a transposed view ran at about a third of the bandwidth;
// perf/NOTES.md v13).
#include "gemmbn/api.h"

namespace gemmbn {
namespace {

constexpr int kTile = 32;                 // a 32 x 32 tile per block pass
constexpr int kThreads = 256;             // 32 columns x 8 rows of threads,
constexpr int kRowsPerThread = kTile / (kThreads / kTile);  // 4 rows each

// out[c, r] = in[r, c] for r < rows, 0 for rows <= r < out_columns (the zero padding).
__global__ void __launch_bounds__(kThreads) transpose_padded_kernel(TransposePaddedArgs a) {
  __shared__ float tile[kTile][kTile + 1];  // +1: the transposed reads fall in distinct banks
  const int tx = static_cast<int>(threadIdx.x) % kTile, ty = static_cast<int>(threadIdx.x) / kTile;
  const int64_t row_tiles = (a.out_columns + kTile - 1) / kTile, col_tiles = (a.cols + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < row_tiles * col_tiles; t += gridDim.x) {  // uniform across the block
    const int64_t r0 = t % row_tiles * kTile, c0 = t / row_tiles * kTile;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t r = r0 + ty + i * (kThreads / kTile), c = c0 + tx;
      tile[ty + i * (kThreads / kTile)][tx] = r < a.rows && c < a.cols ? a.in[r * a.cols + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t c = c0 + ty + i * (kThreads / kTile), r = r0 + tx;
      if (c < a.cols && r < a.out_columns) a.out[c * a.out_columns + r] = tile[tx][ty + i * (kThreads / kTile)];
    }
    __syncthreads();  // the tile is refilled by the next pass
  }
}

}  // namespace

Status transpose_padded(const TransposePaddedArgs& a, cudaStream_t stream) {
  if (a.rows < 1 || a.cols < 1) return Status::invalid("rows and cols must be positive");
  if (a.out_columns < a.rows) return Status::invalid("out_columns must be at least rows");
  if (!a.in || !a.out) return Status::invalid("in and out are required");
  const int64_t tiles = (a.out_columns + kTile - 1) / kTile * ((a.cols + kTile - 1) / kTile);
  const unsigned blocks = static_cast<unsigned>(tiles < (1 << 20) ? tiles : (1 << 20));
  transpose_padded_kernel<<<blocks, kThreads, 0, stream>>>(a);
  return Status::from_cuda(cudaGetLastError(), "launching transpose_padded");
}

}  // namespace gemmbn
