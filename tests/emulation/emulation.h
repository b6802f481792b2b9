// Runs a CUDA kernel's device code on the CPU as one thread block: the block's threads are fibers (ucontext) taking
// turns on one OS thread, each running until its next __syncthreads, and a cooperative grid's sync is the block's (a
// grid of one block). Fibers rather than std::threads: a barrier of hundreds of OS threads on CI's two cores spent
// most of the emulation's time in the kernel's futex wakes (perf/NOTES.md v63). A kernel whose blocks meet only
// through atomics and flags in global memory (no grid barrier) may also run as a grid of blocks at once, a process
// each (run_grid_of_processes), over memory shared before the fork (SharedBuffers).
// For kernels whose loops are uniform across the block (every thread reaches every barrier, and every warp
// shuffle: a shuffle is an exchange between two barriers here; a barrier some threads skip by returning fails the
// run), and whose threads wait (spin) only on other blocks or on host threads, never on a thread of their own block
// past no barrier; atomics are std::atomic_ref's. tests/test_finish_emulated.py runs finish_normalize's and
// fold_eval_affine's this way, so CI, which has no GPU, still executes their indexing and arithmetic. Kernels without
// barriers may run several blocks one after another (run_block's block argument). CUDA's headers supply the vector
// and 16-bit types (their host paths); this file then turns the CUDA qualifiers into plain C++.
#pragma once

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __shared__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static  // one block runs at a time, so a static is that block's shared memory
#define __align__(n) __attribute__((aligned(n)))

namespace emulation {
struct Index { unsigned x = 0, y = 0, z = 0; };
inline thread_local Index thread_index;
inline Index block_index{}, grid_size{1, 1, 1}, block_size{1, 1, 1};

// The running block's fibers: a context and a stack each, the scheduler's context they return to at a barrier.
struct Fiber {
  ucontext_t context;
  char* stack = nullptr;
  bool ended = false;
};
inline thread_local ucontext_t scheduler;
inline thread_local Fiber* running_fiber = nullptr;
inline thread_local void (*fiber_body)(void*) = nullptr;
inline thread_local void* fiber_argument = nullptr;
inline void sync_block() { swapcontext(&running_fiber->context, &scheduler); }

constexpr size_t kFiberStack = 256 << 10;  // bytes per thread (the kernels keep a few KB); its lowest page a guard
// A stack of kFiberStack bytes, kept for the next block: blocks run one after another, thousands per test.
inline char* fiber_stack(unsigned t) {
  static thread_local std::vector<char*> stacks;
  while (stacks.size() <= t) {
    void* at = mmap(nullptr, kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED || mprotect(at, 4096, PROT_NONE) != 0) std::abort();
    stacks.push_back(static_cast<char*>(at));
  }
  return stacks[t];
}
inline void fiber_entry() {
  fiber_body(fiber_argument);
  running_fiber->ended = true;  // returns to the scheduler through uc_link
}

// Runs body() in a block of threads.x x threads.y x threads.z threads (threadIdx.x fastest) as block `block`
// (blocks run one at a time), and returns once every thread has. Each round resumes every fiber once and each runs
// to its next barrier, so a round is one interval between barriers. Rounds alternate between rising and falling
// thread order: a read that lacks its barrier then finds the writer's thread not yet run in some round, whichever
// thread writes.
template <class Body>
void run_block(Index threads, Index block, Body body) {
  block_index = block;
  block_size = threads;
  const unsigned count = threads.x * threads.y * threads.z;
  std::vector<Fiber> fibers(count);
  fiber_body = [](void* b) { (*static_cast<Body*>(b))(); };
  fiber_argument = &body;
  for (unsigned t = 0; t < count; ++t) {
    Fiber& f = fibers[t];
    f.stack = fiber_stack(t);
    if (getcontext(&f.context) != 0) std::abort();
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kFiberStack;
    f.context.uc_stack.ss_flags = 0;
    f.context.uc_link = &scheduler;
    makecontext(&f.context, fiber_entry, 0);
  }
  for (unsigned live = count, round = 0; live > 0; ++round) {
    unsigned ended = 0, waiting = 0;
    for (unsigned i = 0; i < count; ++i) {
      const unsigned t = round % 2 == 0 ? i : count - 1 - i;
      Fiber& f = fibers[t];
      if (f.ended) continue;
      thread_index = {t % threads.x, t / threads.x % threads.y, t / (threads.x * threads.y)};
      running_fiber = &f;
      swapcontext(&scheduler, &f.context);
      ++(f.ended ? ended : waiting);
    }
    if (ended != 0 && waiting != 0) {  // on a GPU a barrier some threads never reach is undefined; a bug either way
      std::printf("emulation: %u threads of block %u ended while %u waited at a barrier\n", ended, block.x, waiting);
      std::fflush(stdout);
      std::abort();
    }
    live -= ended;
  }
  running_fiber = nullptr;
}

// Runs body() in `threads` threads of block `block` (default 0), and waits for them.
template <class Body>
void run_block(int threads, Body body, unsigned block = 0) {
  run_block(Index{static_cast<unsigned>(threads), 1, 1}, Index{block, 0, 0}, body);
}

// Runs body() as `blocks` blocks of `threads` threads at once, each block a process of its own (fork) with its own
// shared memory (the statics __shared__ becomes), gridDim.x = blocks; beside() runs in this process meanwhile (start
// no thread before: fork copies only the calling one). The blocks see each other's writes only in memory shared before
// the fork (SharedBuffers). True when every block's process exited with status 0.
template <class Body, class Beside>
bool run_grid_of_processes(int threads, int blocks, Body body, Beside beside) {
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int b = 0; b < blocks; ++b) {
    const pid_t pid = fork();
    if (pid == 0) {
      grid_size = {static_cast<unsigned>(blocks), 1, 1};
      run_block(threads, body, static_cast<unsigned>(b));
      std::fflush(stdout);
      std::_Exit(0);
    }
    if (pid > 0) children.push_back(pid);
  }
  beside();
  bool ok = static_cast<int>(children.size()) == blocks;
  for (const pid_t pid : children) {
    int status = 0;
    ok &= waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// The buffers a grid of processes writes, moved for one run into an anonymous shared mapping: share() copies a buffer
// in and points its pointer there; copy_back() copies every one back to where it came from.
class SharedBuffers {
 public:
  explicit SharedBuffers(size_t bytes)
      : size_(bytes), base_(static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    if (base_ == MAP_FAILED) std::abort();
  }
  ~SharedBuffers() { munmap(base_, size_); }
  SharedBuffers(const SharedBuffers&) = delete;
  SharedBuffers& operator=(const SharedBuffers&) = delete;
  template <class U>
  void share(U*& pointer, size_t count) {
    if (pointer == nullptr) return;
    const size_t bytes = count * sizeof(U);
    if (used_ + bytes > size_) std::abort();
    char* at = base_ + used_;
    used_ += (bytes + 63) / 64 * 64;
    std::memcpy(at, pointer, bytes);
    copies_.push_back({pointer, at, bytes});
    pointer = reinterpret_cast<U*>(at);
  }
  void copy_back() const {
    for (const Copy& c : copies_) std::memcpy(c.original, c.shared, c.bytes);
  }

 private:
  struct Copy {
    void* original;
    const char* shared;
    size_t bytes;
  };
  size_t size_, used_ = 0;
  char* base_;
  std::vector<Copy> copies_;
};
}  // namespace emulation

#define threadIdx emulation::thread_index
#define blockIdx emulation::block_index
#define gridDim emulation::grid_size
#define blockDim emulation::block_size
#define __syncthreads emulation::sync_block

namespace cooperative_groups {
struct grid_group {
  void sync() const { emulation::sync_block(); }  // the grid is one block
};
inline grid_group this_grid() { return {}; }
}  // namespace cooperative_groups

// __shfl_xor_sync for a kernel that shuffles uniformly across the block (every thread, the same number of times).
template <class T>
T shuffle_xor(T v, int lane_mask) {
  static T exchange[1024];  // a value per thread of the block
  const unsigned t = emulation::thread_index.x;
  exchange[t] = v;
  emulation::sync_block();
  const T partner = exchange[(t & ~31u) | ((t % 32) ^ static_cast<unsigned>(lane_mask))];
  emulation::sync_block();  // every partner is read before the next shuffle writes
  return partner;
}
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) { return shuffle_xor(v, lane_mask); }
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int lane_mask) { return shuffle_xor(v, lane_mask); }
inline unsigned atomicMax(unsigned* address, unsigned v) {
  std::atomic_ref<unsigned> word(*address);
  unsigned old = word.load();
  while (old < v && !word.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline int atomicAdd(int* address, int v) { return std::atomic_ref<int>(*address).fetch_add(v); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }

using std::max;
using std::min;
inline float __fdividef(float a, float b) { return a / b; }
