// The engine's slow path: what happens when no cached block fits a request (the recovery steps of
// retry_policy.h), pending frees, the facts of an OOM, and teardown. Locking: engine.h.
#include <algorithm>
#include <chrono>

#include "cap_policy.h"
#include "engine.h"
#include "release_policy.h"
#include "retry_policy.h"

namespace gpumem::alloc {

namespace detail {

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace detail

using detail::EventBatch;
using detail::GrowFailure;

CachingAllocator::Impl::Impl(MemorySource& s, StreamEvents& e, Config c, int dev)
    : source(s),
      events(e),
      config(std::move(c)),
      device(dev),
      caps(s.caps()),
      provider_total(s.mem_info().total_bytes),
      rules(detail::make_engine_rules(config, caps, provider_total)),
      fraction(config.per_process_memory_fraction),
      limit_bytes(config.memory_limit_bytes),
      cap(policy::cap_bytes(fraction, limit_bytes, provider_total)),
      thread_caches(config.thread_cache) {}

void CachingAllocator::Impl::complete_pending_locked(std::vector<Block*>& list, EventBatch& batch) {
  mutex.assert_held();
  // Swap-remove in place: the order blocks complete in (and so the events) is the same as the
  // engine always had.
  for (std::size_t i = 0; i < list.size();) {
    Block* b = list[i];
    bool done = true;
    for (EventToken t : b->uses->markers)
      if (!events.query(t)) {
        done = false;
        break;
      }
    if (!done) {
      ++i;
      continue;
    }
    for (EventToken t : b->uses->markers) events.release(t);
    list[i] = list.back();
    list.pop_back();
    pending_bytes -= b->size_bytes;
    complete_free_locked(b, batch);
  }
}

void CachingAllocator::Impl::process_pending_locked(EventBatch& batch) {
  mutex.assert_held();
  complete_pending_locked(pending, batch);
}

CachingAllocator::Impl::Block* CachingAllocator::Impl::allocate_slow_dropping_lock(
    Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded, EventBatch& batch, GrowFailure& fail) {
  // Growth and release are serialized by growth_mutex. Trying it costs nothing; waiting for it
  // happens without the engine lock (lock order), and then another thread may have grown or freed
  // meanwhile: look again.
  std::unique_lock growth(growth_mutex, std::try_to_lock);
  if (!growth.owns_lock()) {
    lock.unlock();
    growth.lock();
    lock.lock();
    if (Block* b = map.take_cached(pool, stream, rounded, rules.split)) return b;
  }
  // Free memory in threads' leases of the request's pool and stream (the only ones that can serve
  // it) goes back before growing when there is enough of it to matter; otherwise only if the
  // growth fails (Note [Thread caches], "Growth and other threads' leases").
  // Takes the leases of the request's pool and stream back (every lease: `all`), then best fit again.
  bool drained = false;
  auto drain_and_take = [&](bool all) -> Block* {
    drained = true;
    detail::WorldStop stop(thread_caches);
    if (all) {
      drain_all_caches_locked();
    } else if (!drain_caches_for_locked(pool, stream)) {
      return nullptr;
    }
    return map.take_cached(pool, stream, rounded, rules.split);
  };
  if (use_caches() && leased_free_worth_draining_locked(pool, rounded))
    if (Block* b = drain_and_take(false)) return b;
  // While capturing or holding nothing is released (Note [Engine during graph capture]): the
  // release steps find nothing to do.
  const bool gc_due = may_release() &&
                      policy::should_collect_garbage(rules.garbage_collection_threshold, map.reserved_bytes, cap);
  // The garbage collector releases whole free classic segments, and a segment in a thread's lease
  // is not free to it: when it is due (memory pressure), every lease goes back first, whatever the
  // caches hold.
  if (gc_due && !rules.expandable && use_caches() && !drained)
    if (Block* b = drain_and_take(true)) return b;
  for (policy::RecoveryStep step : policy::recovery_steps(gc_due)) {
    Block* b = nullptr;
    switch (step) {
      case policy::RecoveryStep::take_cached:
        b = map.take_cached(pool, stream, rounded, rules.split);
        break;
      case policy::RecoveryStep::collect_garbage:
        collect_garbage_dropping_lock(lock, batch);
        break;
      case policy::RecoveryStep::grow:
        b = grow_dropping_lock(lock, pool, stream, rounded, batch, fail);
        if (!b && use_caches() && !drained) b = drain_and_take(false);
        break;
      case policy::RecoveryStep::release_cached:
        release_cached_dropping_lock(lock, batch);
        break;
    }
    if (b) return b;
  }
  return nullptr;
}

CachingAllocator::Impl::Block* CachingAllocator::Impl::grow_dropping_lock(Lock& lock, PoolKind pool, StreamId stream,
                                                                          std::size_t rounded, EventBatch& batch,
                                                                          GrowFailure& fail) {
  fail = {};
  return rules.expandable ? grow_expandable_dropping_lock(lock, pool, stream, rounded, batch, fail)
                          : grow_classic_dropping_lock(lock, pool, stream, rounded, batch, fail);
}

FreeStatus CachingAllocator::Impl::classify_bad_pointer_locked(std::uintptr_t addr) {
  mutex.assert_held();
  if (use_caches()) {
    // Leases hide their sub-blocks from the region's chain: put them back first (an error path).
    detail::WorldStop stop(thread_caches);
    drain_all_caches_locked();
  }
  if (live.find(addr, use_caches())) return FreeStatus::double_free;  // pending_free or cached: freed already
  const Region* r = map.region_of(addr);
  if (!r) return FreeStatus::foreign_pointer;
  for (const Block* x = r->first; x; x = x->next) {
    if (addr < x->addr || addr >= x->end()) continue;
    if (x->state == BlockState::allocated || x->state == BlockState::pending_free) return FreeStatus::interior_pointer;
    return x->addr == addr ? FreeStatus::double_free : FreeStatus::foreign_pointer;
  }
  return FreeStatus::foreign_pointer;
}

std::size_t CachingAllocator::Impl::largest_free_locked() const {
  mutex.assert_held();
  std::size_t m = 0;
  for (int pool = 0; pool < 2; ++pool)
    for (const Block& b : map.free_index[pool].blocks()) m = std::max(m, b.size_bytes);
  return m;
}

OomInfo CachingAllocator::Impl::make_oom_locked(std::size_t size, std::size_t rounded, StreamId stream, PoolKind pool,
                                                const GrowFailure& f) {
  mutex.assert_held();
  OomInfo o;
  o.requested_bytes = size;
  o.rounded_bytes = rounded;
  o.allocated_bytes = allocated_bytes;
  o.reserved_bytes = map.reserved_bytes;
  {
    detail::WorldStop stop(thread_caches);
    o.cached_free_bytes = map.free_index[0].bytes() + map.free_index[1].bytes() + cached_free_bytes_locked();
  }
  o.largest_free_extent_bytes = largest_free_locked();
  o.cap_bytes = cap;
  o.cause = f.status == SourceStatus::ok ? SourceStatus::out_of_memory : f.status;
  o.cap_reached = f.cap_reached;
  o.stream = stream;
  o.pool = pool;
  o.detail = f.detail;
  return o;
}

BlockState CachingAllocator::Impl::view_state_locked(const Block& b) const {
  switch (BlockState(b.state)) {
    case BlockState::cached:
      return BlockState::free;
    case BlockState::claimed: {
      const Region& r = *b.region;
      return !r.expandable || r.slot_mapped(r.slot_of(b.addr)) ? BlockState::free : BlockState::unmapped;
    }
    default:
      return BlockState(b.state);
  }
}

void CachingAllocator::Impl::release_all_locked() {
  fences.release_all(events);  // recycle_wait:fence's outstanding markers
  // Kept mappings first: a piece is destroyed only once no mapping of it is left.
  for (const auto& [handle, list] : map.ghosts)
    for (const auto& g : list) source.unmap(g.region->slot_addr(g.first), g.count * g.region->slot_bytes);
  map.ghosts.clear();
  map.ghost_bytes = 0;
  map.ghost_ages.clear();
  map.ghost_count = 0;
  for (const auto& [marker, refs] : map.marker_refs) events.release(marker);
  map.marker_refs.clear();
  for (auto& [base, rp] : map.regions) {
    rp->ghosts = 0;
    Region& r = *rp;
    if (r.unmapped.size()) r.unmapped.clear();
    for (std::size_t s = 0; s < r.slots.size(); ++s) {
      if (!r.slots[s].mapped() || r.slots[s].first != s) continue;
      const std::size_t sz = r.expandable ? r.slots[s].count * r.slot_bytes : r.va.size_bytes;
      source.unmap(r.slot_addr(s), sz);
      source.destroy(r.slots[s].handle);
    }
    source.release(r.va);
  }
  for (int pool = 0; pool < 2; ++pool) map.free_index[pool].blocks().clear();
  live.clear_unlocked();
  for (auto& [base, rp] : map.regions) {
    for (Block* b = rp->first; b;) {
      Block* n = b->next;
      map.arena.dispose(b);
      b = n;
    }
  }
  map.regions.clear();
}

}  // namespace gpumem::alloc
