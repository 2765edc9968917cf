#include "thread_caches.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "engine.h"

namespace gpumem::alloc::detail {

namespace {

std::uint64_t next_engine_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// Live engines by id, so that a thread that exits can hand its caches back to engines that still
// exist. Never destroyed: threads may exit after static destructors ran.
struct EngineRegistry {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, CachingAllocator::Impl*> engines;
};
EngineRegistry& registry() {
  static auto* r = new EngineRegistry();
  return *r;
}

}  // namespace

thread_local ThreadCacheSlots t_thread_cache_slots;
thread_local bool t_thread_cache_slots_gone = false;

ThreadCacheSlots::~ThreadCacheSlots() {
  t_thread_cache_slots_gone = true;
  EngineRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  for (Slot& s : slots) {
    if (s.engine_id == 0) continue;
    auto it = reg.engines.find(s.engine_id);
    if (it != reg.engines.end()) it->second->retire_cache(s.cache);
    s = Slot{};
  }
}

ThreadCacheSet::ThreadCacheSet(bool enabled_) noexcept : id(next_engine_id()), enabled(enabled_) {}

void register_engine(std::uint64_t id, CachingAllocator::Impl* engine) {
  EngineRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.engines.emplace(id, engine);
}

void unregister_engine(std::uint64_t id) {
  EngineRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.engines.erase(id);
}

}  // namespace gpumem::alloc::detail

namespace gpumem::alloc {

using detail::Lease;
using detail::ThreadCache;

ThreadCache* CachingAllocator::Impl::create_cache_for_this_thread() {
  mutex.assert_not_held();
  if (detail::t_thread_cache_slots_gone) return nullptr;  // the thread is exiting: no new cache
  detail::ThreadCacheSlots::Slot* free_slot = nullptr;
  for (auto& slot : detail::t_thread_cache_slots.slots)
    if (slot.engine_id == 0) {
      free_slot = &slot;
      break;
    }
  if (!free_slot) {
    // Reuse a slot of an engine that no longer exists.
    detail::EngineRegistry& reg = detail::registry();
    std::lock_guard lock(reg.mutex);
    for (auto& slot : detail::t_thread_cache_slots.slots)
      if (!reg.engines.count(slot.engine_id)) {
        free_slot = &slot;
        break;
      }
    if (!free_slot) return nullptr;
  }
  ThreadCache* raw = nullptr;
  {
    std::lock_guard lock(mutex);
    auto& spare = thread_caches.spare;
    if (spare.empty()) {
      thread_caches.caches.push_back(std::make_unique<ThreadCache>());
    } else {
      thread_caches.caches.push_back(std::move(spare.back()));
      spare.pop_back();
    }
    raw = thread_caches.caches.back().get();
  }
  *free_slot = {thread_caches.id, raw};
  return raw;
}

void CachingAllocator::Impl::refill_stash_locked(ThreadCache& tc) {
  mutex.assert_held();
  while (tc.stash_count < ThreadCache::kStashLow) tc.dispose_block(map.arena.make());
  while (tc.stash_count > ThreadCache::kStashHigh) map.arena.dispose(tc.make_block());
}

Lease* CachingAllocator::Impl::lease_locked(ThreadCache& tc, PoolKind pool, StreamId stream, std::size_t rounded) {
  mutex.assert_held();
  const std::size_t want =
      std::max(rounded, pool == PoolKind::small ? ThreadCache::kLeaseSmallBytes : ThreadCache::kLeaseLargeBytes);
  // A range of `want` bytes from the best fit for it. Else, small pool: the best fit for the
  // request alone; large pool: no lease (the engine serves the request itself). A large lease
  // made of less than a free 64 MiB range (the best fit for the request, split or whole) made the
  // engine recycle far more often with 4 threads and mixed sizes and was slower on the H200 than no
  // large lease at all (Note [Thread caches], "Large leases of free memory").
  Block* b = map.take_cached(pool, stream, want, rules.split);
  if (b == nullptr && pool == PoolKind::small) b = map.take_cached(pool, stream, rounded, rules.split);
  if (b == nullptr) return nullptr;
  refill_stash_locked(tc);
  return tc.adopt(b);
}

void CachingAllocator::Impl::splice_lease_locked(ThreadCache& tc, Lease* l) {
  Block* lb = l->block;
  Region& r = *lb->region;
  Block* first = l->first;
  Block* last = first;
  std::vector<Block*>& free_subs = splice_scratch;
  free_subs.clear();
  for (Block* x = first;; x = x->next) {
    x->lease = nullptr;
    if (x->state == BlockState::free) {
      tc.index_for(*x).erase(*x);
      free_subs.push_back(x);
    }
    last = x;
    if (!x->next) break;
  }
  // The sub-blocks take the lease block's place in the chain.
  first->prev = lb->prev;
  if (lb->prev) lb->prev->next = first;
  else r.first = first;
  last->next = lb->next;
  if (lb->next) lb->next->prev = last;
  tc.retire(l);
  map.arena.dispose(lb);
  // Free sub-blocks are never neighbours (they merged in the lease); each merges with free blocks
  // outside the lease's ends.
  for (Block* x : free_subs) map.insert_free_merged(x);
}

void CachingAllocator::Impl::return_leases_locked(ThreadCache& tc) {
  mutex.assert_held();
  for (Lease* l = tc.leases; l != nullptr && tc.returning_count > 0;) {
    Lease* next = l->next;
    if (l->returning) splice_lease_locked(tc, l);
    l = next;
  }
}

void CachingAllocator::Impl::drain_cache_locked(ThreadCache& tc) {
  mutex.assert_held();
  allocated_bytes += static_cast<std::size_t>(tc.allocated_delta);
  requested_bytes += static_cast<std::size_t>(tc.requested_delta);
  tc.allocated_delta = tc.requested_delta = 0;
  while (tc.leases) splice_lease_locked(tc, tc.leases);
  while (tc.stash_count > ThreadCache::kStashLow) map.arena.dispose(tc.make_block());
}

bool CachingAllocator::Impl::drain_caches_for_locked(PoolKind pool, StreamId stream) {
  mutex.assert_held();
  bool any = false;
  for (auto& tc : thread_caches.caches) {
    if (tc->index[static_cast<int>(pool)].bytes() == 0) continue;
    for (Lease* l = tc->leases; l != nullptr;) {
      Lease* next = l->next;
      if (l->block->region->pool == pool && l->block->stream == stream) {
        splice_lease_locked(*tc, l);
        any = true;
      }
      l = next;
    }
  }
  return any;
}

bool CachingAllocator::Impl::leased_free_worth_draining_locked(PoolKind pool, std::size_t rounded) const {
  mutex.assert_held();
  // Read without the caches' locks (their fast paths keep running): a hint, and only a hint is
  // needed. A drain stops every cache and takes leases away from threads that are using them, which
  // then miss and come back for the engine lock; a growth costs only what it maps.
  std::size_t leased = 0;
  for (const auto& tc : thread_caches.caches) leased += tc->index[static_cast<int>(pool)].bytes();
  const std::size_t allowance =
      ThreadCache::grow_past_leased_allowance(thread_caches.caches.size(), map.reserved_bytes);
  return leased >= std::max(rounded, allowance);
}

void CachingAllocator::Impl::drain_all_caches_locked() {
  mutex.assert_held();
  for (auto& tc : thread_caches.caches) drain_cache_locked(*tc);
}

std::size_t CachingAllocator::Impl::cached_free_bytes_locked() const {
  std::size_t n = 0;
  for (const auto& tc : thread_caches.caches) n += tc->free_bytes();
  return n;
}

void CachingAllocator::Impl::retire_this_threads_cache() {
  if (detail::t_thread_cache_slots_gone) return;
  for (auto& slot : detail::t_thread_cache_slots.slots) {
    if (slot.engine_id != thread_caches.id) continue;
    ThreadCache* cache = slot.cache;
    slot = {};  // first: this thread's fast path no longer finds the cache
    retire_cache(cache);
    return;
  }
}

void CachingAllocator::Impl::retire_cache(ThreadCache* cache) {
  std::lock_guard lock(mutex);
  {
    std::lock_guard cl(cache->lock);
    drain_cache_locked(*cache);
    while (cache->stash_count > 0) map.arena.dispose(cache->make_block());
  }
  auto& v = thread_caches.caches;
  auto it = std::find_if(v.begin(), v.end(), [&](const auto& p) { return p.get() == cache; });
  if (it == v.end()) return;
  thread_caches.spare.push_back(std::move(*it));
  v.erase(it);
}

}  // namespace gpumem::alloc
