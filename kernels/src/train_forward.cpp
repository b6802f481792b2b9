// The training forward's two launches behind one call: every check of both before the first launch.
#include <cstdlib>

#include "gemmbn/api.h"
#include "gemmbn/configs.h"
#include "gemmbn/switches.h"

namespace gemmbn {
namespace {

// The GEMM's tile order where the call names none: GEMMBN_TRAIN_TILE_ORDER=M|N[swizzle] (along M or along N, with the
// row's swizzle or the one given), read per call. EXPERIMENT, for A/B runs only: along M the GEMM
// finishes its column tiles band by band (a band: swizzle x cluster_n column tiles), so the dataflow walk with items
// first can normalize the first bands beside the last partial wave; but along M slows the GEMM by more than any
// overlap returns (perf/NOTES.md v36).
Status take_tile_order(GemmScaleStatsArgs& gemm) {
  const char* order = std::getenv("GEMMBN_TRAIN_TILE_ORDER");
  if (order == nullptr || *order == '\0' || gemm.raster >= 0 || gemm.swizzle >= 0) return Status::success();
  char* end = nullptr;
  const long swizzle = order[1] == '\0' ? -1 : std::strtol(order + 1, &end, 10);
  if ((order[0] != 'M' && order[0] != 'N') || (end != nullptr && (*end != '\0' || !is_swizzle(swizzle)))) {
    return Status::invalid("GEMMBN_TRAIN_TILE_ORDER must be M or N, then optionally a swizzle (1, 2, 4 or 8)");
  }
  gemm.raster = order[0] == 'M' ? 1 : 2;
  gemm.swizzle = static_cast<int>(swizzle);
  return Status::success();
}

// DIAGNOSTIC (perf/NOTES.md v36): GEMMBN_FLOW_COUNT_ONLY=1, read per call, has the GEMM count its stored tiles as for
// the dataflow walk (each tile's wait for its stores to be written, then its count) while the finish runs the barrier
// walk: the GEMM's time under the walk split into what counting costs it and what the finish running beside it costs.
// Results are the barrier walk's.
bool flow_count_only() { return forced_choice("GEMMBN_FLOW_COUNT_ONLY") == '1'; }

}  // namespace

Status train_forward(const GemmScaleStatsArgs& gemm_args, const FinishNormalizeArgs& finish_args, cudaStream_t stream) {
  GemmScaleStatsArgs gemm = gemm_args;
  FinishNormalizeArgs finish = finish_args;
  size_t flow_bytes = 0;  // the dataflow walk's counters, zeroed before the GEMM counts into them
  if (gemm.tile_flow) return Status::invalid("tile_flow is train_forward's to set (from the finish's tile_columns)");
  // One problem: the finish must read what the GEMM writes.
  if (finish.y != gemm.y || finish.M != gemm.M || finish.N != gemm.N || finish.dtype != gemm.dtype) {
    return Status::invalid("the finish's y, sizes and dtype must be the GEMM's");
  }
  if (finish.partials_from_y) {  // the GEMM without statistics; the finish makes the partials and counts the batch
    if (gemm.partial_mean || gemm.partial_m2 || gemm.batches_tracked) {
      return Status::invalid("with partials_from_y the GEMM takes no partials and no batches_tracked");
    }
    int rows = 0;
    if (Status s = finish_partial_rows(finish.dtype, finish.M, finish.N, rows); !s) return s;
    if (finish.tile_rows != rows) return Status::invalid("tile_rows must be finish_partial_rows");
  } else {
    if (!gemm.partial_mean || !gemm.partial_m2) return Status::invalid("the training forward needs the partials");
    if (finish.partial_mean != gemm.partial_mean || finish.partial_m2 != gemm.partial_m2 ||
        finish.batches_tracked != gemm.batches_tracked) {
      return Status::invalid("the finish's partials and batches_tracked must be the GEMM's");
    }
    int row[kConfigFields];
    if (!gemm_config_row(gemm_operands(gemm), gemm.config, gemm.M, gemm.N, gemm.K, row, true)) {
      return Status::invalid("config is not a row of the operands' table");
    }
    if (finish.tile_rows != row[kConfigFields - 1]) {
      return Status::invalid("tile_rows must be the GEMM row's partial_rows");
    }
    // The dataflow walk: the GEMM counts its stored tiles per column tile in the finish's workspace, and the finish,
    // launched behind it, takes what is stored as it comes (api.h: FinishNormalizeArgs.tile_columns). Under CUDA graph
    // capture too: the memset is a node and the programmatic launch an edge of the graph (perf/NOTES.md v34).
    if (finish.tile_columns == 0 && finish.moments == nullptr && finish.workspace != nullptr &&
        finish_runs_dataflow(finish.dtype, finish.M, finish.N)) {
      finish.tile_columns = row[1];
    }
    if (finish.tile_columns != 0) {
      if (finish.tile_columns != row[1]) return Status::invalid("tile_columns must be the GEMM row's tile_n");
      gemm.tile_flow = finish_tile_flow(finish.workspace, finish.N);
      flow_bytes = finish_tile_flow_bytes(finish);
      if (flow_count_only()) finish.tile_columns = 0;  // the counters are zeroed and counted, and no one reads them
    }
  }
  if (Status s = take_tile_order(gemm); !s) return s;
  // The finish's checks first: gemm_scale_stats checks its own before it launches anything.
  if (Status s = finish_normalize_check(finish); !s) return s;
  if (gemm.tile_flow != nullptr) {
    if (cudaError_t e = cudaMemsetAsync(gemm.tile_flow, 0, flow_bytes, stream); e != cudaSuccess) {
      return Status::from_cuda(e, "zeroing the finish's tile flow");
    }
  }
  if (Status s = gemm_scale_stats(gemm, stream); !s) return s;
  return finish_normalize(finish, stream);
}

}  // namespace gemmbn
