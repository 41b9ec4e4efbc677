// How Baton's CPU kernels split work over torch's threads: a run of shares a thread, the
// threads that finish first taking the last shares of the others.
#pragma once

#include <ATen/Parallel.h>

#include "tuning.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace baton {

// `work(begin, end)` over [0, units) in shares of `share` (>= 1) units, on as many of torch's
// threads as there are `grain`s of units. Each thread owns a contiguous run of the shares and
// takes them in order, so its part of a weight stream is one run of memory; a thread whose
// run is done takes shares from the back of another's. A static split, half the units to each
// of two threads, waits at the end for the slower one: on a machine whose cores the server's
// event loop and its clients share with the step, a thread that loses its core for a while is
// the common case, and the other then takes its last shares. Shares handed out in turn from
// one counter kept the threads balanced too, but cut each thread's stream into pieces a share
// long, which stream slower than one run. Which thread computes a unit, and where a share
// begins, change nothing in the unit's result.
template <typename Work>
void parallel_shares(int64_t units, int64_t grain, int64_t share, const Work& work) {
  if (units <= 0) return;
  const int64_t threads =
      std::min<int64_t>(at::get_num_threads(), (units + grain - 1) / std::max<int64_t>(grain, 1));
  const int64_t shares = (units + share - 1) / share;
  const auto run = [&](int64_t s) { work(s * share, std::min(units, (s + 1) * share)); };
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t s = 0; s < shares; ++s) run(s);
    return;
  }
  // A thread's run of shares [front, back), both in one atomic word (front in the low half), so
  // that its owner, taking from the front, and another thread, taking from the back, never
  // take the same share. Each on a cache line of its own: the owner's updates stay in its core.
  struct alignas(64) Run {
    std::atomic<uint64_t> span;
  };
  std::vector<Run> runs(threads);
  for (int64_t t = 0; t < threads; ++t) {
    const uint64_t front = shares * t / threads, back = shares * (t + 1) / threads;
    runs[t].span.store(front | back << 32, std::memory_order_relaxed);
  }
  // The next share of `r` from its front (or back), or -1 once it has none left.
  const auto take = [](Run& r, bool from_front) -> int64_t {
    uint64_t span = r.span.load(std::memory_order_relaxed);
    while (true) {
      const uint64_t front = span & 0xffffffffu, back = span >> 32;
      if (front >= back) return -1;
      const uint64_t next = from_front ? (front + 1) | back << 32 : front | (back - 1) << 32;
      if (r.span.compare_exchange_weak(span, next, std::memory_order_relaxed)) {
        return static_cast<int64_t>(from_front ? front : back - 1);
      }
    }
  };
  at::parallel_for(0, threads, 1, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      for (int64_t s = take(runs[t], true); s >= 0; s = take(runs[t], true)) run(s);
    }
    for (int64_t v = 1; v < threads; ++v) {
      Run& other = runs[(t_begin + v) % threads];
      for (int64_t s = take(other, false); s >= 0; s = take(other, false)) run(s);
    }
  });
}

// How many units a share of `units` holds: tuning::kSharesPerThread shares a thread, so that
// what a stalled thread holds up when the others have done theirs is small, and never fewer
// than `grain` units.
inline int64_t share_of(int64_t units, int64_t grain) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>({1, grain, units / (threads * tuning::kSharesPerThread)});
}

}  // namespace baton
