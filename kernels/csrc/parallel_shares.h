// How Baton's CPU kernels split work over their threads: a run of shares a thread, the
// threads that finish first taking the last shares of the others.
#pragma once

#include <ATen/Parallel.h>

#include "share_pool.h"
#include "tuning.h"

#include <algorithm>
#include <cstdint>

namespace baton {

// `work(begin, end)` over [0, units) in shares of `share` (>= 1) units, on as many threads as
// there are `grain`s of units (at most torch's thread count), on Baton's own pool
// (share_pool.h). Each thread owns a contiguous run of the shares and takes them in order, so
// its part of a weight stream is one run of memory; a thread whose run is done takes shares
// from the back of another's. A static split, half the units to each of two threads, waits at
// the end for the slower one: on a machine whose cores the server's event loop, its clients and
// other processes share with the step, a thread that loses its core for a while is the common
// case, and the others then take its shares; the loop ends with its last share, so the lost
// thread holds it up by the share in its hands at most. Shares handed out in turn from one
// counter kept the threads balanced too, but cut each thread's stream into pieces a share
// long, which stream slower than one run. Which thread computes a unit, and where a share
// begins, change nothing in the unit's result.
template <typename Work>
void parallel_shares(int64_t units, int64_t grain, int64_t share, const Work& work) {
  if (units <= 0) return;
  const int64_t threads =
      std::min<int64_t>(at::get_num_threads(), (units + grain - 1) / std::max<int64_t>(grain, 1));
  const int64_t shares = (units + share - 1) / share;
  struct Loop {
    const Work& work;
    int64_t units, share, shares, per_piece;
    void shares_from(int64_t first, int64_t end) const {
      for (int64_t s = first; s < std::min(shares, end); ++s) {
        work(s * share, std::min(units, (s + 1) * share));
      }
    }
  };
  // A piece is one or more whole shares, as many as the pool's runs can number.
  const int64_t per_piece = (shares + SharePool::kMaxPieces - 1) / SharePool::kMaxPieces;
  const Loop loop{work, units, share, shares, per_piece};
  if (threads <= 1 || at::in_parallel_region() || SharePool::inside()) {
    loop.shares_from(0, shares);
    return;
  }
  const auto call = [](const void* state, int64_t piece) {
    const Loop& l = *static_cast<const Loop*>(state);
    l.shares_from(piece * l.per_piece, (piece + 1) * l.per_piece);
  };
  const int64_t pieces = (shares + per_piece - 1) / per_piece;
  if (!SharePool::instance().run(pieces, threads, call, &loop)) loop.shares_from(0, shares);
}

// How many units a share of `units` holds: tuning::kSharesPerThread shares a thread, so that
// what a stalled thread holds up when the others have done theirs is small, and never fewer
// than `grain` units.
inline int64_t share_of(int64_t units, int64_t grain) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>({1, grain, units / (threads * tuning::kSharesPerThread)});
}

// `work(begin, end)` over [0, rows) of rows computed each on its own, at least `grain` rows a
// thread: parallel_shares with shares of share_of's size.
template <typename Work>
void parallel_rows(int64_t rows, int64_t grain, const Work& work) {
  parallel_shares(rows, grain, share_of(rows, grain), work);
}

}  // namespace baton
