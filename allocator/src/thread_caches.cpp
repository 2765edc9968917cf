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

ThreadCacheSlots::~ThreadCacheSlots() {
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

using detail::ThreadCache;

ThreadCache* CachingAllocator::Impl::create_cache_for_this_thread() {
  mutex.assert_not_held();
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
  auto tc = std::make_unique<ThreadCache>();
  ThreadCache* raw = tc.get();
  {
    std::lock_guard lock(mutex);
    thread_caches.caches.push_back(std::move(tc));
  }
  *free_slot = {thread_caches.id, raw};
  return raw;
}

void CachingAllocator::Impl::drain_cache_locked(ThreadCache& tc) {
  allocated_bytes += static_cast<std::size_t>(tc.allocated_delta);
  requested_bytes += static_cast<std::size_t>(tc.requested_delta);
  tc.allocated_delta = tc.requested_delta = 0;
  if (tc.cached_bytes == 0) return;
  for (auto& bin : tc.bins) {
    for (int i = 0; i < bin.count; ++i) {
      Block* b = bin.blocks[i];
      live.erase(*b, true);
      b->state = BlockState::free;
      b->requested_bytes = 0;
      map.insert_free_merged(b);
    }
    bin.count = 0;
  }
  tc.cached_bytes = 0;
}

void CachingAllocator::Impl::drain_own_cache_slow_locked() {
  mutex.assert_held();
  ThreadCache* tc = thread_caches.find_for_this_thread();
  if (!tc) return;
  std::lock_guard lock(tc->lock);
  drain_cache_locked(*tc);
}

void CachingAllocator::Impl::drain_all_caches_locked() {
  mutex.assert_held();
  for (auto& tc : thread_caches.caches) drain_cache_locked(*tc);
}

void CachingAllocator::Impl::retire_cache(ThreadCache* cache) {
  std::lock_guard lock(mutex);
  {
    std::lock_guard cl(cache->lock);
    drain_cache_locked(*cache);
  }
  auto& v = thread_caches.caches;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& p) { return p.get() == cache; }), v.end());
}

}  // namespace gpumem::alloc
