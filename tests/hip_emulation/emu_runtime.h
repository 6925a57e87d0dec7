// Fibers (ucontext) for the work-items of one workgroup, cooperative barriers, per-wave exchange slots.
#pragma once
#include <stdint.h>
#include <ucontext.h>
#include <functional>
#include <utility>
#include <vector>

namespace emu {
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  int tid;
  bool done;
};
inline ucontext_t g_main;
inline std::vector<Fiber> g_fibers;
inline int g_current = 0;
inline uint32_t g_block[3], g_grid[3];
inline std::function<void()> g_body;

inline Fiber& current() { return g_fibers[g_current]; }
inline void yield() { swapcontext(&g_fibers[g_current].ctx, &g_main); }

struct Barrier {
  int n, arrived = 0, gen = 0;
  explicit Barrier(int n_) : n(n_) {}
  void wait() {
    const int g = gen;
    if (++arrived == n) {
      arrived = 0;
      ++gen;
    } else {
      while (gen == g) yield();
    }
  }
};
inline Barrier g_workgroup_barrier(256);

// Exchange slots of one wave: 64 lanes x up to 40 words, and up to 256 bytes per lane for values that
// must be the same in every lane.
struct Wave {
  Barrier bar{64};
  uint32_t slot[64][40];
  uint8_t bytes[64][256];
};
inline Wave g_waves[4];

inline void trampoline() {
  g_body();
  g_fibers[g_current].done = true;
  // return to g_main via uc_link
}

// Runs `body` on `threads` fibers until all finish.
inline void run_workgroup(int threads, const std::function<void()>& body) {
  g_body = body;
  g_fibers.assign(threads, Fiber{});
  for (int t = 0; t < threads; ++t) {
    Fiber& f = g_fibers[t];
    f.tid = t;
    f.done = false;
    f.stack.resize(1 << 18);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &g_main;
    makecontext(&f.ctx, trampoline, 0);
  }
  // Fibers resume in a random order each round: a missing barrier shows up as a race.
  static uint64_t seed = 88172645463325252ull;
  std::vector<int> order(threads);
  for (int t = 0; t < threads; ++t) order[t] = t;
  for (;;) {
    bool any = false;
    for (int n = threads - 1; n > 0; --n) {
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      std::swap(order[n], order[seed % (n + 1)]);
    }
    for (int t : order) {
      if (g_fibers[t].done) continue;
      any = true;
      g_current = t;
      swapcontext(&g_main, &g_fibers[t].ctx);
    }
    if (!any) break;
  }
  if (g_workgroup_barrier.arrived != 0) __builtin_trap();  // a barrier some work-items skipped
  for (auto& w : g_waves)
    if (w.bar.arrived != 0) __builtin_trap();
}
}  // namespace emu
