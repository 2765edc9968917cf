// CachingAllocator's public interface and its fast paths: a thread's cache of recently freed
// blocks (no engine lock), then best fit in the free index under the engine lock. Everything slower
// is in engine.cpp and the files engine.h lists; the data model is in block.h.
#include "gpumem/alloc/caching_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "arenas.h"
#include "cap_policy.h"
#include "engine.h"
#include "size_policy.h"
#include "step_planning.h"

namespace gpumem::alloc {

using detail::Block;
using detail::EventBatch;
using detail::GrowFailure;
using detail::Region;
using detail::ThreadCache;

const char* to_string(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::alloc: return "alloc";
    case EventKind::free_requested: return "free_requested";
    case EventKind::free_completed: return "free_completed";
    case EventKind::segment_alloc: return "segment_alloc";
    case EventKind::segment_free: return "segment_free";
    case EventKind::segment_map: return "segment_map";
    case EventKind::segment_unmap: return "segment_unmap";
    case EventKind::oom: return "oom";
    case EventKind::empty_cache: return "empty_cache";
    case EventKind::snapshot: return "snapshot";
  }
  return "unknown";
}

const char* to_string(BlockState state) noexcept {
  switch (state) {
    case BlockState::allocated: return "allocated";
    case BlockState::pending_free: return "pending_free";
    case BlockState::free: return "free";
    case BlockState::unmapped: return "unmapped";
    case BlockState::cached: return "cached";
    case BlockState::claimed: return "claimed";
  }
  return "unknown";
}

const char* describe(FreeStatus status) noexcept {
  switch (status) {
    case FreeStatus::ok: return "ok";
    case FreeStatus::null_pointer: return "free of a null pointer: nothing to do";
    case FreeStatus::double_free:
      return "double free: this pointer was already freed; free each allocation exactly once";
    case FreeStatus::interior_pointer:
      return "free of an interior pointer: the pointer lies inside an allocation but is not its start; "
             "pass the pointer that allocate() returned";
    case FreeStatus::foreign_pointer:
      return "free of a foreign pointer: this engine did not allocate it; free it with the allocator "
             "that allocated it";
  }
  return "unknown free status";
}

std::string describe(const OomInfo& oom) {
  auto mib = [](std::size_t b) { return static_cast<double>(b) / static_cast<double>(kMiB); };
  std::string cap = oom.cap_bytes == kNoLimit ? std::string("none") : fmt::format("{:.2f} MiB", mib(oom.cap_bytes));
  return fmt::format(
      "out of memory: tried to allocate {:.2f} MiB (requested {} bytes) on stream {:#x}; "
      "{:.2f} MiB allocated, {:.2f} MiB reserved ({:.2f} MiB cached free, largest free extent "
      "{:.2f} MiB); cap {}; provider free {:.2f} of {:.2f} MiB; cause: {}{}{}",
      mib(oom.rounded_bytes), oom.requested_bytes, oom.stream, mib(oom.allocated_bytes), mib(oom.reserved_bytes),
      mib(oom.cached_free_bytes), mib(oom.largest_free_extent_bytes), cap, mib(oom.provider.free_bytes),
      mib(oom.provider.total_bytes), oom.cap_reached ? "the memory cap" : to_string(oom.cause),
      oom.detail.empty() ? "" : " — ", oom.detail);
}

// ==================================================================== public interface

CachingAllocator::CachingAllocator(MemorySource& source, StreamEvents& events, Config config, int device) {
  const bool plan = config.step_plan;
  const bool layout_thread = config.step_plan_layout_thread;
  if (engines_per_device(config) > 1) {
    arenas_ = std::make_unique<detail::Arenas>(source, events, config, device);
    first_ = &arenas_->first_engine();
    if (plan) planning_ = detail::make_step_planning(*this, layout_thread);
    return;
  }
  impl_ = std::make_unique<Impl>(source, events, std::move(config), device);
  first_ = impl_.get();
  detail::register_engine(impl_->thread_caches.id, impl_.get());
  if (plan) planning_ = detail::make_step_planning(*this, layout_thread);
}

CachingAllocator::~CachingAllocator() {
  planning_.reset();
  if (arenas_) return;  // the arenas release their own
  // The bound StatsObserver (Note [Stats in place]) may outlive the engine: its hot counters go
  // back to its own lock while our lock still exists.
  impl_->sink_alone.store(nullptr, std::memory_order_relaxed);
  if (StatsObserver* sink = impl_->stats_sink.exchange(nullptr, std::memory_order_relaxed)) sink->unbind_engine();
  // After this, exiting threads no longer hand caches back to this engine.
  detail::unregister_engine(impl_->thread_caches.id);
  std::lock_guard growth(impl_->growth_mutex);
  std::lock_guard lock(impl_->mutex);
  detail::WorldStop stop(impl_->thread_caches);
  impl_->drain_all_caches_locked();
  for (Block* b : impl_->pending)
    for (EventToken t : b->uses->markers) impl_->events.release(t);
  impl_->pending.clear();
  impl_->release_all_locked();
}

std::size_t CachingAllocator::round_size(std::size_t size_bytes) const noexcept {
  if (arenas_) return arenas_->round_size(size_bytes);
  return policy::round_size(size_bytes, impl_->rules.roundup_power2_divisions, impl_->rules.any_divisions);
}

// ==================================================================== fast paths

Block* CachingAllocator::Impl::allocate_cached(ThreadCache& tc, PoolKind pool, StreamId stream, std::size_t size,
                                               std::size_t rounded, EventBatch& batch) {
  Block* b = tc.take(pool, stream, rounded, rules.split);
  if (b == nullptr) return nullptr;
  b->state = BlockState::allocated;
  b->requested_bytes = size;
  live.insert(*b, true);
  tc.allocated_delta += static_cast<std::int64_t>(b->size_bytes);
  tc.requested_delta += static_cast<std::int64_t>(size);
  b->alloc_seq = record(batch, EventKind::alloc, pool, b->addr, b->size_bytes, size, stream);
  return b;
}

bool CachingAllocator::Impl::free_cached(std::uintptr_t addr, EventBatch& batch) {
  // The block's lease is read under its shard's lock, then the cache that owns it is locked and
  // everything checked again: a drain may have spliced the lease meanwhile. A block of no lease
  // goes back to the engine (the caller), never into a cache (Note [Thread caches]).
  for (int attempt = 0; attempt < 4; ++attempt) {
    detail::Lease* l = nullptr;
    const bool candidate = live.with_shard(addr, [&](detail::LiveTable& t) {
      Block* x = t.find(addr);
      if (x == nullptr || x->state != BlockState::allocated || x->uses) return false;
      l = x->lease;  // one load: a drain (under the owner's cache lock) may clear it at any moment
      return l != nullptr;
    });
    if (!candidate) return false;
    ThreadCache& owner = *l->cache;
    std::lock_guard cl(owner.lock);
    Block* x = live.with_shard(addr, [&](detail::LiveTable& t) -> Block* {
      Block* y = t.find(addr);
      if (y == nullptr || y->state != BlockState::allocated || y->uses || y->lease != l) return nullptr;
      t.erase(*y);
      return y;
    });
    if (x == nullptr) continue;
    owner.allocated_delta -= static_cast<std::int64_t>(x->size_bytes);
    owner.requested_delta -= static_cast<std::int64_t>(x->requested_bytes);
    const PoolKind pool = x->region->pool;
    record(batch, EventKind::free_requested, pool, addr, x->size_bytes, x->requested_bytes, x->stream);
    record(batch, EventKind::free_completed, pool, addr, x->size_bytes, x->requested_bytes, x->stream);
    owner.give_back(x);
    return true;
  }
  return false;
}

bool CachingAllocator::Impl::free_to_own_cache(std::uintptr_t addr, EventBatch& batch) {
  // Note [Thread caches]: a block of no lease this thread frees becomes a returning lease: the free
  // takes no engine lock, and the memory goes back at this thread's next engine lock (a miss of its
  // leases), so a free and the next request that misses share one acquisition instead of taking
  // one each. Returning leases go back before any growth of their pool and stream too, so they
  // never make the engine grow.
  ThreadCache* tc = cache_for_this_thread(true);
  if (tc == nullptr) return false;
  std::lock_guard cl(tc->lock);
  if (tc->stash_count == 0 || tc->returning_count >= ThreadCache::kMaxReturning) return false;
  Block* x = live.with_shard(addr, [&](detail::LiveTable& t) -> Block* {
    Block* y = t.find(addr);
    if (y == nullptr || y->state != BlockState::allocated || y->uses || y->lease) return nullptr;
    t.erase(*y);
    return y;
  });
  if (x == nullptr) return false;
  tc->allocated_delta -= static_cast<std::int64_t>(x->size_bytes);
  tc->requested_delta -= static_cast<std::int64_t>(x->requested_bytes);
  const PoolKind pool = x->region->pool;
  record(batch, EventKind::free_requested, pool, addr, x->size_bytes, x->requested_bytes, x->stream);
  record(batch, EventKind::free_completed, pool, addr, x->size_bytes, x->requested_bytes, x->stream);
  detail::Lease* l = tc->adopt(x);
  l->returning = true;
  ++tc->returning_count;
  return true;
}

void CachingAllocator::Impl::free_leased_locked(Block* b, EventBatch& batch) {
  mutex.assert_held();
  ThreadCache& owner = *static_cast<detail::Lease*>(b->lease)->cache;
  std::lock_guard cl(owner.lock);
  live.erase(*b, true);
  allocated_bytes -= b->size_bytes;
  requested_bytes -= b->requested_bytes;
  const PoolKind pool = b->region->pool;
  record(batch, EventKind::free_requested, pool, b->addr, b->size_bytes, b->requested_bytes, b->stream);
  record(batch, EventKind::free_completed, pool, b->addr, b->size_bytes, b->requested_bytes, b->stream);
  owner.give_back(b);
}

// ==================================================================== allocate / free

namespace {

// The engine's allocate and free. Of internal linkage, so that the public functions inline them
// (a member of Impl would be interposable in the shared library and stay a call); Impl::allocate
// and Impl::free, which the arenas call, are the same code out of line.
[[gnu::always_inline]] inline AllocResult allocate_in(CachingAllocator::Impl& m, std::size_t size_bytes, StreamId stream);
[[gnu::always_inline]] inline FreeStatus free_in(CachingAllocator::Impl& m, void* ptr);

}  // namespace

namespace {

// allocate() once the arenas route: the calling thread's arena (moving it first if it is due), the
// engine's code inline here too. Out of line, so that the path of one engine stays as it is.
[[gnu::noinline]] AllocResult allocate_routed(detail::Arenas& arenas, std::size_t size_bytes, StreamId stream) {
  return allocate_in(arenas.engine_for_allocation(), size_bytes, stream);
}

}  // namespace

AllocResult CachingAllocator::allocate(std::size_t size_bytes, StreamId stream) {
  if (planning_) [[unlikely]]
    return allocate_planned(size_bytes, stream);
  return allocate_engine(size_bytes, stream);
}

AllocResult CachingAllocator::allocate_engine(std::size_t size_bytes, StreamId stream) {
  // With arenas, while nobody has moved (and no move is due): the first arena's engine inline, as
  // one engine's (an allocation that waits for its lock is counted there: Impl::arenas).
  if (arenas_ && arenas_->routing()) [[unlikely]]
    return allocate_routed(*arenas_, size_bytes, stream);
  return allocate_in(*first_, size_bytes, stream);
}

AllocResult CachingAllocator::Impl::allocate(std::size_t size_bytes, StreamId stream) {
  return allocate_in(*this, size_bytes, stream);
}

namespace {

AllocResult allocate_in(CachingAllocator::Impl& m, std::size_t size_bytes, StreamId stream) {
  using Impl = CachingAllocator::Impl;
  AllocResult result;
  if (size_bytes == 0) return result;
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  const bool too_large = size_bytes >= policy::kMaxRequestBytes;
  const std::size_t rounded =
      too_large ? size_bytes : policy::round_size(size_bytes, m.rules.roundup_power2_divisions, m.rules.any_divisions);
  const PoolKind pool = policy::pool_for(rounded);

  // Fast path: this thread's leases (once the engine lock has been contended; small-pool leases
  // and the one large lease a thread holds, Note [Thread caches]). No engine lock.
  ThreadCache* tc = nullptr;
  if (m.use_caches() && !too_large) {
    tc = m.cache_for_this_thread(true);
    if (tc) {
      Block* b = nullptr;
      {
        std::lock_guard cl(tc->lock);
        b = m.allocate_cached(*tc, pool, stream, size_bytes, rounded, batch);
      }
      if (b) {
        Impl::publish(m.observers_for(batch), batch);
        result.ptr = reinterpret_cast<void*>(b->addr);
        result.size_bytes = b->size_bytes;
        return result;
      }
    }
  }

  {
    auto lock = m.lock_noting_contention(true);
    if (!m.pending.empty() && m.may_wait()) m.process_pending_locked(batch);
    Block* b = nullptr;
    bool leased = false;
    // Why the request failed: made only on the paths that can fail (its text is a std::string).
    std::optional<GrowFailure> fail;
    if (too_large) {
      fail.emplace();
      fail->status = SourceStatus::out_of_memory;
      fail->detail = "requests of 1 EiB or more are refused";
    } else {
      if (tc != nullptr) {
        // The cache missed: its returning leases go back, and for a large request its large lease
        // too (the request did not fit in what is free there; the lease's allocated blocks become
        // the engine's), so the engine's best fit sees their memory. Then a new lease of free
        // memory, and the request from it. A large lease is taken only where splitting is not
        // limited (max_split_size_mb: the engine keeps its rule for blocks above the limit).
        std::lock_guard cl(tc->lock);
        m.return_leases_locked(*tc);
        if (pool == PoolKind::large && tc->large_lease != nullptr) m.splice_lease_locked(*tc, tc->large_lease);
        m.refill_stash_locked(*tc);
        if (pool == PoolKind::small) b = m.allocate_cached(*tc, pool, stream, size_bytes, rounded, batch);
        if (b == nullptr && (pool == PoolKind::small || m.rules.split.max_split_bytes == kNoLimit)) {
          if (detail::Lease* l = m.lease_locked(*tc, pool, stream, rounded)) {
            if (pool == PoolKind::large) tc->large_lease = l;
            b = m.allocate_cached(*tc, pool, stream, size_bytes, rounded, batch);
          }
        }
        leased = b != nullptr;
      }
      // Best fit in the free index; else the slow path: the recovery steps (grow, release cached
      // memory, retry), engine.cpp.
      if (!b) b = m.map.take_cached(pool, stream, rounded, m.rules.split);
      if (!b) b = m.allocate_slow_dropping_lock(lock, pool, stream, rounded, batch, fail.emplace());
    }
    if (!b) {
      result.oom = m.make_oom_locked(size_bytes, rounded, stream, pool, *fail);
      m.emit(batch, EventKind::oom, pool, 0, rounded, size_bytes, stream);
      m.maybe_check_locked();
      obs = m.observers_for(batch);
    } else {
      if (!leased) {
        b->state = BlockState::allocated;
        b->requested_bytes = size_bytes;
        m.live.insert(*b, m.use_caches());
        m.allocated_bytes += b->size_bytes;
        m.requested_bytes += size_bytes;
        b->alloc_seq = m.emit(batch, EventKind::alloc, pool, b->addr, b->size_bytes, size_bytes, stream);
      }
      result.ptr = reinterpret_cast<void*>(b->addr);
      result.size_bytes = b->size_bytes;
      m.maybe_check_locked();
      obs = m.observers_for(batch);
    }
  }
  // The provider's numbers come from a driver call: taken without the engine lock.
  if (result.oom) [[unlikely]] {
    result.oom->provider = m.source.mem_info();
    Impl::publish(obs, batch);
    // An arena out of memory: the other arenas release their cached memory, and the request is
    // tried once more (arenas.h).
    if (m.arenas != nullptr) m.arenas->retry_out_of_memory(m, size_bytes, stream, result);
    return result;
  }
  Impl::publish(obs, batch);
  return result;
}

}  // namespace

namespace {

// free() with more than one arena: the calling thread's arena first, inline here, then the others
// (a pointer belongs to exactly one). Out of line, so that the path of one engine stays as it is.
[[gnu::noinline]] FreeStatus free_routed(detail::Arenas& arenas, void* ptr) {
  CachingAllocator::Impl& own = arenas.engine_for_free();
  const FreeStatus s = free_in(own, ptr);
  return s != FreeStatus::foreign_pointer ? s : arenas.free_elsewhere(ptr, own);
}

}  // namespace

FreeStatus CachingAllocator::free(void* ptr) {
  if (planning_) [[unlikely]]
    free_planned(ptr);
  return free_engine(ptr);
}

FreeStatus CachingAllocator::free_engine(void* ptr) {
  if (arenas_ && arenas_->count() != 1) [[unlikely]]
    return free_routed(*arenas_, ptr);
  return free_in(*first_, ptr);
}

FreeStatus CachingAllocator::Impl::free(void* ptr) { return free_in(*this, ptr); }

namespace {

FreeStatus free_in(CachingAllocator::Impl& m, void* ptr) {
  using Impl = CachingAllocator::Impl;
  if (ptr == nullptr) return FreeStatus::null_pointer;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;

  // Fast path: back into the lease the block came from (whichever thread's it is), or into a lease
  // of this thread's own (its large lease, or a returning lease).
  if (m.use_caches() && (m.free_cached(addr, batch) || m.free_to_own_cache(addr, batch))) {
    Impl::publish(m.observers_for(batch), batch);
    return FreeStatus::ok;
  }

  {
    auto lock = m.lock_noting_contention();
    Block* b = m.live.find(addr, m.use_caches());
    if (b == nullptr || b->state != BlockState::allocated) return m.classify_bad_pointer_locked(addr);
    if (b->lease) {
      m.free_leased_locked(b, batch);
    } else {
      m.allocated_bytes -= b->size_bytes;
      m.requested_bytes -= b->requested_bytes;
      if (b->uses && !b->uses->streams.empty()) {
        m.emit(batch, EventKind::free_requested, b->region->pool, b->addr, b->size_bytes, b->requested_bytes, b->stream);
        // Markers are recorded (StreamEvents::record does not block) under the lock.
        for (StreamId s : b->uses->streams) b->uses->markers.push_back(m.events.record(s));
        b->state = BlockState::pending_free;
        m.pending.push_back(b);
        m.pending_bytes += b->size_bytes;
      } else {
        m.free_now_locked(b, batch);
      }
    }
    if (m.use_caches()) {
      // This thread's own cache was full (or out of Block objects): its returning leases go back
      // and its stash is topped up, so its next frees take no lock again.
      if (ThreadCache* tc = m.cache_for_this_thread(false)) {
        std::lock_guard cl(tc->lock);
        m.return_leases_locked(*tc);
        m.refill_stash_locked(*tc);
      }
    }
    m.maybe_check_locked();
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
  return FreeStatus::ok;
}

}  // namespace

FreeStatus CachingAllocator::record_stream(void* ptr, StreamId stream) {
  if (arenas_) return arenas_->record_stream(ptr, stream);
  Impl& m = *impl_;
  if (ptr == nullptr) return FreeStatus::null_pointer;
  std::lock_guard lock(m.mutex);
  Block* b = m.live.find(reinterpret_cast<std::uintptr_t>(ptr), m.use_caches());
  if (b == nullptr || b->state != BlockState::allocated)
    return m.classify_bad_pointer_locked(reinterpret_cast<std::uintptr_t>(ptr));
  if (stream == b->stream) return FreeStatus::ok;
  if (detail::Lease* l = b->lease) {
    // A leased block that other streams use becomes the engine's again (its free waits for them):
    // its cache gives all its leases back.
    std::lock_guard cl(l->cache->lock);
    m.drain_cache_locked(*l->cache);
  }
  if (!b->uses) b->uses = std::make_unique<detail::StreamUses>();
  auto& s = b->uses->streams;
  if (std::find(s.begin(), s.end(), stream) == s.end()) s.push_back(stream);
  return FreeStatus::ok;
}

void CachingAllocator::empty_cache() {
  if (arenas_) return arenas_->empty_cache();
  Impl& m = *impl_;
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  {
    std::lock_guard growth(m.growth_mutex);  // sleeps while another thread grows or releases
    Impl::Lock lock(m.mutex);
    if (!m.may_wait()) return;  // capturing: nothing may be waited for or released
    const std::size_t released = m.release_cached_dropping_lock(lock, batch);
    m.emit(batch, EventKind::empty_cache, PoolKind::large, 0, released, 0, 0);
    m.maybe_check_locked();
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
}

void CachingAllocator::set_capturing(bool capturing) {
  if (arenas_) return arenas_->set_capturing(capturing);
  // Taking growth_mutex waits for a growth or release in progress, which may be synchronizing.
  std::lock_guard growth(impl_->growth_mutex);
  std::lock_guard lock(impl_->mutex);
  impl_->capturing.store(capturing, std::memory_order_relaxed);
}

void CachingAllocator::set_holding(bool holding) {
  if (arenas_) return arenas_->set_holding(holding);
  std::lock_guard growth(impl_->growth_mutex);
  std::lock_guard lock(impl_->mutex);
  impl_->holding.store(holding, std::memory_order_relaxed);
}

bool CachingAllocator::capturing() const noexcept {
  if (arenas_) return arenas_->capturing();
  return impl_->capturing.load(std::memory_order_relaxed);
}
bool CachingAllocator::holding() const noexcept {
  if (arenas_) return arenas_->holding();
  return impl_->holding.load(std::memory_order_relaxed);
}

void CachingAllocator::set_memory_fraction(double fraction) {
  if (arenas_) return arenas_->set_memory_fraction(fraction);
  std::lock_guard lock(impl_->mutex);
  impl_->fraction = std::clamp(fraction, 0.0, 1.0);
  impl_->cap = policy::cap_bytes(impl_->fraction, impl_->limit_bytes, impl_->provider_total);
}

double CachingAllocator::memory_fraction() const {
  if (arenas_) return arenas_->memory_fraction();
  std::lock_guard lock(impl_->mutex);
  return impl_->fraction;
}

void CachingAllocator::set_memory_limit(std::size_t bytes) {
  if (arenas_) return arenas_->set_memory_limit(bytes);
  std::lock_guard lock(impl_->mutex);
  impl_->limit_bytes = bytes;
  impl_->cap = policy::cap_bytes(impl_->fraction, impl_->limit_bytes, impl_->provider_total);
}

void CachingAllocator::attach_observer(std::shared_ptr<AllocObserver> observer) {
  if (arenas_) return arenas_->attach_observer(std::move(observer));
  Impl& m = *impl_;
  // Note [Stats in place] (gpumem/alloc/stats.h): the first StatsObserver of an expandable engine
  // is bound to it (classic segments need the observer to see every event in order). Bound
  // without the engine lock (the observer takes its own lock, then may take ours).
  StatsObserver* sink = nullptr;
  if (m.rules.expandable && m.may_bind_stats.load(std::memory_order_relaxed) &&
      m.stats_sink.load(std::memory_order_relaxed) == nullptr)
    if (auto* stats = dynamic_cast<StatsObserver*>(observer.get()))
      if (stats->bind_engine([&m](const std::function<void()>& f) {
            std::lock_guard lock(m.mutex);
            f();
          }))
        sink = stats;
  {
    std::lock_guard lock(m.mutex);
    const Impl::ObserverList* now = m.observers.load(std::memory_order_relaxed);
    auto next = now ? std::make_unique<Impl::ObserverList>(*now) : std::make_unique<Impl::ObserverList>();
    next->push_back(std::move(observer));
    m.observers.store(next.get(), std::memory_order_release);
    m.observer_lists.push_back(std::move(next));
    m.has_observers.store(true, std::memory_order_relaxed);
    // Another StatsObserver attached at the same time may have been bound first: this one then
    // stays on events.
    if (sink != nullptr && m.stats_sink.load(std::memory_order_relaxed) == nullptr) {
      m.stats_sink.store(sink, std::memory_order_relaxed);
      sink = nullptr;
    }
    m.sync_sink_alone_locked();
  }
  if (sink != nullptr) sink->unbind_engine();
}

void CachingAllocator::detach_observer(const AllocObserver* observer) {
  if (arenas_) return arenas_->detach_observer(observer);
  Impl& m = *impl_;
  StatsObserver* unbind = nullptr;
  {
    std::lock_guard lock(m.mutex);
    const Impl::ObserverList* now = m.observers.load(std::memory_order_relaxed);
    auto next = std::make_unique<Impl::ObserverList>();
    if (now)
      for (const auto& o : *now)
        if (o.get() != observer) next->push_back(o);
    m.has_observers.store(!next->empty(), std::memory_order_relaxed);
    m.observers.store(next.get(), std::memory_order_release);
    m.observer_lists.push_back(std::move(next));
    if (m.stats_sink.load(std::memory_order_relaxed) == observer) {
      unbind = m.stats_sink.load(std::memory_order_relaxed);
      m.stats_sink.store(nullptr, std::memory_order_relaxed);
    }
    m.sync_sink_alone_locked();
  }
  // No call counts in place any more; the observer lists keep the observer alive.
  if (unbind != nullptr) unbind->unbind_engine();
}

namespace {

// The engine's totals (engine lock held, thread caches stopped).
EngineTotals totals_locked(const CachingAllocator::Impl& m) {
  m.mutex.assert_held();
  std::int64_t alloc_delta = 0, req_delta = 0;
  std::size_t in_caches = 0;
  for (const auto& tc : m.thread_caches.caches) {
    alloc_delta += tc->allocated_delta;
    req_delta += tc->requested_delta;
    in_caches += tc->free_bytes();
  }
  EngineTotals t;
  t.allocated_bytes = m.allocated_bytes + static_cast<std::size_t>(alloc_delta);
  t.requested_bytes = m.requested_bytes + static_cast<std::size_t>(req_delta);
  t.active_bytes = t.allocated_bytes + m.pending_bytes;
  t.reserved_bytes = m.map.reserved_bytes;
  t.cached_free_bytes = m.map.free_index[0].bytes() + m.map.free_index[1].bytes() + in_caches;
  t.thread_caches = m.use_caches() ? m.thread_caches.caches.size() : 0;
  t.thread_cached_bytes = in_caches;
  t.thread_caches_on = m.use_caches();
  t.largest_free_extent_bytes = m.largest_free_locked();
  t.va_reserved_bytes = m.map.va_bytes;
  t.cap_bytes = m.cap;
  t.segments = m.map.regions.size();
  for (const auto& [base, r] : m.map.regions) {
    t.pieces_mapped += r->expandable ? r->pieces : 1;
    t.kept_mappings += r->ghosts;
  }
  t.kept_mapping_bytes = m.map.ghost_bytes;
  return t;
}

}  // namespace

bool CachingAllocator::thread_caches_on() const noexcept {
  return arenas_ ? arenas_->thread_caches_on() : impl_->use_caches();
}

unsigned CachingAllocator::arenas() const noexcept { return arenas_ ? arenas_->count() : 1; }

std::uint64_t CachingAllocator::churn_openings() const noexcept {
  if (arenas_) return arenas_->churn_openings();
  return impl_->churn_openings.load(std::memory_order_relaxed);
}

EngineLockCounts CachingAllocator::lock_counts() const noexcept {
  if (arenas_) return arenas_->lock_counts();
  return {impl_->lock_acquisitions.load(std::memory_order_relaxed), impl_->lock_contended.load(std::memory_order_relaxed)};
}

EngineTotals CachingAllocator::totals() const {
  if (arenas_) return arenas_->totals();
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  detail::WorldStop stop(m.thread_caches);
  return totals_locked(m);
}

EngineSnapshot CachingAllocator::snapshot() {
  if (arenas_) return arenas_->snapshot();
  Impl& m = *impl_;
  EngineSnapshot snap;
  snap.device = m.device;
  snap.settings = to_string(m.config);
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  {
    // One instant: thread caches stay stopped (a fast path would change the blocks being read),
    // and views show cached blocks as the free memory they are: they are handed back first.
    std::lock_guard lock(m.mutex);
    detail::WorldStop stop(m.thread_caches);
    m.drain_all_caches_locked();
    snap.totals = totals_locked(m);
    snap.segments.reserve(m.map.regions.size());
    for (const auto& [base, rp] : m.map.regions) {
      const Region& r = *rp;
      SegmentView sv;
      sv.device = m.device;
      sv.base = r.va.base;
      sv.size_bytes = r.va.size_bytes;
      sv.mapped_bytes = r.mapped_bytes;
      sv.stream = r.stream;
      sv.pool = r.pool;
      sv.expandable = r.expandable;
      sv.created_seq = r.created_seq;
      for (const Block* b = r.first; b; b = b->next)
        sv.blocks.push_back(BlockView{b->addr, b->size_bytes, b->requested_bytes, m.view_state_locked(*b), b->alloc_seq});
      if (r.expandable)
        for (std::size_t s = 0; s < r.slots.size(); ++s)
          if (r.slots[s].mapped() && r.slots[s].first == s)
            sv.pieces.push_back(PieceView{r.slot_addr(s), r.slots[s].count * r.slot_bytes, true});
      snap.segments.push_back(std::move(sv));
    }
    m.emit(batch, EventKind::snapshot, PoolKind::large, 0, snap.totals.active_bytes, 0, 0);
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
  return snap;
}

std::optional<BlockLookup> CachingAllocator::lookup(const void* ptr) const {
  if (arenas_) return arenas_->lookup(ptr);
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  const Block* b = m.live.find(reinterpret_cast<std::uintptr_t>(ptr), m.use_caches());
  if (!b || b->state != BlockState::allocated) return std::nullopt;
  BlockLookup l;
  l.block_addr = b->addr;
  l.block_size_bytes = b->size_bytes;
  l.requested_bytes = b->requested_bytes;
  l.segment_base = b->region->va.base;
  l.segment_size_bytes = b->region->va.size_bytes;
  l.stream = b->stream;
  l.expandable = b->region->expandable;
  return l;
}

std::vector<ExpandableRegionSize> CachingAllocator::expandable_region_sizes() const {
  if (arenas_) return arenas_->expandable_region_sizes();
  const Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  std::vector<ExpandableRegionSize> out;
  for (const auto& [base, r] : m.map.regions)
    if (r->expandable) out.push_back({r->stream, r->pool == PoolKind::small, r->mapped_bytes});
  return out;
}

std::size_t CachingAllocator::largest_free_block_bytes() const {
  if (arenas_) return arenas_->largest_free_block_bytes();
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  {
    detail::WorldStop stop(m.thread_caches);
    m.drain_all_caches_locked();
  }
  return m.largest_free_locked();
}

void CachingAllocator::check_invariants() const {
  if (arenas_) return arenas_->check_invariants();
  std::lock_guard lock(impl_->mutex);
  detail::WorldStop stop(impl_->thread_caches);
  impl_->check_locked();
}

const Config& CachingAllocator::config() const noexcept { return arenas_ ? arenas_->config : impl_->config; }
MemorySource& CachingAllocator::source() noexcept { return arenas_ ? arenas_->source : impl_->source; }
int CachingAllocator::device() const noexcept { return arenas_ ? arenas_->device : impl_->device; }

}  // namespace gpumem::alloc
