// Baton's own threads for its kernels' parallel loops: a loop ends when its last share is done,
// not when every thread has come by, so a thread that has lost its core to another process
// holds the loop up by at most the share it is computing, never by its time off the core.
#pragma once

#include <ATen/Parallel.h>

#include "tuning.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace baton {

namespace detail {

inline void spin_pause() {
#if defined(__SSE2__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Waits for `ready()`: spinning for `spin_us` microseconds (a loop's next job, or its last
// share, usually comes within them), then asleep on `cv` under `mutex`, so that a thread with
// nothing to do leaves its core to whatever else runs there. `sleepers` counts the threads
// asleep, for the notifying side to skip the lock when there are none.
template <typename Ready>
void spin_then_sleep(const Ready& ready, int64_t spin_us, std::mutex& mutex,
                     std::condition_variable& cv, std::atomic<int>& sleepers) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (int i = 1; !ready(); ++i) {
    spin_pause();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) {
      std::unique_lock<std::mutex> lock(mutex);
      sleepers.fetch_add(1);
      cv.wait(lock, ready);
      sleepers.fetch_sub(1);
      return;
    }
  }
}

// Wakes the threads asleep in spin_then_sleep on `cv`, after the state `ready` reads changed.
inline void wake(std::mutex& mutex, std::condition_variable& cv, std::atomic<int>& sleepers) {
  if (sleepers.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex);
    cv.notify_all();
  }
}

}  // namespace detail

// One loop at a time, its pieces [0, pieces) split into one run per thread. A thread takes the
// pieces of its own run from the front, then those of the others from the back. Each run is
// one word tagged with the loop's number (its epoch), so a thread that wakes after its loop
// has ended, even one that saw the loop's work but lost its core before taking a piece, can
// take nothing from a later loop: its claim names a loop that is no longer current.
class SharePool {
 public:
  // A run's word: the epoch in the high half, the front and back pieces in the low halves.
  static constexpr int64_t kMaxPieces = 0xffff;

  using Call = void (*)(const void* work, int64_t piece);

  static SharePool& instance() {
    // Never destroyed: its threads may still wait on it while the process exits. A forked
    // child has none of its parent's threads, so it starts a pool of its own.
    static std::atomic<SharePool*> pool{nullptr};
    SharePool* current = pool.load(std::memory_order_acquire);
    if (current == nullptr || current->owner_ != getpid()) {
      static std::mutex creating;
      std::lock_guard<std::mutex> lock(creating);
      current = pool.load(std::memory_order_acquire);
      if (current == nullptr || current->owner_ != getpid()) {
        current = new SharePool();
        pool.store(current, std::memory_order_release);
      }
    }
    return *current;
  }

  // Whether the calling thread is one of the pool's, or the caller of the loop it runs.
  static bool& inside() {
    static thread_local bool value = false;
    return value;
  }

  // Runs `call(work, piece)` for every piece on `threads` threads, the calling one among them.
  // False, with nothing run, where another loop has the pool: the caller then runs its loop
  // alone.
  bool run(int64_t pieces, int64_t threads, Call call, const void* work) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    threads = std::min<int64_t>(threads, kMaxThreads);
    grow(threads - 1);
    const uint64_t epoch = epoch_.load(std::memory_order_relaxed) + 1;
    call_.store(call, std::memory_order_relaxed);
    work_.store(work, std::memory_order_relaxed);
    threads_.store(threads, std::memory_order_relaxed);
    pieces_.store(pieces, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    for (int64_t t = 0; t < threads; ++t) {
      const uint64_t front = pieces * t / threads, back = pieces * (t + 1) / threads;
      runs_[t].word.store(epoch << 32 | front << 16 | back, std::memory_order_relaxed);
    }
    epoch_.store(epoch);  // publishes the loop; seq_cst against the sleepers' count
    detail::wake(mutex_, job_cv_, job_sleepers_);
    inside() = true;
    take_all(static_cast<uint32_t>(epoch), 0, threads, pieces, call, work);
    inside() = false;
    detail::spin_then_sleep([&] { return finished_.load() == pieces; }, tuning::kPoolSpinMicros,
                            mutex_, done_cv_, done_sleepers_);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return true;
  }

 private:
  static constexpr int64_t kMaxThreads = 256;

  struct alignas(64) Run {
    std::atomic<uint64_t> word{0};
  };

  SharePool() : owner_(getpid()), runs_(kMaxThreads) {}

  // The next piece of `run` in loop `epoch`, from its front or back; -1 once it has none left
  // or the loop is over.
  static int64_t take(Run& run, uint32_t epoch, bool from_front) {
    uint64_t word = run.word.load(std::memory_order_acquire);
    while (true) {
      const uint64_t front = word >> 16 & 0xffff, back = word & 0xffff;
      if (static_cast<uint32_t>(word >> 32) != epoch || front >= back) return -1;
      const uint64_t next = from_front ? word + (uint64_t{1} << 16) : word - 1;
      if (run.word.compare_exchange_weak(word, next, std::memory_order_acq_rel)) {
        return static_cast<int64_t>(from_front ? front : back - 1);
      }
    }
  }

  // Thread `t`'s part of loop `epoch`: its own run, then the others' from the back.
  void take_all(uint32_t epoch, int64_t t, int64_t threads, int64_t pieces, Call call,
                const void* work) {
    for (int64_t p = take(runs_[t], epoch, true); p >= 0; p = take(runs_[t], epoch, true)) {
      compute(call, work, p, pieces);
    }
    for (int64_t v = 1; v < threads; ++v) {
      Run& other = runs_[(t + v) % threads];
      for (int64_t p = take(other, epoch, false); p >= 0; p = take(other, epoch, false)) {
        compute(call, work, p, pieces);
      }
    }
  }

  // One piece, counted done at once: a thread that loses its core after it holds the loop up
  // no longer. Its error is kept for the caller to throw once the loop is over, since the
  // other threads still use the loop's state until then.
  void compute(Call call, const void* work, int64_t piece, int64_t pieces) {
    try {
      call(work, piece);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    if (finished_.fetch_add(1) + 1 == pieces) detail::wake(mutex_, done_cv_, done_sleepers_);
  }

  void grow(int64_t workers) {
    while (static_cast<int64_t>(workers_.size()) < workers) {
      const int64_t index = static_cast<int64_t>(workers_.size()) + 1;
      workers_.emplace_back([this, index] { serve(index); });
      workers_.back().detach();
    }
  }

  // A worker's life: wait for a loop, take its part, wait for the next.
  void serve(int64_t index) {
    // Named, so tools (top -H) and tests tell Baton's workers from OpenMP's.
    pthread_setname_np(pthread_self(), "baton-share");
    inside() = true;
    uint64_t seen = epoch_.load();
    while (true) {
      detail::spin_then_sleep([&] { return epoch_.load() != seen; }, tuning::kPoolSpinMicros,
                              mutex_, job_cv_, job_sleepers_);
      seen = epoch_.load(std::memory_order_acquire);
      // Read before any claim: a successful claim in loop `seen` shows these were its values.
      const Call call = call_.load(std::memory_order_relaxed);
      const void* work = work_.load(std::memory_order_relaxed);
      const int64_t threads = threads_.load(std::memory_order_relaxed);
      const int64_t pieces = pieces_.load(std::memory_order_relaxed);
      if (index < threads) {
        take_all(static_cast<uint32_t>(seen), index, threads, pieces, call, work);
      }
    }
  }

  const pid_t owner_;
  std::mutex busy_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<Call> call_{nullptr};
  std::atomic<const void*> work_{nullptr};
  std::atomic<int64_t> threads_{0};
  std::atomic<int64_t> pieces_{0};
  alignas(64) std::atomic<int64_t> finished_{0};
  std::vector<Run> runs_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable job_cv_, done_cv_;
  std::atomic<int> job_sleepers_{0}, done_sleepers_{0};
  std::exception_ptr error_;  // under mutex_ while the loop runs
};

}  // namespace baton
