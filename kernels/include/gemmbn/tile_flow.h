// The training forward's dataflow between the GEMM and the finish (perf/NOTES.md v33): ints in the finish's workspace,
// zeroed on the stream before the GEMM. The GEMM's statistics node counts its stored tiles per column tile (kLanes per
// tile: each lane of the storing warp counts its own stores); the finish, launched while the GEMM still runs (a
// programmatic launch the GEMM's first epilogue triggers), merges a column tile's statistics as soon as its count is
// full and normalizes a stripe of y as soon as its columns' statistics are out. So the SMs the GEMM's last partial wave
// leaves idle run the finish instead of waiting.
//
//   [kHeader]                   counters (TileFlow::Counter: the finish's claims of statistics jobs and of normalize
//                               items, and the stripes queued)
//   tiles_done[column_tiles]    kLanes x the row tiles stored, per column tile (the GEMM's node)
//   stripe_groups[stripes]      statistics groups done per finish stripe
//   stripe_queue[stripes]       finish stripes in the order their statistics completed, as index + 1 (0: not yet)
// Counts are added and queue entries written with release semantics after everything they announce; readers acquire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

#if !defined(__CUDA_ARCH__)
#include <atomic>
#include <chrono>
#include <cstdlib>
#endif

namespace gemmbn {

struct TileFlow {
  enum Counter : int { kJobClaims = 0, kStripesQueued = 1, kItemClaims = 2, kHeader = 4 };
  static constexpr int kLanes = 32;  // counts per stored tile
  static constexpr size_t ints(int column_tiles, int stripes) { return kHeader + size_t(column_tiles) + 2 * size_t(stripes); }
  static constexpr int* tiles_done(int* flow) { return flow + kHeader; }
  static constexpr int* stripe_groups(int* flow, int column_tiles) { return flow + kHeader + column_tiles; }
  static constexpr int* stripe_queue(int* flow, int column_tiles, int stripes) {
    return flow + kHeader + column_tiles + stripes;
  }
};

// Device-scope acquire load, release store and a full fence; on the host (the CPU emulation of the finish) their C++
// counterparts.
__host__ __device__ inline int flow_load_acquire(const int* p) {
#if defined(__CUDA_ARCH__)
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
__host__ __device__ inline void flow_store_release(int* p, int v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
__host__ __device__ inline void flow_add_release(int* p, int v) {
#if defined(__CUDA_ARCH__)
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
#endif
}
__host__ __device__ inline void flow_fence() {
#if defined(__CUDA_ARCH__)
  __threadfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}
// A clock in nanoseconds for the walk's waits: the GPU's global timer; on the host the steady clock.
__host__ __device__ inline uint64_t flow_clock_ns() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#endif
}

// The exit status of the CPU emulation when a wait gives up (tests/test_finish_emulated.py expects it).
constexpr int kFlowGaveUpExit = 86;

// A wait that outlasted its limit: the GEMM never stored what the walk waits for (a bug, or a GEMM that failed). The
// launch says so and traps, which fails it (and the context) with an error the caller sees, rather than hang the
// process. Out of line, and printf without arguments: the waits keep no stack frame.
__host__ __device__ __noinline__ inline void flow_gave_up() {
  printf("gemmbn: the finish's dataflow walk waited past its limit (GEMMBN_FLOW_TIMEOUT_S, default 20 s; 0: none) for "
         "a tile the GEMM never counted, and fails the launch rather than hang. GEMMBN_FINISH_DATAFLOW=0 takes the "
         "barrier walk.\n");
#if defined(__CUDA_ARCH__)
  __trap();
#else
  std::fflush(stdout);
  std::_Exit(kFlowGaveUpExit);
#endif
}

// Waits (one thread) until *p is at least `least` and returns it, acquired; gives up (flow_gave_up) after limit_ns
// nanoseconds of waiting (0: never). The clock is read only once the first look finds the count short.
__host__ __device__ inline int flow_wait_at_least(const int* p, int least, uint64_t limit_ns) {
  int v = flow_load_acquire(p);
  if (v >= least) return v;
  const uint64_t start = flow_clock_ns();
  while ((v = flow_load_acquire(p)) < least) {
    if (limit_ns != 0 && flow_clock_ns() - start > limit_ns) flow_gave_up();
#if defined(__CUDA_ARCH__)
    __nanosleep(256);
#endif
  }
  return v;
}

}  // namespace gemmbn
