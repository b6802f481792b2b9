// The finish kernel's memory access patterns against a device copy, without torch or the built library (issue 18's
// "finish >= 90% of copy"; perf/NOTES.md v23); it shares the kernels' 16-byte vectors and work split (headers only):
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels/include -o /tmp/finish_patterns perf/finish_patterns.cu && \
//     /tmp/finish_patterns [M N]
//
// Each candidate runs in place over y [M, N] (float32, then bfloat16), L2 flushed before every call (a 256 MB memset,
// not timed), all candidates of a dtype interleaved, median of 30 calls:
//   memcpy            cudaMemcpyAsync of y to a second buffer (reads and writes the same bytes: the ceiling)
//   flat              y = y a[n] + d[n] over the array as one flat run of 16-byte vectors, a plain grid of
//                     4 vectors per thread (the shape of torch's elementwise kernels)
//   stripes Lx U      finish_normalize's phase 2: 256-thread blocks, L threads across a row (16 bytes each) and
//                     256 / L rows per pass, U passes' loads in flight per thread, the work items of
//                     kernels/include/gemmbn/work_items.h over the resident blocks (persistent)
//   finish Lx U       phase 1 (a block per 16 columns merges 128-row tiles' mean/M2 partials in fp64), a grid-wide
//                     barrier, then the stripes; cooperative, as finish_normalize runs
//   finish+prefetch   the same, with the blocks that merge nothing loading their first pass of y before the barrier
//                     (registers, no shared memory), so DRAM is busy while phase 1 and the barrier run
//   finish+prefetch all  every block loads its first pass before phase 1 (the merging blocks hold it through phase 1)
//   grid R            the stripes 32x8 as a plain grid, one block per item of R rows (the hardware balances the blocks)
//   claim R           the stripes 32x8 on the resident blocks, items of R rows claimed from an atomic counter (the next
//                     claim in flight while an item streams), so a block on a slower SM takes fewer
//   finish claim R    phase 1, the grid barrier, then claim R (the counter zeroed before the call, outside the timing)
//   (finish) claim early R  the same, each item's first loads of y issued before its column factors' loads
//   claim early min3 R  the same with three blocks per SM at least (the registers capped for it)
//   finish split R    phase 1 as its own launch (a block per merge group), then grid R from its statistics
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "gemmbn/elementwise.cuh"
#include "gemmbn/work_items.h"

namespace cg = cooperative_groups;
using gemmbn::kThreads;
template <class T>
using Vec = gemmbn::Vector16<T>;

#define CHECK(call)                                                                            \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

constexpr int kTileRows = 128, kMergeColumns = 16, kMergeBatch = 8;

struct Params {
  void* y;
  int64_t M;
  int N;
  const float *alpha, *delta;        // per column (the flat and stripes candidates)
  const float *partial_mean, *partial_m2;  // [tiles, N] (the finish candidates)
  float *mean, *invstd;              // phase 1's results, phase 2's inputs
  int tiles, stripes, items;
  int64_t rows_per_chunk;
};

// flat: out[i] = y[i] a[n] + d[n] over 16-byte vectors, 4 per thread, block-contiguous.
template <class T>
__global__ void __launch_bounds__(kThreads) flat_kernel(Params p) {
  using V = Vec<T>;
  const int64_t vectors = p.M * p.N / V::kSize, base = int64_t(blockIdx.x) * kThreads * 4 + threadIdx.x;
  T* y = static_cast<T*>(p.y);
  V v[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    if (base + u * kThreads < vectors) v[u].load(y + (base + u * kThreads) * V::kSize);
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t i = base + u * kThreads;
    if (i >= vectors) continue;
    const int col = static_cast<int>((i * V::kSize) % p.N);
#pragma unroll
    for (int k = 0; k < V::kSize; ++k) v[u].set(k, fmaf(v[u].get(k), __ldg(p.alpha + col + k), __ldg(p.delta + col + k)));
    v[u].store(y + i * V::kSize);
  }
}

// Phase 1 as finish_normalize's (16 columns per block, 16 tile lanes, 8 tiles' loads in flight, fp64 sums shifted by
// tile 0's mean, lanes added in a fixed order).
__device__ void merge_partials(Params const& p, double* lane_s1, double* lane_s2) {
  constexpr int lanes = kThreads / kMergeColumns;
  const int offset = threadIdx.x % kMergeColumns, tile_lane = threadIdx.x / kMergeColumns;
  const int groups = (p.N + kMergeColumns - 1) / kMergeColumns;
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {
    const int col = group * kMergeColumns + offset;
    const double shift = p.partial_mean[col];
    double s1 = 0, s2 = 0;
    for (int t0 = tile_lane; t0 < p.tiles; t0 += lanes * kMergeBatch) {
      float m[kMergeBatch], q[kMergeBatch];
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const int t = t0 + j * lanes;
        m[j] = t < p.tiles ? p.partial_mean[int64_t(t) * p.N + col] : 0.f;
        q[j] = t < p.tiles ? p.partial_m2[int64_t(t) * p.N + col] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        if (t0 + j * lanes >= p.tiles) continue;
        const double d = m[j] - shift;
        s1 = fma(double(kTileRows), d, s1);
        s2 += fma(kTileRows * d, d, double(q[j]));
      }
    }
    lane_s1[threadIdx.x] = s1, lane_s2[threadIdx.x] = s2;
    __syncthreads();
    if (tile_lane == 0) {
      double t1 = 0, t2 = 0;
      for (int l = 0; l < lanes; ++l) t1 += lane_s1[l * kMergeColumns + offset], t2 += lane_s2[l * kMergeColumns + offset];
      const double rows = double(p.M), var = fmax(t2 - t1 * (t1 / rows), 0.0) / rows;
      p.mean[col] = float(shift + t1 / rows);
      p.invstd[col] = float(1.0 / sqrt(var + 1e-5));
    }
    __syncthreads();
  }
}

// Phase 2: stripes of kLanes 16-byte vectors x row chunks; kFromStats: alpha = invstd, delta = -mean invstd (phase
// 1's), else the given per-column arrays. kPreloaded: the thread's first pass is already in v (finish+prefetch).
template <class T, int kLanes, int kUnroll>
struct Stripes {
  using V = Vec<T>;
  static constexpr int kRowsPerPass = kThreads / kLanes, kCols = kLanes * V::kSize;
  static constexpr int64_t kPassRows = int64_t(kRowsPerPass) * kUnroll;

  __device__ static void load_pass(Params const& p, int item, int64_t r, V (&v)[kUnroll]) {
    const int stripe = item % p.stripes;
    const int64_t chunk = item / p.stripes, row_end = min(p.M, (chunk + 1) * p.rows_per_chunk);
    const int col = stripe * kCols + int(threadIdx.x % kLanes) * V::kSize;
    const T* y = static_cast<const T*>(p.y);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u * kRowsPerPass < row_end && col < p.N) v[u].load(y + (r + u * kRowsPerPass) * p.N + col);
    }
  }
  __device__ static int64_t first_row(Params const& p, int item) {
    return item / p.stripes * p.rows_per_chunk + threadIdx.x / kLanes;
  }
  // A thread's column factors: out = y a + d.
  template <bool kFromStats>
  __device__ static void load_factors(Params const& p, int col, float (&a)[V::kSize], float (&d)[V::kSize]) {
#pragma unroll
    for (int k = 0; k < V::kSize; ++k) {
      if constexpr (kFromStats) {
        a[k] = p.invstd[col + k], d[k] = -p.mean[col + k] * a[k];
      } else {
        a[k] = p.alpha[col + k], d[k] = p.delta[col + k];
      }
    }
  }
  // One loaded pass from row r: y = y a + d, stored in place.
  __device__ static void store_pass(Params const& p, int64_t r, int64_t row_end, int col, V (&v)[kUnroll],
                                    float const (&a)[V::kSize], float const (&d)[V::kSize]) {
    T* y = static_cast<T*>(p.y);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t row = r + u * kRowsPerPass;
      if (row >= row_end) continue;
#pragma unroll
      for (int k = 0; k < V::kSize; ++k) v[u].set(k, fmaf(v[u].get(k), a[k], d[k]));
      v[u].store(y + row * p.N + col);
    }
  }

  // One item (stripe, row chunk) start to end: every pass's loads, then its stores. kEarly: the first pass's loads of
  // y are issued before the column factors' (so the two latencies overlap).
  template <bool kFromStats, bool kEarly = false>
  __device__ static void item_rows(Params const& p, int item) {
    const int stripe = item % p.stripes;
    const int64_t chunk = item / p.stripes, row_end = min(p.M, (chunk + 1) * p.rows_per_chunk);
    const int col = stripe * kCols + int(threadIdx.x % kLanes) * V::kSize;
    if (col >= p.N) return;
    V v[kUnroll];
    const int64_t first = first_row(p, item);
    if (kEarly) load_pass(p, item, first, v);
    float a[V::kSize], d[V::kSize];
    load_factors<kFromStats>(p, col, a, d);
    for (int64_t r = first; r < row_end; r += kPassRows) {
      if (!kEarly || r != first) load_pass(p, item, r, v);
      store_pass(p, r, row_end, col, v, a, d);
    }
  }

  template <bool kFromStats>
  __device__ static void run(Params const& p, V (&v)[kUnroll], bool preloaded) {
    for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
      const int stripe = item % p.stripes;
      const int64_t chunk = item / p.stripes, row_end = min(p.M, (chunk + 1) * p.rows_per_chunk);
      const int col = stripe * kCols + int(threadIdx.x % kLanes) * V::kSize;
      if (col >= p.N) continue;
      float a[V::kSize], d[V::kSize];
      load_factors<kFromStats>(p, col, a, d);
      for (int64_t r = first_row(p, item); r < row_end; r += kPassRows) {
        if (!preloaded) load_pass(p, item, r, v);
        preloaded = false;
        store_pass(p, r, row_end, col, v, a, d);
      }
    }
  }
};

template <class T, int kLanes, int kUnroll, int kMinBlocks = 1>
__global__ void __launch_bounds__(kThreads, kMinBlocks) stripes_kernel(Params p) {
  Vec<T> v[kUnroll];
  Stripes<T, kLanes, kUnroll>::template run<false>(p, v, false);
}

// kPrefetch: 0 none, 1 the blocks without a merge group, 2 every block (before its merge).
template <class T, int kLanes, int kUnroll, int kPrefetch>
__global__ void __launch_bounds__(kThreads) finish_kernel(Params p) {
  using S = Stripes<T, kLanes, kUnroll>;
  __shared__ double lane_s1[kThreads], lane_s2[kThreads];
  Vec<T> v[kUnroll];
  const int groups = (p.N + kMergeColumns - 1) / kMergeColumns;
  const bool prefetch = int(blockIdx.x) < p.items && (kPrefetch == 2 || (kPrefetch == 1 && int(blockIdx.x) >= groups));
  if (prefetch) S::load_pass(p, blockIdx.x, S::first_row(p, blockIdx.x), v);
  if (kPrefetch == 2 || !prefetch) merge_partials(p, lane_s1, lane_s2);
  cg::this_grid().sync();
  S::template run<true>(p, v, prefetch);
}

// grid R: one block per item.
template <class T, bool kFromStats>
__global__ void __launch_bounds__(kThreads) grid_kernel(Params p) {
  Stripes<T, 32, 8>::template item_rows<kFromStats>(p, blockIdx.x);
}

// finish split R's first launch: phase 1 alone.
__global__ void __launch_bounds__(kThreads) merge_kernel(Params p) {
  __shared__ double lane_s1[kThreads], lane_s2[kThreads];
  merge_partials(p, lane_s1, lane_s2);
}

// claim R / finish claim R: resident blocks claim items in order from *counter (zero at the start).
template <class T, bool kFinish, bool kEarly = false, int kMinBlocks = 1>
__global__ void __launch_bounds__(kThreads, kMinBlocks) claim_kernel(Params p, int* counter) {
  __shared__ int claimed[2];
  if constexpr (kFinish) {
    __shared__ double lane_s1[kThreads], lane_s2[kThreads];
    merge_partials(p, lane_s1, lane_s2);
    cg::this_grid().sync();
  }
  if (threadIdx.x == 0) claimed[0] = atomicAdd(counter, 1);
  __syncthreads();
  int item = claimed[0];
  for (int k = 1; item < p.items; ++k) {
    if (threadIdx.x == 0) claimed[k & 1] = atomicAdd(counter, 1);  // in flight while this item streams
    Stripes<T, 32, 8>::template item_rows<kFinish, kEarly>(p, item);
    __syncthreads();
    item = claimed[k & 1];
  }
}

template <auto kernel>
int resident(int sms) {
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  return per_sm * sms;
}

// The kernels' split (work_items.h): stripes x row chunks that fill max_blocks once.
void plan(Params& p, int cols, int max_blocks, int64_t row_step) {
  const gemmbn::WorkItems work = gemmbn::work_items(p.M, p.N, cols, max_blocks, row_step);
  p.stripes = work.stripes, p.rows_per_chunk = work.rows_per_chunk, p.items = int(work.items);
}

// A kernel as a type, so that a generic lambda can launch it with <<<>>>.
template <auto kKernel>
using KernelConstant = std::integral_constant<decltype(kKernel), kKernel>;

struct Candidate {
  std::string name;
  std::function<void(cudaStream_t)> launch;
  std::function<void(cudaStream_t)> prepare = nullptr;  // before the timed launch (the claim counter's reset)
};

// grid R, claim R (plain, early, early min3), finish claim R (plain, early) and finish split R for items of `rows`
// rows.
template <class T>
void add_balanced(std::vector<Candidate>& out, Params base, int sms, int rows, int* counter) {
  using S = Stripes<T, 32, 8>;
  Params p = base;
  p.stripes = (p.N + S::kCols - 1) / S::kCols, p.rows_per_chunk = rows;
  p.items = int(p.stripes * ((p.M + rows - 1) / rows));
  const int groups = (p.N + kMergeColumns - 1) / kMergeColumns;
  const std::string r = std::to_string(rows);
  out.push_back({"grid " + r + " (" + std::to_string(p.items) + " blocks)",
                 [p](cudaStream_t s) { grid_kernel<T, false><<<p.items, kThreads, 0, s>>>(p); }});
  auto reset = [counter](cudaStream_t s) { CHECK(cudaMemsetAsync(counter, 0, sizeof(int), s)); };
  // A claim_kernel variant on its resident blocks (at most one per item; the finish's at least one per merge group),
  // cooperatively where it has phase 1 and the grid barrier.
  auto add_claims = [&](auto kernel_constant, const std::string& label, bool finish) {
    constexpr auto kernel = decltype(kernel_constant)::value;
    const int blocks = std::min(resident<kernel>(sms), finish ? std::max(p.items, groups) : p.items);
    out.push_back({label + " " + r + " (" + std::to_string(blocks) + " blocks)",
                   [p, blocks, counter, finish](cudaStream_t s) {
                     if (!finish) {
                       kernel<<<blocks, kThreads, 0, s>>>(p, counter);
                       return;
                     }
                     Params q = p;
                     int* c = counter;
                     void* args[] = {&q, &c};
                     CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(blocks),
                                                       dim3(kThreads), args, 0, s));
                   },
                   reset});
  };
  add_claims(KernelConstant<&claim_kernel<T, false>>{}, "claim", false);
  add_claims(KernelConstant<&claim_kernel<T, true>>{}, "finish claim", true);
  add_claims(KernelConstant<&claim_kernel<T, false, true>>{}, "claim early", false);
  add_claims(KernelConstant<&claim_kernel<T, false, true, 3>>{}, "claim early min3", false);
  add_claims(KernelConstant<&claim_kernel<T, true, true>>{}, "finish claim early", true);
  out.push_back({"finish split " + r, [p, groups](cudaStream_t s) {
                   merge_kernel<<<groups, kThreads, 0, s>>>(p);
                   grid_kernel<T, true><<<p.items, kThreads, 0, s>>>(p);
                 }});
}

// The stripes alone, at most kMinBlocks resident blocks' registers per thread (1: the compiler's choice).
template <class T, int kLanes, int kUnroll, int kMinBlocks = 1>
void add_stripes_only(std::vector<Candidate>& out, Params base, int sms) {
  using S = Stripes<T, kLanes, kUnroll>;
  constexpr auto kernel = &stripes_kernel<T, kLanes, kUnroll, kMinBlocks>;
  Params p = base;
  const int blocks = resident<kernel>(sms);
  plan(p, S::kCols, blocks, S::kPassRows);
  out.push_back({"stripes " + std::to_string(kLanes) + "x" + std::to_string(kUnroll) +
                     (kMinBlocks > 1 ? " min" + std::to_string(kMinBlocks) : "") + " (" +
                     std::to_string(std::min(p.items, blocks)) + " blocks)",
                 [p, blocks](cudaStream_t s) { kernel<<<std::min(p.items, blocks), kThreads, 0, s>>>(p); }});
}

template <class T, int kLanes, int kUnroll>
void add_stripes(std::vector<Candidate>& out, Params base, int sms) {
  using S = Stripes<T, kLanes, kUnroll>;
  add_stripes_only<T, kLanes, kUnroll>(out, base, sms);
  auto add_finish = [&](auto kernel, const char* label) {
    Params p = base;
    const int blocks = resident<decltype(kernel)::value>(sms);
    plan(p, S::kCols, blocks, S::kPassRows);
    const int grid = std::min(blocks, std::max(p.items, (p.N + kMergeColumns - 1) / kMergeColumns));
    out.push_back({std::string(label) + " " + std::to_string(kLanes) + "x" + std::to_string(kUnroll) + " (" +
                       std::to_string(grid) + " blocks)",
                   [p, grid](cudaStream_t s) {
                     Params q = p;
                     void* args[] = {&q};
                     CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(decltype(kernel)::value),
                                                       dim3(grid), dim3(kThreads), args, 0, s));
                   }});
  };
  add_finish(KernelConstant<&finish_kernel<T, kLanes, kUnroll, 0>>{}, "finish");
  add_finish(KernelConstant<&finish_kernel<T, kLanes, kUnroll, 1>>{}, "finish+prefetch");
  add_finish(KernelConstant<&finish_kernel<T, kLanes, kUnroll, 2>>{}, "finish+prefetch all");
}

template <class T>
void measure(const char* dtype, int64_t M, int N, int iters) {
  int device = 0, sms = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t bytes = size_t(M) * N * sizeof(T), flush_bytes = size_t(256) << 20;
  const int tiles = int((M + kTileRows - 1) / kTileRows);
  void *y, *y2, *flush;
  float *columns, *partials;
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&y2, bytes));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMalloc(&columns, 4 * size_t(N) * sizeof(float)));
  CHECK(cudaMalloc(&partials, 2 * size_t(tiles) * N * sizeof(float)));
  // Values that stay finite in place over many calls: y = 0.5 bits pattern, alpha 1, delta 0, partials mean 0 M2 128.
  std::vector<T> host_y(size_t(M) * N);
  for (size_t i = 0; i < host_y.size(); ++i) host_y[i] = T(float((i * 2654435761u) % 1000) / 1000.f - 0.5f);
  CHECK(cudaMemcpy(y, host_y.data(), bytes, cudaMemcpyHostToDevice));
  std::vector<float> host_columns(4 * size_t(N), 0.f), host_partials(2 * size_t(tiles) * N, 0.f);
  std::fill(host_columns.begin(), host_columns.begin() + N, 1.f);
  std::fill(host_partials.begin() + size_t(tiles) * N, host_partials.end(), float(kTileRows));
  CHECK(cudaMemcpy(columns, host_columns.data(), host_columns.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(partials, host_partials.data(), host_partials.size() * sizeof(float), cudaMemcpyHostToDevice));
  Params base{y, M, N, columns, columns + N, partials, partials + size_t(tiles) * N, columns + 2 * N, columns + 3 * N,
              tiles, 0, 0, 0};

  std::vector<Candidate> candidates;
  candidates.push_back({"memcpy", [=](cudaStream_t s) { CHECK(cudaMemcpyAsync(y2, y, bytes, cudaMemcpyDeviceToDevice, s)); }});
  {
    const int64_t vectors = M * N / Vec<T>::kSize;
    const int blocks = int((vectors + kThreads * 4 - 1) / (kThreads * 4));
    candidates.push_back({"flat", [=](cudaStream_t s) { flat_kernel<T><<<blocks, kThreads, 0, s>>>(base); }});
  }
  add_stripes<T, 32, 8>(candidates, base, sms);
  add_stripes<T, 32, 4>(candidates, base, sms);
  add_stripes<T, 64, 8>(candidates, base, sms);
  add_stripes<T, 128, 8>(candidates, base, sms);
  add_stripes<T, 256, 4>(candidates, base, sms);
  add_stripes_only<T, 32, 8, 4>(candidates, base, sms);
  add_stripes_only<T, 64, 8, 4>(candidates, base, sms);
  int* counter = nullptr;
  CHECK(cudaMalloc(&counter, sizeof(int)));
  for (int rows : {64, 128}) add_balanced<T>(candidates, base, sms, rows, counter);

  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<std::vector<float>> times(candidates.size());
  for (int i = -3; i < iters; ++i) {  // 3 warm-up rounds
    for (size_t c = 0; c < candidates.size(); ++c) {
      CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream));
      if (candidates[c].prepare) candidates[c].prepare(stream);
      CHECK(cudaEventRecord(start, stream));
      candidates[c].launch(stream);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (i >= 0) times[c].push_back(ms);
    }
  }
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double copy_ms = median(times[0]);
  std::printf("%s  y [%lld, %d]  median of %d, interleaved, L2 flushed\n", dtype, (long long)M, N, iters);
  for (size_t c = 0; c < candidates.size(); ++c) {
    const double ms = median(times[c]);
    std::printf("  %-34s %8.1f us  %5.2f TB/s  %6.1f%% of copy\n", candidates[c].name.c_str(), ms * 1e3,
                2.0 * bytes / ms / 1e9, 100.0 * copy_ms / ms);
  }
  for (void* ptr : {y, y2, flush, static_cast<void*>(columns), static_cast<void*>(partials), static_cast<void*>(counter)}) {
    CHECK(cudaFree(ptr));
  }
  CHECK(cudaStreamDestroy(stream));
}

int main(int argc, char** argv) {
  const int64_t M = argc > 2 ? std::atoll(argv[1]) : 16384;
  const int N = argc > 2 ? std::atoi(argv[2]) : 4096;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s\n", prop.name);
  measure<float>("float32", M, N, 30);
  measure<__nv_bfloat16>("bfloat16", M, N, 30);
  return 0;
}
