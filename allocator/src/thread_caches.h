// ThreadCacheSet: one engine's thread caches (thread_cache.h says what one cache holds; Note
// [Thread caches], docs/notes/thread-caches.md, the design) and how a thread finds its own. Each
// thread keeps up to ThreadCacheSlots::kSlots (engine id -> cache) slots in thread-local storage,
// so the lookup on the fast path is a scan of a few words with no lock. A thread that exits hands
// its caches back to the engines that still exist, found in a registry of live engines by id
// (never destroyed: threads may exit after static destructors ran).
//
// Caches turn on (`active`) the first time a thread finds the engine's lock taken (an arena's: the
// first time an allocation waits there while its thread shares the arena with nowhere to move,
// arenas.h): a program that never allocates from two threads at once keeps the engine's exact
// best-fit choices.
//
// Invariants: every cache in `caches` belongs to exactly one thread's slot for this engine's id,
// until that thread exits (its slot is cleared, the cache drained and moved to `spare`, under the
// engine's lock). Caches are destroyed only with the engine: a thread freeing a block of another
// thread's lease may hold a pointer to its cache.
// Thread-safety: `caches` and `spare` change under the engine's lock; `active` is set under it and
// read without; a thread's slots are its own. Lock order: registry mutex -> engine lock -> cache
// lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpumem/alloc/caching_allocator.h"
#include "thread_cache.h"

namespace gpumem::alloc::detail {

// A thread's caches, one per engine it allocated through (up to kSlots engines at once).
struct ThreadCacheSlots {
  static constexpr int kSlots = 8;
  struct Slot {
    std::uint64_t engine_id = 0;
    ThreadCache* cache = nullptr;
  };
  Slot slots[kSlots];
  ~ThreadCacheSlots();  // hands every cache back to its engine, if that still exists
};
extern thread_local ThreadCacheSlots t_thread_cache_slots;
// Set by ~ThreadCacheSlots: a free or allocation made by a later thread-local destructor of the
// exiting thread (a cached workspace tensor, say) finds no cache and creates none, so it takes the
// engine's locked path instead of touching destroyed slots. Trivially destructible, so it stays
// readable until the thread ends.
extern thread_local bool t_thread_cache_slots_gone;

struct ThreadCacheSet {
  explicit ThreadCacheSet(bool enabled_) noexcept;

  const std::uint64_t id;  // tells this engine apart in threads' slots (never reused)
  const bool enabled;      // Config::thread_cache
  std::atomic<bool> active{false};  // set (never cleared) by lock_noting_contention, only if enabled
  std::vector<std::unique_ptr<ThreadCache>> caches;  // owned by live threads
  std::vector<std::unique_ptr<ThreadCache>> spare;   // drained, of threads that exited; reused

  // One load: `active` is set only when `enabled` (lock_noting_contention), and this is read several
  // times per allocation and free.
  bool in_use() const noexcept { return active.load(std::memory_order_relaxed); }

  // The calling thread's cache for this engine, or null. No lock.
  ThreadCache* find_for_this_thread() const noexcept {
    if (t_thread_cache_slots_gone) return nullptr;
    for (const auto& slot : t_thread_cache_slots.slots)
      if (slot.engine_id == id) return slot.cache;
    return nullptr;
  }
};

// The registry of live engines (thread exit hands caches back through it).
void register_engine(std::uint64_t id, CachingAllocator::Impl* engine);
void unregister_engine(std::uint64_t id);

// Holds every cache's lock of a set (with the engine's lock held), so that no fast path runs.
class WorldStop {
 public:
  explicit WorldStop(ThreadCacheSet& set) : set_(set) {
    for (auto& tc : set_.caches) tc->lock.lock();
  }
  ~WorldStop() {
    for (auto& tc : set_.caches) tc->lock.unlock();
  }
  WorldStop(const WorldStop&) = delete;
  WorldStop& operator=(const WorldStop&) = delete;

 private:
  ThreadCacheSet& set_;
};

}  // namespace gpumem::alloc::detail
