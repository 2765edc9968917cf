// The engine's two locks, with their owner checked in debug builds (assert_held aborts when the
// calling thread does not hold the lock; release builds compile the check out).
//
//   GrowthMutex  a sleeping mutex that serializes the engine's slow operations: growth, release
//                (empty_cache, garbage collection, the OOM retry). Its holder drops the engine lock
//                around driver calls and stream synchronization; a thread waiting for it sleeps.
//                (jemalloc's hpa_shard_t has the same pair: grow_mtx around the slow central
//                allocator, mtx for the shard's structures.)
//   EngineMutex  the spin lock that guards the engine's structures. Held for short critical
//                sections only: never across a MemorySource call that creates, maps, unmaps,
//                destroys, reserves or releases, nor across a stream synchronization.
//
// Lock order (engine.h has the full table): GrowthMutex -> EngineMutex -> ThreadCache::lock ->
// live-table shard.
// Thread-safety: these are locks.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "gpumem/alloc/spin_lock.h"

namespace gpumem::alloc::detail {

#ifndef NDEBUG
inline constexpr bool kCheckLockOwners = true;
#else
inline constexpr bool kCheckLockOwners = false;
#endif

// A BasicLockable with its owner recorded in debug builds.
template <class Lock>
class OwnedLock {
 public:
  explicit OwnedLock(const char* name) noexcept : name_(name) {}
  OwnedLock(const OwnedLock&) = delete;
  OwnedLock& operator=(const OwnedLock&) = delete;

  void lock() {
    lock_.lock();
    if constexpr (kCheckLockOwners) owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!lock_.try_lock()) return false;
    if constexpr (kCheckLockOwners) owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }
  void unlock() {
    if constexpr (kCheckLockOwners) owner_.store(std::thread::id(), std::memory_order_relaxed);
    lock_.unlock();
  }
  // Debug builds: aborts unless the calling thread holds the lock.
  void assert_held() const noexcept {
    if constexpr (kCheckLockOwners) {
      if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id()) failed("is not held by this thread");
    }
  }
  // Debug builds: aborts if the calling thread holds the lock.
  void assert_not_held() const noexcept {
    if constexpr (kCheckLockOwners) {
      if (owner_.load(std::memory_order_relaxed) == std::this_thread::get_id()) failed("is held by this thread");
    }
  }

 private:
  [[noreturn]] void failed(const char* what) const noexcept {
    std::fprintf(stderr, "gpumem: lock discipline broken: the %s %s\n", name_, what);
    std::abort();
  }

  Lock lock_;
  const char* name_;
  std::atomic<std::thread::id> owner_{};
};

using EngineMutex = OwnedLock<SpinLock>;
using GrowthMutex = OwnedLock<std::mutex>;

}  // namespace gpumem::alloc::detail
