// How Baton's CPU kernels split work over torch's threads: in shares handed out one at a time
// rather than one fixed range per thread.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace baton {

// `work(begin, end)` over [0, units), in shares of `share` (>= 1) units handed to torch's threads one at
// a time, each taking the next as it finishes its last, on as many threads as there are `grain`s
// of units. A static split, half the units to each of two threads, waits at the end for the
// slower one; on a machine whose cores the server's event loop and its clients share with the
// step, a thread that loses its core for a while is the common case, and the other then takes
// its shares. Which thread computes a unit changes nothing in the unit's result.
template <typename Work>
void parallel_shares(int64_t units, int64_t grain, int64_t share, const Work& work) {
  if (units <= 0) return;
  const int64_t threads =
      std::min<int64_t>(at::get_num_threads(), (units + grain - 1) / std::max<int64_t>(grain, 1));
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t begin = 0; begin < units; begin += share) {
      work(begin, std::min(units, begin + share));
    }
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t begin = next.fetch_add(share, std::memory_order_relaxed); begin < units;
         begin = next.fetch_add(share, std::memory_order_relaxed)) {
      work(begin, std::min(units, begin + share));
    }
  });
}

// How many units a share of `units` holds: a few shares a thread, so that the one a stalled
// thread holds up is small, and never fewer than `grain` units.
inline int64_t share_of(int64_t units, int64_t grain) {
  constexpr int64_t kSharesPerThread = 8;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>({1, grain, units / (threads * kSharesPerThread)});
}

}  // namespace baton
