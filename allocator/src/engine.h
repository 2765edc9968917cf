// CachingAllocator::Impl: the caching engine of one device. It owns the structures (RegionMap,
// live-block table, pending frees, thread caches), the two locks, the observers, and the steps of
// a request; what each step does lives in a file of its own:
//
//   caching_allocator.cpp  public interface and the fast paths (thread caches, best fit)
//   engine.cpp             the slow path of a request: the retry sequence (retry_policy.h), OOM facts
//   expandable_growth.cpp  growth of an expandable region: placement, recycling, map
//   classic_growth.cpp     growth by a classic segment
//   release.cpp            empty_cache / the OOM retry's release, garbage collection, pending waits
//   thread_caches.cpp      per-thread caches: lookup, creation, draining, thread exit
//   invariants.cpp         check_invariants()
//   region_map.*           region mechanics (split, merge, carve, claim, commit); no driver calls
//   *_policy.*             every decision, as pure functions of plain values
//
// Note [Engine locking] (docs/notes/engine-locking.md has the reasoning)
//
//   Lock order: registry mutex (thread_caches.cpp) -> growth_mutex -> mutex (the engine lock) ->
//   ThreadCache::lock -> live-table shard lock -> the MemorySource's and StreamEvents' own locks.
//   The registry mutex and growth_mutex are never held together. growth_mutex may be *tried* with
//   the engine lock held (a try never waits); waiting for it happens without the engine lock.
//
//   mutex guards every structure below it. It is held for short critical sections only: never
//   across MemorySource::reserve/release/create/destroy/map/unmap/mem_info, never across
//   StreamEvents::synchronize/synchronize_stream, never while observers run. (StreamEvents::record,
//   query and release, which do not block, are called under it.)
//
//   growth_mutex serializes the slow operations (growth, release, garbage collection, the OOM
//   retry). They run as plan -> unlock -> act -> relock -> commit:
//     plan    (engine lock) ask the policy; take what the operation uses out of every shared
//             structure: target ranges and pieces to recycle or release become `claimed` blocks,
//             pending frees to wait for move to `waiting`. Nobody else can use them now.
//     act     (no engine lock; growth_mutex held) the driver calls and stream synchronizations,
//             on a work order of plain values (no engine structure is touched).
//     commit  (engine lock) record what succeeded, put back what did not (unclaim), emit events.
//             Nothing leaks: every piece created is mapped or destroyed, every claim released.
//   While the engine lock is dropped other threads allocate from and free into the free index
//   (claimed blocks are in no container and never merge), use their thread caches, take
//   snapshots, totals and invariant checks (which account for claims), and wait on growth_mutex
//   (sleeping) to grow or release; a waiter looks in the free index again before it grows.
//
//   Naming: *_locked needs the engine lock (asserted in debug builds); *_dropping_lock is called
//   with the engine lock and growth_mutex held, drops the engine lock around the act phase and
//   holds it again when it returns; *_unlocked runs without the engine lock.
//
// Thread-safety: the public CachingAllocator methods may be called from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "block.h"
#include "engine_lock.h"
#include "engine_rules.h"
#include "event_batch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/stats.h"
#include "live_table.h"
#include "region_map.h"
#include "stream_fences.h"
#include "thread_caches.h"

namespace gpumem::alloc {

namespace detail {

// Why growing failed.
struct GrowFailure {
  SourceStatus status = SourceStatus::ok;
  bool cap_reached = false;
  std::string detail;
};

std::uint64_t now_ns() noexcept;

// expandable_growth.cpp's working storage (defined there): the lists one growth builds, kept by
// the engine between growths (cleared, capacity kept), so a growth allocates no heap memory of its
// own once the lists have reached their working size.
struct GrowthScratch;
struct GrowthScratchDelete {
  void operator()(GrowthScratch* s) const noexcept;
};

}  // namespace detail

struct CachingAllocator::Impl {
  using Block = detail::Block;
  using Region = detail::Region;
  using Lock = std::unique_lock<detail::EngineMutex>;
  using ObserverList = std::vector<std::shared_ptr<AllocObserver>>;

  Impl(MemorySource& s, StreamEvents& e, Config c, int dev);
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // ---- immutable
  MemorySource& source;
  StreamEvents& events;
  const Config config;
  const int device;
  const SourceCaps caps;
  const std::size_t provider_total;  // the provider's total memory at construction (0 = unknown)
  const detail::EngineRules rules;

  // ---- locks
  detail::GrowthMutex growth_mutex{"engine's growth mutex"};
  mutable detail::EngineMutex mutex{"engine lock"};

  // ---- under mutex
  detail::RegionMap map;
  detail::ShardedLiveTable live;
  std::vector<Block*> pending;  // pending_free blocks (markers outstanding)
  std::vector<Block*> waiting;  // pending_free blocks a release waits for, engine lock dropped
  // Counters the mechanism needs (caps, OOM facts). Observers do the accounting for users.
  std::size_t allocated_bytes = 0;
  std::size_t requested_bytes = 0;
  std::size_t pending_bytes = 0;  // pending + waiting
  double fraction = 1.0;
  std::size_t limit_bytes = 0;
  std::size_t cap = kNoLimit;
  // Driver time recycling may still spend (recycle_budget_policy.h); charged at growth's commit.
  policy::RecycleBudget recycle_budget{rules.recycle_budget};
  // The churn allowance's meter (recycle_budget_policy.h); under mutex.
  policy::ChurnMeter churn;
  // churn.openings() as of the last time the guard asked the meter: written under the engine lock,
  // read without it (CachingAllocator::churn_openings(), for memory_stats).
  std::atomic<std::uint64_t> churn_openings{0};
  // Whether the churn allowance is open at now_ns (ChurnMeter::open), publishing its openings.
  bool churn_open_locked(std::int64_t now_ns) noexcept {
    const bool open = churn.open(now_ns, rules.recycle_budget);
    churn_openings.store(churn.openings(), std::memory_order_relaxed);
    return open;
  }
  std::size_t recycle_budget_bought_bytes = 0;  // created by growth the budget kept from recycling
  // The most memory in use at once (allocated + pending, with the request being grown for), seen at
  // growths: what recycling alone would have reserved at least (policy::bought_estimate).
  std::size_t in_use_high_bytes = 0;
  // recycle_wait:fence: how far the GPU is known to have got on each stream (stream_fences.h).
  detail::StreamFences fences;
  std::atomic<std::uint64_t> event_seq{0};  // AllocEvent::seq (only while recording)
  // Where seqs come from: event_seq, or the counter the arenas of a device share (arenas.h), so
  // that one device's events have one sequence whichever arena emits them.
  std::atomic<std::uint64_t>* seq_source = &event_seq;
  // With arenas (arenas.h), the physical bytes of all the device's arenas (their shared ledger);
  // null for an engine alone. Piece lengths follow the larger of it and this engine's reserved
  // bytes (piece_footprint_bytes): a new arena on a device that holds gigabytes builds in the pieces
  // one engine holding that memory would make, not in the 2 MiB pieces of its own small footprint.
  const std::atomic<std::size_t>* device_footprint = nullptr;
  std::size_t piece_footprint_bytes() const noexcept {
    const std::size_t device = device_footprint ? device_footprint->load(std::memory_order_relaxed) : 0;
    return std::max(map.reserved_bytes, device);
  }
  // Note [Engine during graph capture] (caching_allocator.h). Written with growth_mutex and the
  // engine lock held, so a reader holding either sees the current value.
  std::atomic<bool> capturing{false};  // no query, no wait, no synchronization
  std::atomic<bool> holding{false};    // no release, no recycling
  bool may_wait() const noexcept { return !capturing.load(std::memory_order_relaxed); }
  bool may_release() const noexcept {
    return !capturing.load(std::memory_order_relaxed) && !holding.load(std::memory_order_relaxed);
  }

  // Observers: copy-on-write lists, never freed before the engine (a fast path may still be
  // publishing to an older one); has_observers is the one branch taken when there are none.
  std::atomic<bool> has_observers{false};
  std::vector<std::unique_ptr<ObserverList>> observer_lists{};
  std::atomic<const ObserverList*> observers{nullptr};
  // Note [Stats in place] (gpumem/alloc/stats.h): the attached StatsObserver bound to this engine,
  // whose hot counters emit() adds to under the engine lock; null if none. Written under mutex
  // (attach / detach); the observer is kept alive by the observer lists.
  std::atomic<StatsObserver*> stats_sink{nullptr};
  // stats_sink when it is the only observer attached (a StatsObserver never sleeps and needs
  // nothing filled in), else null: new_batch's answer without walking the list. Written under
  // mutex with stats_sink and the list (sync_sink_alone_locked).
  std::atomic<StatsObserver*> sink_alone{nullptr};
  void sync_sink_alone_locked() noexcept {
    StatsObserver* const sink = stats_sink.load(std::memory_order_relaxed);
    const ObserverList* const list = observers.load(std::memory_order_relaxed);
    const bool alone = sink != nullptr && list != nullptr && list->size() == 1 && list->front().get() == sink;
    sink_alone.store(alone ? sink : nullptr, std::memory_order_relaxed);
  }
  // Whether attach_observer may bind a StatsObserver to this engine: not once the device has more
  // than one arena (arenas.h), whose events would all be applied under this engine's lock.
  std::atomic<bool> may_bind_stats{true};

  // Thread caches of recently freed blocks (thread_caches.h); `caches` under mutex.
  detail::ThreadCacheSet thread_caches;

  // ---------------------------------------------------------------- locking

  // Takes the engine lock, noting contention: in an engine alone, the first contended acquisition
  // turns thread caches on (set under the lock, so every later holder sees it and locks live-table
  // shards, and no fast path can run before that).
  // Counts the acquisitions and the contended ones (lock_counts()).
  // An arena's caches come on only when an allocation waits while its thread shares the arena and
  // has nowhere to move (Arenas::note_wait): a wait that moving will end, a free's wait (often a
  // thread handing back memory it allocated before it moved) and a wait of a thread alone in its
  // arena leave them off (docs/notes/thread-caches.md, "Caches in an arena only where they help").
  // The one branch the arenas add to the engine, on the path that waited anyway.
  [[gnu::always_inline]] Lock lock_noting_contention(bool allocating = false) {
    Lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) {
      lock.lock();
      bump(lock_contended);
      if (arenas == nullptr) {
        if (thread_caches.enabled) thread_caches.active.store(true, std::memory_order_relaxed);
      } else if (allocating) {
        note_wait_in_arenas();
      }
    }
    bump(lock_acquisitions);
    return lock;
  }
  // With arenas, the device's arenas (set when the arena is made); null for an engine alone.
  detail::Arenas* arenas = nullptr;
  // Arenas::note_wait for this engine's arenas (arenas.cpp), and thread caches on when it says
  // they help. Under the engine lock: counts and sets a flag only.
  void note_wait_in_arenas() noexcept;
  // Written under the engine lock only, read without it (lock_counts()): a load and a store, not
  // an atomic add, as FreeIndex's byte count. (A shared wrapper type for the two was tried: the
  // FreeIndex with it inlined differently, +4 instructions per 4 KiB pair.)
  static void bump(std::atomic<std::uint64_t>& n) noexcept {
    n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  std::atomic<std::uint64_t> lock_acquisitions{0};
  std::atomic<std::uint64_t> lock_contended{0};
  bool use_caches() const noexcept { return thread_caches.in_use(); }

  // ---------------------------------------------------------------- events

  // Under the engine lock: advances the engine's tick and records the event. Returns the event's
  // seq (0 when nothing is recording).
  // The hot events of a batch made for the bound StatsObserver alone are counted in place, as
  // long as it is still bound (detach may have come between new_batch and the lock); the first
  // of a call folds this thread's shard first once publishers have met (Note [Stats in place]).
  std::uint64_t emit(detail::EventBatch& batch, EventKind kind, PoolKind pool, std::uintptr_t addr,
                     std::size_t size, std::size_t requested, StreamId stream, std::uint16_t pieces = 0) {
    ++map.tick;
    if (StatsObserver* sink = in_place_sink_for(batch, kind)) [[likely]] {
      sink->count_in_place(kind, pool, size, requested);
      return 0;
    }
    return record(batch, kind, pool, addr, size, requested, stream, pieces);
  }
  // A free that completes at once: free_requested and free_completed, one after the other (two
  // ticks), counted in place together when they can be.
  void emit_free_now(detail::EventBatch& batch, PoolKind pool, std::uintptr_t addr, std::size_t size,
                     std::size_t requested, StreamId stream) {
    if (StatsObserver* sink = in_place_sink_for(batch, EventKind::free_requested)) [[likely]] {
      map.tick += 2;
      sink->count_free_in_place(pool, size, requested);
      return;
    }
    emit(batch, EventKind::free_requested, pool, addr, size, requested, stream);
    emit(batch, EventKind::free_completed, pool, addr, size, requested, stream);
  }
  // The StatsObserver that counts this hot event in place (its first in the call folds this
  // thread's shard first), or null: the event is recorded.
  StatsObserver* in_place_sink_for(detail::EventBatch& batch, EventKind kind) {
    StatsObserver* sink = batch.in_place_sink();
    if (sink == nullptr || !detail::is_hot(kind) || sink != stats_sink.load(std::memory_order_relaxed)) return nullptr;
    if (batch.take_fold_shard_first()) [[unlikely]] sink->fold_this_threads_shard();
    return sink;
  }

  // Records an event without the engine lock (thread-cache fast paths).
  std::uint64_t record(detail::EventBatch& batch, EventKind kind, PoolKind pool, std::uintptr_t addr,
                       std::size_t size, std::size_t requested, StreamId stream, std::uint16_t pieces = 0) {
    if (!batch.recording()) return 0;
    AllocEvent e;
    e.kind = kind;
    e.pool = pool;
    e.device = static_cast<std::int8_t>(device);
    e.pieces_created_or_destroyed = pieces;
    e.addr = addr;
    e.size_bytes = size;
    e.requested_bytes = requested;
    e.stream = stream;
    if (batch.needs() & kNeedsSequence) e.seq = seq_source->fetch_add(1, std::memory_order_relaxed) + 1;
    if (batch.needs() & kNeedsTimestamps) e.t_ns = detail::now_ns();
    batch.push(e);
    return e.seq;
  }

  // An empty batch for one engine call: recording if an observer is awake, with what the awake
  // ones need (one atomic load per observer; asleep ones cost nothing more).
  // When the only awake observer is the bound StatsObserver, the batch counts the engine's
  // locked hot events in place (Note [Stats in place]).
  detail::EventBatch new_batch() const noexcept {
    if (!has_observers.load(std::memory_order_relaxed)) return detail::EventBatch(false, kNeedsNothing);
    if (StatsObserver* const alone = sink_alone.load(std::memory_order_relaxed)) [[likely]]
      return detail::EventBatch(alone, alone->publishers_met());
    return new_batch_for_listed();
  }
  // new_batch with other observers than the bound StatsObserver: what the awake ones need. Out of
  // line, so that the calls with no observer or the sink alone keep a small frame.
  [[gnu::noinline]] detail::EventBatch new_batch_for_listed() const noexcept {
    StatsObserver* const sink = stats_sink.load(std::memory_order_relaxed);
    unsigned all = kSleeping;  // AND of the sleeping bits: set iff every observer sleeps
    unsigned needs = kNeedsNothing;
    bool others_awake = false;  // an awake observer besides the sink
    if (const ObserverList* list = observers.load(std::memory_order_acquire))
      for (const auto& o : *list) {
        const unsigned n = o->needs();
        all &= n;
        if (!(n & kSleeping)) {
          needs |= n;
          others_awake = others_awake || o.get() != sink;
        }
      }
    if (all & kSleeping) return detail::EventBatch(false, kNeedsNothing);
    if (sink != nullptr && !others_awake) return detail::EventBatch(sink, sink->publishers_met());
    return detail::EventBatch(true, needs);
  }

  // Returns the observers to publish to after unlocking (null if the batch is empty).
  const ObserverList* observers_for(const detail::EventBatch& batch) const {
    if (batch.empty()) return nullptr;
    return observers.load(std::memory_order_acquire);
  }

  static void publish(const ObserverList* obs, const detail::EventBatch& batch) {
    if (!obs) return;
    for (const auto& o : *obs)
      if (!o->sleeping()) o->on_events(batch.view());
  }

  // ---------------------------------------------------------------- requests (caching_allocator.cpp)

  // CachingAllocator::allocate and free of this engine (the arenas call them directly).
  AllocResult allocate(std::size_t size_bytes, StreamId stream);
  FreeStatus free(void* ptr);

  // ---------------------------------------------------------------- freeing (engine.cpp)

  // b (allocated or pending_free, in the live table) becomes free memory.
  void complete_free_locked(Block* b, detail::EventBatch& batch) {
    mutex.assert_held();
    emit(batch, EventKind::free_completed, b->region->pool, b->addr, b->size_bytes, b->requested_bytes, b->stream);
    put_freed_locked(b);
  }
  // b (allocated, in the live table, used by no other stream) becomes free memory now: the user's
  // free and its completion in one.
  void free_now_locked(Block* b, detail::EventBatch& batch) {
    mutex.assert_held();
    emit_free_now(batch, b->region->pool, b->addr, b->size_bytes, b->requested_bytes, b->stream);
    put_freed_locked(b);
  }
  // What completing a free does to the block, once its events are out.
  void put_freed_locked(Block* b) {
    live.erase(*b, use_caches());
    b->uses.reset();
    b->state = BlockState::free;
    b->requested_bytes = 0;
    map.insert_free_merged(b);
  }
  // Frees the pending blocks whose markers have all completed (queries; never waits).
  void process_pending_locked(detail::EventBatch& batch);
  // Completes the blocks of `list` whose markers have completed; the others go back to pending.
  void complete_pending_locked(std::vector<Block*>& list, detail::EventBatch& batch);

  // ---------------------------------------------------------------- the slow path (engine.cpp)

  // No cached block fits (pool, stream, rounded): takes growth_mutex (if it had to wait for it,
  // looks in the free index again), then runs the recovery steps of retry_policy.h until one
  // yields a block (free, in no container) or none does (null; `fail` says why the last growth
  // failed). growth_mutex is released on return; the engine lock is held.
  Block* allocate_slow_dropping_lock(Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded,
                                     detail::EventBatch& batch, detail::GrowFailure& fail);
  Block* grow_dropping_lock(Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded,
                            detail::EventBatch& batch, detail::GrowFailure& fail);
  // expandable_growth.cpp. over_budget_ok: recycle even when the recycle budget is spent (the
  // retry after a growth the budget kept from recycling ran out of memory). may_sync: with
  // recycle_wait:fence, move pieces not known idle and wait for their streams (the retry after a
  // growth that fences kept from recycling passed the cap or ran out of memory).
  Block* grow_expandable_dropping_lock(Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded,
                                       detail::EventBatch& batch, detail::GrowFailure& fail,
                                       bool over_budget_ok = false, bool may_sync = false);
  // Under growth_mutex (one growth at a time; a growth's retry reuses it after the first is done).
  std::unique_ptr<detail::GrowthScratch, detail::GrowthScratchDelete> growth_scratch;
  // classic_growth.cpp
  Block* grow_classic_dropping_lock(Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded,
                                    detail::EventBatch& batch, detail::GrowFailure& fail);

  // ---------------------------------------------------------------- releasing (release.cpp)

  // Releases all cached physical memory, after the frees pending now complete: every wholly free
  // piece, every wholly free classic segment, every region left without mapped memory. Returns
  // the bytes released.
  std::size_t release_cached_dropping_lock(Lock& lock, detail::EventBatch& batch);
  // garbage_collection_threshold: frees wholly free classic segments as release_policy.h orders.
  void collect_garbage_dropping_lock(Lock& lock, detail::EventBatch& batch);
  // Commit of a claimed classic segment whose memory went back: forgets it, emits segment_free.
  void drop_segment_locked(Region& r, detail::EventBatch& batch);
  // Waits (engine lock dropped) for the markers of every pending free, then completes them.
  void wait_pending_dropping_lock(Lock& lock, detail::EventBatch& batch);

  // ---------------------------------------------------------------- queries (engine.cpp)

  // Why addr is not a pointer this engine can free.
  FreeStatus classify_bad_pointer_locked(std::uintptr_t addr);
  std::size_t largest_free_locked() const;
  // The facts of a failed request (provider memory is filled in by the caller, without the lock).
  OomInfo make_oom_locked(std::size_t size, std::size_t rounded, StreamId stream, PoolKind pool,
                          const detail::GrowFailure& f);
  // The view of a block's state: cached and claimed blocks show as the memory they are.
  BlockState view_state_locked(const Block& b) const;

  // ---------------------------------------------------------------- thread caches (thread_caches.cpp)
  // Note [Thread caches] (docs/notes/thread-caches.md): once the engine lock has been contended,
  // each thread allocates from and frees into leases of free memory its cache holds.

  // This thread's cache for this engine; creates it if `create` (null if the thread's slots are
  // all taken by live engines). Engine lock not held.
  detail::ThreadCache* cache_for_this_thread(bool create) {
    if (detail::ThreadCache* tc = thread_caches.find_for_this_thread()) return tc;
    return create ? create_cache_for_this_thread() : nullptr;
  }
  detail::ThreadCache* create_cache_for_this_thread();
  // The fast paths (no engine lock). allocate_cached: a sub-block of tc's leases for the request,
  // allocated, in the live table, its event recorded; or null. free_cached: gives a block back
  // to the lease it belongs to (any thread's); false if the engine must free it (not allocated,
  // recorded on other streams, not leased).
  Block* allocate_cached(detail::ThreadCache& tc, PoolKind pool, StreamId stream, std::size_t size,
                         std::size_t rounded, detail::EventBatch& batch);
  bool free_cached(std::uintptr_t addr, detail::EventBatch& batch);
  // A block of no lease freed by this thread becomes a returning lease of its cache (no engine
  // lock), while the cache holds fewer than ThreadCache::kMaxReturning; false if the engine must
  // free it.
  bool free_to_own_cache(std::uintptr_t addr, detail::EventBatch& batch);
  // Gives every returning lease of tc back to the engine. Engine lock and tc's lock held.
  void return_leases_locked(detail::ThreadCache& tc);
  // b (allocated, in the live table) is a sub-block of a lease: gives it back to its cache (takes
  // that cache's lock). Engine lock held.
  void free_leased_locked(Block* b, detail::EventBatch& batch);
  // Keeps tc's stash between its low and high marks (engine lock and tc's lock held).
  void refill_stash_locked(detail::ThreadCache& tc);
  // Gives tc a new lease from the free index for a request of `rounded` on (pool, stream), of
  // max(rounded, ThreadCache::kLeaseSmallBytes or kLeaseLargeBytes) where a free block that large
  // fits, else (small pool only) of the request alone: the lease, or null. Never grows. Engine
  // lock and tc's lock held.
  detail::Lease* lease_locked(detail::ThreadCache& tc, PoolKind pool, StreamId stream, std::size_t rounded);
  // Puts a lease's memory back into the region's chain: its sub-blocks take the lease block's
  // place, the free ones merged into the free index. Engine lock and tc's lock held.
  void splice_lease_locked(detail::ThreadCache& tc, detail::Lease* l);
  // Returns every lease of a cache to the engine and folds its counters in (its lock held).
  void drain_cache_locked(detail::ThreadCache& tc);
  // Returns to the engine the leases of (pool, stream) of every cache that holds free memory of
  // that pool, the only ones whose memory can serve a request there; true if any was. The caches'
  // byte deltas stay with them. A WorldStop held.
  bool drain_caches_for_locked(PoolKind pool, StreamId stream);
  // Whether the free memory the caches hold of `pool` (read without their locks) adds up to at
  // least max(rounded, ThreadCache::grow_past_leased_allowance()): then a growth drains the leases first.
  bool leased_free_worth_draining_locked(PoolKind pool, std::size_t rounded) const;
  // Drains every thread's cache (a WorldStop held).
  void drain_all_caches_locked();
  // Free bytes held in thread caches (a WorldStop held, or an estimate).
  std::size_t cached_free_bytes_locked() const;
  // A thread that owned `cache` exited: drain it and keep it for another thread (takes the engine
  // lock).
  void retire_cache(detail::ThreadCache* cache);
  // The calling thread leaves this engine (an arena it moved from, arenas.h): its cache here, if
  // it has one, goes back as at its exit, so that no lease waits for allocations that now go
  // elsewhere (takes the engine lock).
  void retire_this_threads_cache();
  std::vector<Block*> splice_scratch;  // splice_lease_locked's list of free sub-blocks

  // ---------------------------------------------------------------- invariants (invariants.cpp)

  // Aborts with a description if any invariant is broken. Engine lock held, thread caches stopped.
  void check_locked() const;
  void maybe_check_locked() {
    if (rules.check_invariants) [[unlikely]] check_now_locked();
  }
  [[gnu::noinline]] void check_now_locked();

  // ---------------------------------------------------------------- teardown (engine.cpp)

  // Gives every region's memory and address space back (engine destruction; no other thread).
  void release_all_locked();
};

}  // namespace gpumem::alloc
