// gemmbn's native operators, registered with PyTorch's dispatcher through LibTorch's stable ABI
// (torch/csrc/stable, built with TORCH_TARGET_VERSION = 2.10): one build loads under every torch >= 2.10.
// Each operator checks its arguments, picks the GEMM's configuration row, allocates its outputs and
// workspace through torch's caching allocator and launches on torch's current stream of the inputs'
// device, so a forward or backward crosses from Python into C++ once. Operands the kernels only read may be views
// of any layout (operator_support.h: readable); a refused call writes nothing the caller holds.
// The kernels' math is in kernels/include/gemmbn/api.h; python/gemmbn/fused.py is the Python side.
#include <array>
#include <tuple>
#include <vector>

#include "operator_support.h"

namespace {

using namespace gemmbn_operators;

// The training GEMM and the finish reading its y and partials: the statistics' partials per tile of the GEMM's
// epilogue or per row chunk of the finish's pass over y (the rule, api.h: train_statistics_from_y), in `scratch`,
// which is allocated here (reserve anything else in it first); y allocated. Where `cublas_allowed` and the rule says
// so (api.h: train_product_by_cublas), the product is cuBLAS's instead: torch's mm writes x W^T into y and the
// finish's product variant (finish.product_scale set) applies bias and scale and takes the statistics from y. The
// caller sets the finish's uses of the statistics (out, or moments) and launches both (launch_training).
struct TrainingLaunch {
  gemmbn::GemmScaleStatsArgs gemm;
  gemmbn::FinishNormalizeArgs finish;
  Tensor y;
};
TrainingLaunch training_launch(Tensor& x, Tensor& weight, OptionalTensor& bias, OptionalTensor& scale,
                               const OptionalTensor& weight_split, const OptionalTensor& weight_unscale,
                               const Problem& p, Scratch& scratch, bool cublas_allowed) {
  std::optional<size_t> x_scale_at;
  gemmbn::GemmScaleStatsArgs g = gemm_arguments(x, weight, bias, scale, weight_split, weight_unscale, p, scratch, x_scale_at);
  const int64_t M = g.M, N = g.N;
  const gemmbn::GemmOperands operands = gemmbn::gemm_operands(g);
  const bool cublas = cublas_allowed && g.scale && gemmbn::train_product_by_cublas(operands, g.M, g.N, g.K);
  const bool from_y = cublas || gemmbn::train_statistics_from_y(operands, g.M, g.N, g.K);
  int tile_rows = 0;
  if (from_y) {
    raise_on_error(gemmbn::finish_partial_rows(p.kernel_dtype, g.M, g.N, tile_rows));
  } else {
    int row[gemmbn::kConfigFields];
    if (!gemmbn::gemm_config_row(gemmbn::gemm_operands(g), -1, g.M, g.N, g.K, row, true)) fail("no GEMM configuration");
    tile_rows = row[gemmbn::kConfigFields - 1];
  }
  const int64_t tiles = (M + tile_rows - 1) / tile_rows;
  Tensor y = empty(x, {M, N}, p.dtype);
  // Per (row block, column) mean and M2 of y as stored: the means, then the M2s.
  const size_t partials_at = scratch.add(sizeof(float) * 2 * tiles * N);
  const size_t finish_at = scratch.add(gemmbn::finish_workspace_bytes(g.N));
  static float statistics_marker;  // the workspace query reads only whether partials are given
  if (!from_y) g.partial_mean = g.partial_m2 = &statistics_marker;
  const std::optional<size_t> workspace_at = cublas ? std::nullopt : reserve_workspace(g, scratch);
  scratch.allocate(x);
  bind_scratch(g, scratch, x_scale_at, workspace_at);
  g.y = y.data_ptr();
  gemmbn::FinishNormalizeArgs f;
  f.dtype = p.kernel_dtype;
  f.y = y.data_ptr();
  f.M = g.M, f.N = g.N, f.tile_rows = tile_rows, f.partials_from_y = from_y;
  f.partial_mean = scratch.at<float>(partials_at);
  f.partial_m2 = f.partial_mean + tiles * N;
  f.workspace = scratch.at<char>(finish_at);
  if (!from_y) g.partial_mean = f.partial_mean, g.partial_m2 = f.partial_m2;
  if (cublas) f.product_bias = g.bias, f.product_scale = g.scale;
  return {g, f, y};
}

// y = x W^T by cuBLAS: torch's aten::mm.out (x, weight [N, K] as they are; W^T a view), on torch's current stream.
void cublas_product(const Tensor& x, const Tensor& weight, const Tensor& y) {
  std::array<StableIValue, 3> stack{torch::stable::detail::from(x),
                                    torch::stable::detail::from(torch::stable::transpose(weight, 0, 1)),
                                    torch::stable::detail::from(y)};
  if (torch_call_dispatcher("aten::mm", "out", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error("gemmbn: torch's mm (the training forward's cuBLAS product) failed");
  }
  (void)torch::stable::detail::to<Tensor>(stack[0]);  // the returned y's handle, released
}

// The training forward's launches, every check before the first (a refused call runs nothing): gemm_scale_stats then
// finish_normalize (api.h: train_forward), or cuBLAS's product then the finish's product variant.
void launch_training(const TrainingLaunch& t, const Tensor& x, const Tensor& weight, const Problem& p) {
  if (!t.finish.product_scale) {
    raise_on_error(gemmbn::train_forward(t.gemm, t.finish, current_stream(p.device)));
    return;
  }
  raise_on_error(gemmbn::finish_normalize_check(t.finish));
  cublas_product(x, weight, t.y);
  raise_on_error(gemmbn::finish_normalize(t.finish, current_stream(p.device)));
}

// The finish's uses of the batch statistics: gamma, beta, the running statistics (momentum=None averages cumulatively
// over the counted batches; with nothing counted, nn.BatchNorm1d's factor is 0) and eps.
void bind_statistics_uses(gemmbn::FinishNormalizeArgs& f, OptionalTensor& gamma, OptionalTensor& beta,
                          const OptionalTensor& running_mean, const OptionalTensor& running_var,
                          const OptionalTensor& num_batches_tracked, std::optional<double> momentum, double eps,
                          const Problem& p) {
  f.gamma = read_vector(gamma, "gamma", p, f.N);
  f.beta = read_vector(beta, "beta", p, f.N);
  if (running_mean.has_value() != running_var.has_value()) fail("running_mean and running_var go together");
  f.running_mean = written_vector(running_mean, "running_mean", p, f.N);
  f.running_var = written_vector(running_var, "running_var", p, f.N);
  f.batches_tracked = counter(num_batches_tracked, "num_batches_tracked", p);
  f.cumulative = !momentum.has_value() && f.batches_tracked != nullptr;
  f.momentum = momentum.value_or(0.0);
  if (!(eps > 0)) fail("eps = " + std::to_string(eps) + " is not positive (the kernels need sqrt(var + eps) > 0)");
  f.eps = eps;
}

// (out, pre_norm, save_mean, save_invstd): y = (x W^T + b) s; out = (y - mean) invstd gamma + beta with the batch
// statistics; running statistics and num_batches_tracked updated in place (api.h: train_forward).
std::tuple<Tensor, Tensor, Tensor, Tensor> train_forward(
    Tensor x, Tensor weight, OptionalTensor bias, Tensor scale, OptionalTensor gamma, OptionalTensor beta,
    OptionalTensor running_mean, OptionalTensor running_var, OptionalTensor num_batches_tracked,
    std::optional<double> momentum, double eps, OptionalTensor weight_split, OptionalTensor weight_unscale,
    bool keep_pre_norm) {
  gemmbn::note_host_mark(gemmbn::HostMark::operator_entered);
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  OptionalTensor scale_read = scale;
  TrainingLaunch t = training_launch(x, weight, bias, scale_read, weight_split, weight_unscale, p, scratch, true);
  auto& [g, f, y] = t;
  // Normalize in place unless y itself is kept for the backward (the product variant then writes it over x W^T).
  Tensor out = keep_pre_norm ? empty(x, {g.M, g.N}, p.dtype) : y;
  if (f.product_scale && keep_pre_norm) f.pre_norm = y.data_ptr();
  Tensor save_mean = empty(x, {g.N}, ScalarType::Float);
  Tensor save_invstd = empty(x, {g.N}, ScalarType::Float);
  f.out = out.data_ptr();
  f.save_mean = static_cast<float*>(save_mean.data_ptr());
  f.save_invstd = static_cast<float*>(save_invstd.data_ptr());
  bind_statistics_uses(f, gamma, beta, running_mean, running_var, num_batches_tracked, momentum, eps, p);
  if (!f.partials_from_y) g.batches_tracked = f.batches_tracked;  // the launch that counts the batch
  launch_training(t, x, weight, p);
  Tensor pre_norm = keep_pre_norm ? y : empty(x, {0}, p.dtype);
  return {out, pre_norm, save_mean, save_invstd};
}

// Batch statistics over a process group's ranks (issue 19; python/gemmbn/distributed.py calls both around its
// collective). (y, moments): y = (x W^T + b) s and this batch's per-column moments [3, N] float32 (rows, mean_y, M2),
// the training GEMM with its partials then finish_normalize's statistics alone (api.h: FinishNormalizeArgs.moments).
std::tuple<Tensor, Tensor> train_moments(Tensor x, Tensor weight, OptionalTensor bias, Tensor scale,
                                         OptionalTensor weight_split, OptionalTensor weight_unscale) {
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  OptionalTensor scale_read = scale;
  // The moments launch has no phase 2 to apply the product's bias and scale: gemmbn's GEMM always.
  auto [g, f, y] = training_launch(x, weight, bias, scale_read, weight_split, weight_unscale, p, scratch, false);
  Tensor moments = empty(x, {3, g.N}, ScalarType::Float);
  f.moments = static_cast<float*>(moments.data_ptr());
  raise_on_error(gemmbn::train_forward(g, f, current_stream(p.device)));
  return {y, moments};
}

// (out, save_mean, save_invstd): y [M, N] normalized with the statistics of the ranks' moments gathered in rank order
// [ranks, 3, N] (train_moments's, a rank without rows contributing zeros), gamma and beta applied, the running
// statistics moved with them (api.h: FinishNormalizeArgs.rank_moments). num_batches_tracked is read for
// momentum=None, not counted: the caller counts the batch first.
std::tuple<Tensor, Tensor, Tensor> normalize_from_moments(
    Tensor y, Tensor rank_moments, OptionalTensor gamma, OptionalTensor beta, OptionalTensor running_mean,
    OptionalTensor running_var, OptionalTensor num_batches_tracked, std::optional<double> momentum, double eps) {
  const Problem p = problem_of(y, "y");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  const int M = checked_int(y.size(0), "M"), N = checked_int(y.size(1), "N");
  y = readable(y, "y", p, p.dtype, {M, N});
  if (rank_moments.dim() != 3 || rank_moments.size(1) != 3) {
    fail("rank_moments must be [ranks, 3, N] (each rank's rows, mean and M2), got shape " + shape_string(rank_moments));
  }
  const int ranks = checked_int(rank_moments.size(0), "ranks");
  rank_moments = readable(rank_moments, "rank_moments", p, ScalarType::Float, {ranks, 3, N});
  gemmbn::FinishNormalizeArgs f;
  f.dtype = p.kernel_dtype;
  f.M = M, f.N = N, f.tile_rows = 1;
  f.rank_moments = static_cast<const float*>(rank_moments.data_ptr()), f.ranks = ranks;
  bind_statistics_uses(f, gamma, beta, running_mean, running_var, num_batches_tracked, momentum, eps, p);
  Tensor out = empty(y, {M, N}, p.dtype);
  Tensor save_mean = empty(y, {N}, ScalarType::Float);
  Tensor save_invstd = empty(y, {N}, ScalarType::Float);
  const Scratch scratch = bind_finish_workspace(f, y);
  f.y = y.data_ptr(), f.out = out.data_ptr();
  f.save_mean = static_cast<float*>(save_mean.data_ptr());
  f.save_invstd = static_cast<float*>(save_invstd.data_ptr());
  raise_on_error(gemmbn::finish_normalize(f, current_stream(p.device)));
  return {out, save_mean, save_invstd};
}

// eval_forward's fold, but for bias and scale (read for the GEMM first): gamma, beta and the running statistics, [N]
// each of the problem's dtype (read in place, or as copies the caller keeps until the launch), and eps.
void bind_fold(gemmbn::FoldEvalAffineArgs& f, OptionalTensor& gamma, OptionalTensor& beta, Tensor& running_mean,
               Tensor& running_var, double eps, const Problem& p) {
  f.dtype = p.kernel_dtype;
  f.gamma = read_vector(gamma, "gamma", p, f.N);
  f.beta = read_vector(beta, "beta", p, f.N);
  running_mean = readable(running_mean, "running_mean", p, p.dtype, {f.N});
  running_var = readable(running_var, "running_var", p, p.dtype, {f.N});
  f.running_mean = running_mean.data_ptr();
  f.running_var = running_var.data_ptr();
  if (!(eps > 0)) fail("eps = " + std::to_string(eps) + " is not positive (the kernels need sqrt(var + eps) > 0)");
  f.eps = eps;
}

// The eval GEMM's launch: out = (x W^T) gain + shift, g's bias and scale already folded away; `scratch` has any
// place the caller reserved (bound after allocation by the caller's `bind`).
template <class Bind>
Tensor launch_eval_gemm(gemmbn::GemmScaleStatsArgs& g, Tensor& x, const Problem& p, Scratch& scratch,
                        std::optional<size_t> x_scale_at, Bind bind) {
  Tensor out = empty(x, {g.M, g.N}, p.dtype);
  const std::optional<size_t> workspace_at = reserve_workspace(g, scratch);
  scratch.allocate(x);
  bind_scratch(g, scratch, x_scale_at, workspace_at);
  bind();
  g.y = out.data_ptr();
  raise_on_error(gemmbn::gemm_scale_stats(g, current_stream(p.device)));
  return out;
}

// out = ((x W^T + b) s - running_mean) / sqrt(running_var + eps) gamma + beta: bias, scale and the running statistics
// folded into a per-column gain and shift, then one GEMM (api.h: fold_eval_affine, gemm_scale_stats).
Tensor eval_forward(Tensor x, Tensor weight, OptionalTensor bias, Tensor scale, OptionalTensor gamma,
                    OptionalTensor beta, Tensor running_mean, Tensor running_var, double eps,
                    OptionalTensor weight_split, OptionalTensor weight_unscale) {
  gemmbn::note_host_mark(gemmbn::HostMark::operator_entered);
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  std::optional<size_t> x_scale_at;
  OptionalTensor scale_read = scale;
  gemmbn::GemmScaleStatsArgs g =
      gemm_arguments(x, weight, bias, scale_read, weight_split, weight_unscale, p, scratch, x_scale_at);
  gemmbn::FoldEvalAffineArgs f;
  f.N = g.N;
  bind_fold(f, gamma, beta, running_mean, running_var, eps, p);
  f.bias = g.bias, f.scale = g.scale;  // folded into the gain and shift: the GEMM runs without them
  g.bias = g.scale = nullptr;
  const size_t affine_at = scratch.add(sizeof(float) * 2 * g.N);  // the folded gain, then the shift
  // The fold writes only the affine scratch, so a GEMM refused after it leaves the caller's state as it was.
  return launch_eval_gemm(g, x, p, scratch, x_scale_at, [&] {
    f.gain = scratch.at<float>(affine_at), f.shift = f.gain + g.N;
    g.gain = f.gain, g.shift = f.shift;
    raise_on_error(gemmbn::fold_eval_affine(f, current_stream(p.device)));
  });
}

// [2, N] float32, the gain then the shift: eval_forward's fold alone (same arguments and checks), for a caller that
// keeps it while none of its inputs changes (python/gemmbn/eval_fold_cache.py) and runs eval_forward_folded with it.
Tensor eval_affine(Tensor x, Tensor weight, OptionalTensor bias, Tensor scale, OptionalTensor gamma, OptionalTensor beta,
                   Tensor running_mean, Tensor running_var, double eps) {
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  if (weight.dim() != 2) fail("weight must be 2-D, got shape " + shape_string(weight));
  gemmbn::FoldEvalAffineArgs f;
  f.N = checked_int(weight.size(0), "N");
  OptionalTensor scale_read = scale;
  f.bias = read_vector(bias, "bias", p, f.N);
  f.scale = read_vector(scale_read, "scale", p, f.N);
  bind_fold(f, gamma, beta, running_mean, running_var, eps, p);
  Tensor affine = empty(x, {2, f.N}, ScalarType::Float);
  f.gain = static_cast<float*>(affine.data_ptr()), f.shift = f.gain + f.N;
  raise_on_error(gemmbn::fold_eval_affine(f, current_stream(p.device)));
  return affine;
}

// out = (x W^T) gain + shift with eval_affine's [2, N] (gain, shift): eval_forward without its fold.
Tensor eval_forward_folded(Tensor x, Tensor weight, Tensor affine, OptionalTensor weight_split,
                           OptionalTensor weight_unscale) {
  gemmbn::note_host_mark(gemmbn::HostMark::operator_entered);
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  std::optional<size_t> x_scale_at;
  OptionalTensor no_bias, no_scale;
  gemmbn::GemmScaleStatsArgs g =
      gemm_arguments(x, weight, no_bias, no_scale, weight_split, weight_unscale, p, scratch, x_scale_at);
  affine = readable(affine, "affine", p, ScalarType::Float, {2, g.N});
  return launch_eval_gemm(g, x, p, scratch, x_scale_at, [&] {
    g.gain = static_cast<const float*>(affine.data_ptr()), g.shift = g.gain + g.N;
  });
}

// y = (x W^T + b) s on the GEMM without statistics (bias, scale None: 0, 1); the fp32-faithful GEMM when
// weight_split and weight_unscale are given. The eval backward's y and the gradient GEMMs.
Tensor linear_scale(Tensor x, Tensor weight, OptionalTensor bias, OptionalTensor scale, OptionalTensor weight_split,
                    OptionalTensor weight_unscale) {
  const Problem p = problem_of(x, "x");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  Scratch scratch;
  std::optional<size_t> x_scale_at;
  gemmbn::GemmScaleStatsArgs g =
      gemm_arguments(x, weight, bias, scale, weight_split, weight_unscale, p, scratch, x_scale_at);
  Tensor y = empty(x, {int64_t(g.M), int64_t(g.N)}, p.dtype);
  g.y = y.data_ptr();
  const std::optional<size_t> workspace_at = reserve_workspace(g, scratch);
  scratch.allocate(x);
  bind_scratch(g, scratch, x_scale_at, workspace_at);
  raise_on_error(gemmbn::gemm_scale_stats(g, current_stream(p.device)));
  return y;
}

// The split GEMM's operand pair for `rows` rows reduced over `k`: fp16 hi/lo [rows, split_weight_columns(k)] and the
// float32 unscale [rows] (split_weight's and split_columns's outputs).
std::tuple<Tensor, Tensor> empty_split(const Tensor& like, int rows, int k) {
  return {empty(like, {rows, gemmbn::split_weight_columns(k)}, ScalarType::Half), empty(like, {rows}, ScalarType::Float)};
}

// (weight_split, weight_unscale): W [N, K] float32 as the fp32-faithful GEMM's operand (api.h: split_weight).
std::tuple<Tensor, Tensor> split_weight(Tensor weight) {
  const Problem p = problem_of(weight, "weight");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::SplitWeightArgs a;
  a.N = checked_int(weight.size(0), "N");
  a.K = checked_int(weight.size(1), "K");
  weight = readable(weight, "weight", p, ScalarType::Float, {a.N, a.K});
  auto [weight_split, weight_unscale] = empty_split(weight, a.N, a.K);
  a.weight = static_cast<const float*>(weight.data_ptr());
  a.weight_split = weight_split.data_ptr();
  a.weight_unscale = static_cast<float*>(weight_unscale.data_ptr());
  raise_on_error(gemmbn::split_weight(a, current_stream(p.device)));
  return {weight_split, weight_unscale};
}

// (split, unscale): split_weight of t^T for t [R, C] float32, without transposing t (api.h: split_columns): the split
// GEMM's B operand where the reduction runs down t's columns (the backward's x and W).
std::tuple<Tensor, Tensor> split_columns(Tensor t) {
  const Problem p = problem_of(t, "t");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::SplitColumnsArgs a;
  a.R = checked_int(t.size(0), "R");
  a.C = checked_int(t.size(1), "C");
  t = readable(t, "t", p, ScalarType::Float, {a.R, a.C});
  auto [split, unscale] = empty_split(t, a.C, a.R);
  Tensor column_max = empty(t, {a.C}, ScalarType::Float);  // C 32-bit words of scratch (the maxima's bits)
  a.t = static_cast<const float*>(t.data_ptr());
  a.column_max_bits = static_cast<unsigned*>(column_max.data_ptr());
  a.split = split.data_ptr();
  a.unscale = static_cast<float*>(unscale.data_ptr());
  raise_on_error(gemmbn::split_columns(a, current_stream(p.device)));
  return {split, unscale};
}

// a @ b on the fp32-faithful GEMM for a [M, K] float32 and b [K, N] given by its split (split_columns(b), or
// split_weight(b^T)): the backward's gradient GEMMs, which never read b itself. a_row_max: the bits of a's rows'
// maxima where known (transpose_padded's), which spares the GEMM its pass over a for the row scales.
Tensor split_matmul(Tensor a, Tensor b_split, Tensor b_unscale, OptionalTensor a_row_max) {
  const Problem p = problem_of(a, "a");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  if (p.dtype != ScalarType::Float) fail(std::string("a must be float32 (the fp32-faithful GEMM), got ") + dtype_name(p.dtype));
  gemmbn::GemmScaleStatsArgs g;
  g.dtype = p.kernel_dtype;
  g.M = checked_int(a.size(0), "M");
  g.K = checked_int(a.size(1), "K");
  if (b_unscale.dim() != 1) fail("b_unscale must be 1-D, got shape " + shape_string(b_unscale));
  g.N = checked_int(b_unscale.size(0), "N");
  a = readable(a, "a", p, ScalarType::Float, {g.M, g.K});
  Scratch scratch;
  const std::optional<size_t> x_scale_at = bind_split_operand(g, b_split, b_unscale, "b_split", "b_unscale", p, scratch);
  if (a_row_max) {
    check(*a_row_max, "a_row_max", p, ScalarType::Int, {g.M});
    g.x_row_max_bits = static_cast<const unsigned*>(a_row_max->data_ptr());
  }
  g.x = a.data_ptr();
  Tensor out = empty(a, {int64_t(g.M), int64_t(g.N)}, ScalarType::Float);
  g.y = out.data_ptr();
  const std::optional<size_t> workspace_at = reserve_workspace(g, scratch);
  scratch.allocate(a);
  bind_scratch(g, scratch, x_scale_at, workspace_at);
  raise_on_error(gemmbn::gemm_scale_stats(g, current_stream(p.device)));
  return out;
}

// (out, row_max, column_max): out[c, r] = input[r, c], zero for r >= R: float32 [R, C] -> [C, R'], R' = R rounded up
// to a multiple of 4 (the GEMMs' operand where the reduction runs down input's columns); with `maxima`, the bits of
// input's rows' [R] and columns' [C] largest magnitudes as int32 (split_matmul's a_row_max for input and for out),
// else empty [0] tensors.
std::tuple<Tensor, Tensor, Tensor> transpose_padded(Tensor input, bool maxima) {
  const Problem p = problem_of(input, "input");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::TransposePaddedArgs a;
  a.rows = input.size(0), a.cols = input.size(1), a.out_columns = (a.rows + 3) / 4 * 4;
  input = readable(input, "input", p, ScalarType::Float, {a.rows, a.cols});
  Tensor out = empty(input, {a.cols, a.out_columns}, ScalarType::Float);
  Tensor row_max = empty(input, {maxima ? a.rows : 0}, ScalarType::Int);
  Tensor column_max = empty(input, {maxima ? a.cols : 0}, ScalarType::Int);
  a.in = static_cast<const float*>(input.data_ptr());
  a.out = static_cast<float*>(out.data_ptr());
  if (maxima) {
    a.row_max_bits = static_cast<unsigned*>(row_max.data_ptr());
    a.column_max_bits = static_cast<unsigned*>(column_max.data_ptr());
  }
  raise_on_error(gemmbn::transpose_padded(a, current_stream(p.device)));
  return {out, row_max, column_max};
}

// batch_norm_backward's launch with its workspace (from torch's caching allocator, on dout's stream).
void launch_batch_norm_backward(gemmbn::BatchNormBackwardArgs& a, const Tensor& dout, const Problem& p) {
  size_t bytes = 0;
  raise_on_error(gemmbn::batch_norm_backward_workspace_bytes(a, bytes));
  Tensor workspace = empty(dout, {int64_t(bytes)}, ScalarType::Byte);
  a.workspace = workspace.data_ptr(), a.workspace_bytes = bytes;
  raise_on_error(gemmbn::batch_norm_backward(a, current_stream(p.device)));
}

// Bits of batch_norm_backward's `outputs`: which of (dz, dgamma, dbeta, dbias, dscale, dz^T with dz's maxima) to
// compute.
enum BackwardOutput : int64_t { kDz = 1, kDgamma = 2, kDbeta = 4, kDbias = 8, kDscale = 16, kDzTransposed = 32 };

// (dz, dgamma, dbeta, dbias, dscale) in dout's dtype, and with kDzTransposed (float32, with dz) (dz_t, dz_row_max,
// dz_column_max) as transpose_padded(dz, maxima=True) returns them; each an empty [0] tensor where `outputs` does not
// ask for it: the normalization's and the scale's backward (api.h: batch_norm_backward).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> batch_norm_backward(
    Tensor dout, OptionalTensor y, Tensor mean, Tensor invstd, OptionalTensor gamma, Tensor scale, Tensor x,
    Tensor weight, OptionalTensor bias, bool batch_statistics, int64_t outputs, OptionalTensor local_sums,
    OptionalTensor global_sums, OptionalTensor global_rows) {
  const Problem p = problem_of(dout, "dout");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::BatchNormBackwardArgs a;
  a.dtype = p.kernel_dtype;
  a.M = checked_int(dout.size(0), "M");
  a.N = checked_int(dout.size(1), "N");
  const int64_t M = a.M, N = a.N;
  dout = readable(dout, "dout", p, p.dtype, {M, N});
  if (y) y = readable(*y, "y", p, p.dtype, {M, N});
  mean = readable(mean, "mean", p, ScalarType::Float, {N});
  invstd = readable(invstd, "invstd", p, ScalarType::Float, {N});
  if (x.dim() != 2) fail("x must be 2-D, got shape " + shape_string(x));
  a.K = checked_int(x.size(1), "K");
  x = readable(x, "x", p, p.dtype, {M, a.K});
  weight = readable(weight, "weight", p, p.dtype, {N, a.K});
  a.dout = dout.data_ptr();
  a.y = y ? y->data_ptr() : nullptr;
  a.mean = static_cast<const float*>(mean.data_ptr());
  a.invstd = static_cast<const float*>(invstd.data_ptr());
  a.gamma = read_vector(gamma, "gamma", p, N);
  scale = readable(scale, "scale", p, p.dtype, {N});
  a.scale = scale.data_ptr();
  a.x = x.data_ptr(), a.weight = weight.data_ptr();
  a.bias = read_vector(bias, "bias", p, N);
  a.batch_statistics = batch_statistics;
  if (outputs < 0 || outputs > 63) {
    fail("outputs must be a bit mask of 6 bits (dz, dgamma, dbeta, dbias, dscale, dz transposed)");
  }
  const bool transposed = outputs & kDzTransposed;
  if (transposed && (p.dtype != ScalarType::Float || !(outputs & kDz))) {
    fail("dz transposed is float32's and comes with dz, got " + std::string(dtype_name(p.dtype)));
  }
  auto output = [&](int64_t bit, std::vector<int64_t> shape, void*& pointer) {
    if (!(outputs & bit)) return empty(dout, {0}, p.dtype);
    Tensor t = empty(dout, std::move(shape), p.dtype);
    pointer = t.data_ptr();
    return t;
  };
  Tensor dz = output(kDz, {M, N}, a.dz);
  Tensor dgamma = output(kDgamma, {N}, a.dgamma);
  Tensor dbeta = output(kDbeta, {N}, a.dbeta);
  Tensor dbias = output(kDbias, {N}, a.dbias);
  Tensor dscale = output(kDscale, {N}, a.dscale);
  a.dz_t_columns = transposed ? (M + 3) / 4 * 4 : 0;
  Tensor dz_t = empty(dout, transposed ? std::vector<int64_t>{N, a.dz_t_columns} : std::vector<int64_t>{0}, ScalarType::Float);
  Tensor dz_row_max = empty(dout, {transposed ? M : 0}, ScalarType::Int);
  Tensor dz_column_max = empty(dout, {transposed ? N : 0}, ScalarType::Int);
  if (transposed) {
    a.dz_t = static_cast<float*>(dz_t.data_ptr());
    a.dz_row_max_bits = static_cast<unsigned*>(dz_row_max.data_ptr());
    a.dz_column_max_bits = static_cast<unsigned*>(dz_column_max.data_ptr());
  }
  if (local_sums || global_sums || global_rows) {  // the gradients' launch over ranks (api.h)
    if (!(local_sums && global_sums && global_rows)) fail("local_sums, global_sums and global_rows come together");
    local_sums = readable(*local_sums, "local_sums", p, ScalarType::Double, {3, N});
    global_sums = readable(*global_sums, "global_sums", p, ScalarType::Double, {2, N});
    global_rows = readable(*global_rows, "global_rows", p, ScalarType::Double, {1});
    a.local_sums = static_cast<const double*>(local_sums->data_ptr());
    a.global_sums = static_cast<const double*>(global_sums->data_ptr());
    a.global_rows = static_cast<const double*>(global_rows->data_ptr());
  }
  launch_batch_norm_backward(a, dout, p);
  return {dz, dgamma, dbeta, dbias, dscale, dz_t, dz_row_max, dz_column_max};
}

// [3, N] float64: this batch's column sums of dout, dout (y - mean) and y - mean, the sums launch of a backward with
// statistics over ranks (api.h: BatchNormBackwardArgs.column_sums_out); mean and invstd are the global statistics.
Tensor batch_norm_backward_sums(Tensor dout, Tensor y, Tensor mean, Tensor invstd) {
  const Problem p = problem_of(dout, "dout");
  torch::stable::accelerator::DeviceGuard guard(p.device);
  gemmbn::BatchNormBackwardArgs a;
  a.dtype = p.kernel_dtype;
  a.M = checked_int(dout.size(0), "M");
  a.N = checked_int(dout.size(1), "N");
  const int64_t M = a.M, N = a.N;
  dout = readable(dout, "dout", p, p.dtype, {M, N});
  y = readable(y, "y", p, p.dtype, {M, N});
  mean = readable(mean, "mean", p, ScalarType::Float, {N});
  invstd = readable(invstd, "invstd", p, ScalarType::Float, {N});
  a.dout = dout.data_ptr(), a.y = y.data_ptr();
  a.mean = static_cast<const float*>(mean.data_ptr());
  a.invstd = static_cast<const float*>(invstd.data_ptr());
  Tensor sums = empty(dout, {3, N}, ScalarType::Double);
  a.column_sums_out = static_cast<double*>(sums.data_ptr());
  launch_batch_norm_backward(a, dout, p);
  return sums;
}

}  // namespace

// A fragment: the Python side (python/gemmbn/ops.py) defines the layer's own operators in the same namespace.
STABLE_TORCH_LIBRARY_FRAGMENT(gemmbn, m) {
  m.def("train_forward(Tensor x, Tensor weight, Tensor? bias, Tensor scale, Tensor? gamma, Tensor? beta, "
        "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, float? momentum, "
        "float eps, Tensor? weight_split, Tensor? weight_unscale, bool keep_pre_norm) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("eval_forward(Tensor x, Tensor weight, Tensor? bias, Tensor scale, Tensor? gamma, Tensor? beta, "
        "Tensor running_mean, Tensor running_var, float eps, Tensor? weight_split, Tensor? weight_unscale) -> Tensor");
  m.def("eval_affine(Tensor x, Tensor weight, Tensor? bias, Tensor scale, Tensor? gamma, Tensor? beta, "
        "Tensor running_mean, Tensor running_var, float eps) -> Tensor");
  m.def("eval_forward_folded(Tensor x, Tensor weight, Tensor affine, Tensor? weight_split, Tensor? weight_unscale) "
        "-> Tensor");
  m.def("linear_scale(Tensor x, Tensor weight, Tensor? bias, Tensor? scale, Tensor? weight_split, "
        "Tensor? weight_unscale) -> Tensor");
  m.def("train_moments(Tensor x, Tensor weight, Tensor? bias, Tensor scale, Tensor? weight_split, "
        "Tensor? weight_unscale) -> (Tensor, Tensor)");
  m.def("normalize_from_moments(Tensor y, Tensor rank_moments, Tensor? gamma, Tensor? beta, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, Tensor? num_batches_tracked, float? momentum, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("split_weight(Tensor weight) -> (Tensor, Tensor)");
  m.def("split_columns(Tensor t) -> (Tensor, Tensor)");
  m.def("split_matmul(Tensor a, Tensor b_split, Tensor b_unscale, Tensor? a_row_max=None) -> Tensor");
  m.def("transpose_padded(Tensor input, bool maxima=False) -> (Tensor, Tensor, Tensor)");
  m.def("batch_norm_backward(Tensor dout, Tensor? y, Tensor mean, Tensor invstd, Tensor? gamma, Tensor scale, "
        "Tensor x, Tensor weight, Tensor? bias, bool batch_statistics, int outputs, Tensor? local_sums=None, "
        "Tensor? global_sums=None, Tensor? global_rows=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("batch_norm_backward_sums(Tensor dout, Tensor y, Tensor mean, Tensor invstd) -> Tensor");
}

// CPU inputs reach the same functions, which refuse them by name ("x must be a CUDA tensor") instead of the
// dispatcher's "no kernel for CPU".
#define GEMMBN_REGISTER_KERNELS(m)                                    \
  m.impl("train_forward", TORCH_BOX(&train_forward));                 \
  m.impl("eval_forward", TORCH_BOX(&eval_forward));                   \
  m.impl("eval_affine", TORCH_BOX(&eval_affine));                     \
  m.impl("eval_forward_folded", TORCH_BOX(&eval_forward_folded));     \
  m.impl("linear_scale", TORCH_BOX(&linear_scale));                   \
  m.impl("train_moments", TORCH_BOX(&train_moments));                 \
  m.impl("normalize_from_moments", TORCH_BOX(&normalize_from_moments)); \
  m.impl("split_weight", TORCH_BOX(&split_weight));                   \
  m.impl("split_columns", TORCH_BOX(&split_columns));                 \
  m.impl("split_matmul", TORCH_BOX(&split_matmul));                   \
  m.impl("transpose_padded", TORCH_BOX(&transpose_padded));           \
  m.impl("batch_norm_backward", TORCH_BOX(&batch_norm_backward));     \
  m.impl("batch_norm_backward_sums", TORCH_BOX(&batch_norm_backward_sums))

STABLE_TORCH_LIBRARY_IMPL(gemmbn, CUDA, m) { GEMMBN_REGISTER_KERNELS(m); }
STABLE_TORCH_LIBRARY_IMPL(gemmbn, CPU, m) { GEMMBN_REGISTER_KERNELS(m); }
