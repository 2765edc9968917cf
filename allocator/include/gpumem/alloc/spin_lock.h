// SpinLock: a test-and-test-and-set lock for critical sections of a few dozen instructions that are
// almost never contended (a thread's own cache, one shard of the live-block table). It spins
// briefly, then yields, so a descheduled holder does not burn the waiter's time slice.
#pragma once

#include <atomic>
#include <thread>

namespace gpumem::alloc::detail {

class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (spins++ < 64) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace gpumem::alloc::detail
