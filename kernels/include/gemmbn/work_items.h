// The streaming kernels' block shape and work decomposition (finish_normalize, batch_norm_backward): column
// stripes of 32 16-byte vectors x row chunks, the chunks sized so that the items fill the resident blocks once (more
// items than blocks only when the stripes alone outnumber them: blocks then loop over items).
#pragma once

#include <algorithm>
#include <cstdint>

namespace gemmbn {

// The streaming kernels' block: 256 threads, 32 across a row (a 16-byte vector each), so 8 rows per pass.
inline constexpr int kThreads = 256;
inline constexpr int kLanesPerRow = 32;
inline constexpr int kRowsPerPass = kThreads / kLanesPerRow;

struct WorkItems {
  int stripes;
  int64_t rows_per_chunk;  // a multiple of row_step
  int64_t items;           // stripes x row chunks; item i is stripe i % stripes, chunk i / stripes
};

// M x N split for max_blocks resident blocks; row_step: the rows a block covers in one unrolled pass.
inline WorkItems work_items(int64_t M, int N, int cols_per_stripe, int max_blocks, int64_t row_step) {
  const int stripes = static_cast<int>((N + cols_per_stripe - 1) / cols_per_stripe);
  const int64_t row_chunks = std::max<int64_t>(1, std::min<int64_t>((M + row_step - 1) / row_step, max_blocks / stripes));
  const int64_t rows_per_chunk = ((M + row_chunks - 1) / row_chunks + row_step - 1) / row_step * row_step;
  return {stripes, rows_per_chunk, stripes * ((M + rows_per_chunk - 1) / rows_per_chunk)};
}

}  // namespace gemmbn
