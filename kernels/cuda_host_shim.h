// Host meanings for the CUDA language, so the CUDA entry files (kernels/*_cuda.cu)
// compile with the host C++ compiler and run on the CPU, grid by grid, with the
// launch configuration the cuda backend computes (ctbench/engine/cuda_emulation.py).
//
// Each block runs its threads as cooperative fibers (ucontext): a thread runs until
// it reaches a barrier (__syncthreads, or a warp shuffle, which is a barrier among
// the block's live threads here) or returns; then the next thread runs.  A barrier
// is passed when every live thread of the block has reached it, which is the CUDA
// meaning for kernels whose threads agree on their barriers.  Blocks run one after
// the other, so atomics are plain read-modify-writes and __shared__ is a static.
// Slow by design: it verifies indexing, windows and launch configurations.
#pragma once

#define CT_CUDA_EMULATION 1

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// CUDA's math functions are overloaded for float: take the std overloads, not C's double ones.
using std::fabs;
using std::floor;
using std::sqrt;
using std::ceil;
using std::fmin;
using std::fmax;
using std::isfinite;

struct ct_dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

namespace ct_emu {

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  bool done = false;
};

struct Block {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  int current = 0;
  int n_threads = 0;
  std::vector<uint64_t> lanes;  // shuffle slots, one per thread
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
};

inline Block& block() {
  static Block b;
  return b;
}

inline ct_dim3& thread_idx() { static ct_dim3 v; return v; }
inline ct_dim3& block_idx() { static ct_dim3 v; return v; }
inline ct_dim3& block_dim() { static ct_dim3 v; return v; }
inline ct_dim3& grid_dim() { static ct_dim3 v; return v; }

// The calling thread waits until every live thread of the block has arrived.
inline void barrier() {
  Block& b = block();
  swapcontext(&b.fibers[b.current].ctx, &b.scheduler);
}

inline void set_thread(int t) {
  const ct_dim3& bd = block_dim();
  ct_dim3& ti = thread_idx();
  ti.x = t % bd.x;
  ti.y = (t / bd.x) % bd.y;
  ti.z = t / (bd.x * bd.y);
}

inline void trampoline() {
  Block& b = block();
  b.body(b.arg);
  b.fibers[b.current].done = true;
  // returning resumes uc_link: the scheduler
}

// Runs body() once per thread of a grid (gx, gy, gz) x (bx, by, bz).
inline void launch(ct_dim3 grid, ct_dim3 blk, void (*body)(void*), void* arg) {
  Block& b = block();
  grid_dim() = grid;
  block_dim() = blk;
  const int n = (int)(blk.x * blk.y * blk.z);
  b.n_threads = n;
  b.body = body;
  b.arg = arg;
  b.lanes.assign(n, 0);
  if ((int)b.fibers.size() < n) b.fibers.resize(n);
  for (unsigned gz = 0; gz < grid.z; ++gz)
    for (unsigned gy = 0; gy < grid.y; ++gy)
      for (unsigned gx = 0; gx < grid.x; ++gx) {
        block_idx() = ct_dim3{gx, gy, gz};
        for (int t = 0; t < n; ++t) {
          Fiber& f = b.fibers[t];
          if (f.stack.empty()) f.stack.resize(256 * 1024);
          f.done = false;
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.data();
          f.ctx.uc_stack.ss_size = f.stack.size();
          f.ctx.uc_link = &b.scheduler;
          makecontext(&f.ctx, trampoline, 0);
        }
        for (bool live = true; live;) {  // one round: every live thread runs to its next barrier
          live = false;
          for (int t = 0; t < n; ++t) {
            if (b.fibers[t].done) continue;
            b.current = t;
            set_thread(t);
            swapcontext(&b.scheduler, &b.fibers[t].ctx);
            live = live || !b.fibers[t].done;
          }
        }
      }
}

inline int linear_thread() {
  const ct_dim3& t = thread_idx();
  const ct_dim3& d = block_dim();
  return (int)(t.x + d.x * (t.y + d.y * t.z));
}

}  // namespace ct_emu

#define threadIdx (ct_emu::thread_idx())
#define blockIdx (ct_emu::block_idx())
#define blockDim (ct_emu::block_dim())
#define gridDim (ct_emu::grid_dim())

inline void __syncthreads() { ct_emu::barrier(); }

template <typename T>
inline T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}

template <typename T>
inline T __ldg(const T* p) { return *p; }

// Lane l receives the value of lane l + offset of its warp (its own value past the warp's end).
template <typename T>
inline T __shfl_down_sync(unsigned int /*mask*/, T value, int offset, int width = 32) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 64 bits");
  ct_emu::Block& b = ct_emu::block();
  const int t = ct_emu::linear_thread();
  std::memcpy(&b.lanes[t], &value, sizeof(T));
  ct_emu::barrier();
  const int lane = t % width;
  T out = value;
  if (lane + offset < width && t + offset < b.n_threads) std::memcpy(&out, &b.lanes[t + offset], sizeof(T));
  ct_emu::barrier();  // nobody overwrites a slot before every lane has read it
  return out;
}
