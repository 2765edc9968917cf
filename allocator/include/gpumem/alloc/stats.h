// StatsObserver: PyTorch's DeviceStats (torch.cuda.memory_stats()) computed from the engine's
// event stream, one observer per device engine.
//
// Stat has PyTorch's semantics (c10/core/Allocator.h): increase(a) adds a to current and allocated
// and raises peak to current; decrease(a) subtracts a from current and adds it to freed.
// reset_accumulated() zeroes allocated and freed; reset_peak() sets peak = current. Every StatArray
// holds [all, small_pool, large_pool]; an event of pool p updates [all] and [p].
//
// Events -> stats (PyTorch's native allocator updates the same numbers at the same points):
//   alloc           allocation +1, allocated_bytes +size, active +1, active_bytes +size,
//                   requested_bytes +requested; oversize_allocations +1 if size >= max_split_size
//   free_requested  allocation -1, allocated_bytes -size; oversize_allocations -1 if oversize
//   free_completed  active -1, active_bytes -size, requested_bytes -requested. (PyTorch lowers
//                   requested_bytes when the block is really free, in free_block(), not when the
//                   user frees it: requested_bytes follows active blocks.) So the engine must put
//                   the block's size and request on free_completed as it did on alloc.
//   segment_alloc   segment +1, reserved_bytes +size, num_device_alloc +1,
//                   oversize_segments +1 if size >= max_split_size
//   segment_free    segment -1, reserved_bytes -size, num_device_free +1, oversize_segments -1
//   segment_map     reserved_bytes +size, num_device_alloc +1 (the segment count is unchanged,
//                   as in PyTorch: an expandable region is not a cudaMalloc segment)
//   segment_unmap   reserved_bytes -size, num_device_free +1
//   oom             num_ooms +1
//   empty_cache     num_sync_all_streams +1 (PyTorch's emptyCache synchronizes every event)
// gpumem's own counters: segment_map/segment_unmap events, and the physical pieces they created
// and destroyed (AllocEvent::pieces_created_or_destroyed), i.e. the source's create and destroy
// (cuMemCreate / cuMemRelease) calls.
//
// inactive_split / inactive_split_bytes (free blocks inside split classic segments; expandable
// regions are excluded, as in PyTorch) are not in any single event. The observer derives them
// exactly from addresses: it keeps, per classic segment (from segment_alloc), the active blocks
// (alloc .. free_completed) in address order; the segment's free blocks are the gaps between
// them, because the engine coalesces adjacent free blocks. A segment with no active block is one
// unsplit free block and counts nothing. This costs an ordered-map update per alloc and
// free_completed in classic segments only (expandable mode pays one branch), and can be turned
// off (StatsObserverOptions::track_inactive_split), in which case both stats stay 0. It needs
// the observer attached before the first segment is created.
//
// Not derivable from events, so the caller adds them: num_alloc_retries (the engine's "free
// cached memory and retry" path has no event; add_alloc_retries) and the synchronizations other
// than empty_cache (add_sync_all_streams).
//
// Ordering: events of one engine call arrive as one batch, in order; batches of different threads
// may arrive out of seq order. current values and accumulated totals are exact either way; a
// peak is exact when batches arrive in seq order and otherwise can differ from the engine's true
// peak by the net size of the batches that were in flight at once (one per thread).
//
// Per-thread shards (Note [Stats shards]). Until two threads meet in on_events, every batch is
// applied at once under the observer's lock, and every number is exact as above. From the first
// time a thread finds that lock taken, the batches of alloc/free_requested/free_completed events
// (the engine's fast paths; unless inactive_split is being tracked, i.e. classic segments exist)
// go into the calling thread's shard: net changes, sums of increases and decreases, and the
// highest prefix of each net change, with no shared write. A shard is folded into the totals
// (peak = max(peak, current + highest prefix)) every kFoldBatches batches or once its
// allocated_bytes rose by kFoldBytes more than its largest batch allocated, when the lock is free
// (after 8 x kFoldBatches, waiting for it), and always before anything reads or resets the
// totals. So every read sees exact current values and accumulated totals; a peak can miss what
// other threads held unfolded at the moment of the peak: per thread, less than kFoldBytes plus
// twice its largest batch since its last fold when its last try found the lock free, and at most
// 8 x kFoldBatches batches.
//
// Counting in place (Note [Stats in place], docs/notes/stats-shards.md). A CachingAllocator in
// expandable mode binds the StatsObserver attached to it first (bind_engine): from then on the
// counters of alloc / free_requested / free_completed (HotStats) are guarded by that engine's lock
// instead of the observer's, and the engine adds its locked paths' hot events to them in place,
// under its lock (count_in_place), without building an AllocEvent or calling on_events, as long as
// no other observer of the engine is awake. Everything else still arrives as events: segment and
// OOM events, and the hot events of the engine's lock-free paths (thread caches) and of other
// engines (private pools), applied in order under the observer's lock and the engine's lock
// (run_locked) until publishers have met, then through the threads' shards (or, while classic
// segments are tracked, still in order under both locks). Every number stays exact while the
// observer's lock is not contended; once it has been, the shard bounds above apply, and the first
// event a call counts in place folds the calling thread's shard first, so that each thread's
// changes reach the counters in its own order (fold_this_threads_shard).
//
// Thread-safety: all members may be called concurrently. Lock order: the observer's lock -> the
// bound engine's lock (run_locked) -> a shard's lock (a shard's lock alone is taken by its thread
// for each batch). The bound engine never takes the observer's lock while it holds its own.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "gpumem/alloc/spin_lock.h"
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/alloc/config.h"
#include "gpumem/alloc/events.h"

namespace gpumem::alloc {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // sum of increases since the last reset_accumulated()
  std::int64_t freed = 0;      // sum of decreases since the last reset_accumulated()

  void increase(std::uint64_t amount) noexcept {
    current += static_cast<std::int64_t>(amount);
    if (current > peak) peak = current;
    allocated += static_cast<std::int64_t>(amount);
  }
  void decrease(std::uint64_t amount) noexcept {
    current -= static_cast<std::int64_t>(amount);
    freed += static_cast<std::int64_t>(amount);
  }
  void reset_accumulated() noexcept { allocated = freed = 0; }
  void reset_peak() noexcept { peak = current; }
  friend bool operator==(const Stat&, const Stat&) = default;
};

enum class StatType : std::uint8_t { all = 0, small_pool = 1, large_pool = 2 };
inline constexpr std::size_t kNumStatTypes = 3;
using StatArray = std::array<Stat, kNumStatTypes>;

inline constexpr StatType stat_type_of(PoolKind pool) noexcept {
  return pool == PoolKind::small ? StatType::small_pool : StatType::large_pool;
}

// A copy of the stats at one moment (PyTorch's DeviceStats plus gpumem's counters).
struct DeviceStatsView {
  StatArray allocation{};            // live user allocations
  StatArray segment{};               // classic segments
  StatArray active{};                // allocated blocks + blocks waiting for other streams
  StatArray inactive_split{};        // free blocks inside split classic segments
  StatArray allocated_bytes{};       // rounded sizes of live allocations
  StatArray reserved_bytes{};        // classic segments + mapped expandable memory
  StatArray active_bytes{};
  StatArray inactive_split_bytes{};
  StatArray requested_bytes{};       // the users' requests of active blocks
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  Stat oversize_allocations{};       // live allocations >= max_split_size
  Stat oversize_segments{};          // classic segments >= max_split_size
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;  // segment_alloc + segment_map events
  std::int64_t num_device_free = 0;   // segment_free + segment_unmap events
  std::int64_t max_split_size = -1;   // the configured value in bytes; -1 = unlimited

  // ---- gpumem's own (not in PyTorch's memory_stats) ----
  std::int64_t num_segment_maps = 0;      // segment_map events (each maps one or more pieces)
  std::int64_t num_segment_unmaps = 0;    // segment_unmap events
  std::int64_t num_pieces_created = 0;    // physical pieces created (source create calls)
  std::int64_t num_pieces_destroyed = 0;  // physical pieces destroyed (source destroy calls)
  std::int64_t num_empty_cache = 0;       // empty_cache events
  std::int64_t num_events = 0;            // events seen
  // Events that contradict the tracked layout (an alloc overlapping an active block, a
  // free_completed of an unknown block, a segment_free with active blocks): 0 when the engine
  // and the observer agree. Counted, never fatal.
  std::int64_t num_inconsistent_events = 0;
  // Recycling's waits: stream synchronizations growth made before moving pieces (the whole queue
  // drains), waits for one marker of a kept mapping in the way (recycle_wait:fence: only the work
  // before it), and the free pieces growth passed over because fences did not yet show their memory
  // idle on the GPU (recycle_wait:fence). Counted by the engine the observer is bound to (Note
  // [Stats in place]); 0 from an unbound observer.
  std::int64_t num_recycle_syncs = 0;
  std::int64_t num_recycle_marker_waits = 0;
  std::int64_t num_recycle_fence_skips = 0;

  friend bool operator==(const DeviceStatsView&, const DeviceStatsView&) = default;
};

struct StatsObserverOptions {
  std::size_t max_split_size_bytes = kNoLimit;  // for the oversize stats and max_split_size
  bool track_inactive_split = true;             // see the note on inactive_split above
};

class SplitSegmentTracker;  // allocator/src/split_segment_tracker.h
namespace detail {
struct StatsShard;

// The stats the engine's fast paths change (alloc, free_requested, free_completed): guarded by the
// bound engine's lock while the observer is bound, else by the observer's lock.
struct HotStats {
  StatArray allocation{};
  StatArray allocated_bytes{};
  StatArray active{};
  StatArray active_bytes{};
  StatArray requested_bytes{};
  Stat oversize_allocations{};
  std::int64_t num_events = 0;
  // Recycling's waits (count_recycle_waits): not events, so only a bound engine counts them.
  std::int64_t num_recycle_syncs = 0;
  std::int64_t num_recycle_marker_waits = 0;
  std::int64_t num_recycle_fence_skips = 0;
};

// An event of a pool changes [all] and [pool] (Stat arrays, and the shards' arrays alike).
// Always inlined: as calls they were a third of the observer's instructions per event.
template <class Array>
[[gnu::always_inline]] inline void increase_pool(Array& stats, std::size_t pool_index, std::uint64_t amount) noexcept {
  stats[static_cast<std::size_t>(StatType::all)].increase(amount);
  stats[pool_index].increase(amount);
}
template <class Array>
[[gnu::always_inline]] inline void decrease_pool(Array& stats, std::size_t pool_index, std::uint64_t amount) noexcept {
  stats[static_cast<std::size_t>(StatType::all)].decrease(amount);
  stats[pool_index].decrease(amount);
}

inline constexpr bool is_hot(EventKind kind) noexcept {
  return kind == EventKind::alloc || kind == EventKind::free_requested || kind == EventKind::free_completed;
}

// The three hot events applied to the stats they change: one definition for the observer's
// counters (Target = HotStats, Stat) and a thread's shard (StatsShard, ShardStat). Returns false,
// changing nothing, for any other event. Adds the bytes an alloc took to *alloc_bytes (the shard's
// fold bound). inactive_split is not here: the caller applies it where classic segments are tracked.
template <class Target>
[[gnu::always_inline]] inline bool apply_hot(Target& t, EventKind kind, PoolKind pool, std::size_t size_bytes,
                                             std::size_t requested_bytes, std::size_t max_split_size_bytes,
                                             std::int64_t* alloc_bytes = nullptr) noexcept {
  const std::size_t p = static_cast<std::size_t>(stat_type_of(pool));
  switch (kind) {
    case EventKind::alloc:
      increase_pool(t.allocation, p, 1);
      increase_pool(t.allocated_bytes, p, size_bytes);
      increase_pool(t.active, p, 1);
      increase_pool(t.active_bytes, p, size_bytes);
      increase_pool(t.requested_bytes, p, requested_bytes);
      if (size_bytes >= max_split_size_bytes) [[unlikely]] t.oversize_allocations.increase(1);
      if (alloc_bytes) *alloc_bytes += static_cast<std::int64_t>(size_bytes);
      break;
    case EventKind::free_requested:
      decrease_pool(t.allocation, p, 1);
      decrease_pool(t.allocated_bytes, p, size_bytes);
      if (size_bytes >= max_split_size_bytes) [[unlikely]] t.oversize_allocations.decrease(1);
      break;
    case EventKind::free_completed:
      decrease_pool(t.active, p, 1);
      decrease_pool(t.active_bytes, p, size_bytes);
      decrease_pool(t.requested_bytes, p, requested_bytes);
      break;
    default:
      return false;
  }
  ++t.num_events;
  return true;
}

}  // namespace detail

class StatsObserver final : public AllocObserver {
 public:
  explicit StatsObserver(StatsObserverOptions options = {});
  explicit StatsObserver(const Config& config);  // takes max_split_size from the config
  ~StatsObserver() override;
  StatsObserver(const StatsObserver&) = delete;
  StatsObserver& operator=(const StatsObserver&) = delete;

  void on_events(std::span<const AllocEvent> events) override;

  DeviceStatsView stats() const;
  // PyTorch's resetPeakStats: every peak (stat arrays and oversize stats) = current.
  void reset_peak();
  // PyTorch's resetAccumulatedStats: allocated/freed of every stat, and num_alloc_retries,
  // num_ooms, num_sync_all_streams, num_device_alloc, num_device_free back to 0 (gpumem's own
  // counters too, except num_events and num_inconsistent_events).
  void reset_accumulated();

  void add_alloc_retries(std::int64_t count);
  void add_sync_all_streams(std::int64_t count);

  // A shard is folded after this many batches, or once its allocated bytes rose by this much
  // more than its largest batch allocated.
  static constexpr unsigned kFoldBatches = 64;
  static constexpr std::int64_t kFoldBytes = std::int64_t{2} << 20;

  // ---- the engine's side (Note [Stats in place]); CachingAllocator calls these.
  // Runs a function with the bound engine's lock held.
  using RunLocked = std::function<void(const std::function<void()>&)>;
  // Makes the engine whose lock run_locked takes the guard of the hot counters, so that it may
  // call count_in_place. False (nothing changes) if another engine is bound already. Call
  // without that engine's lock held.
  bool bind_engine(RunLocked run_locked);
  // Gives the hot counters back to the observer's lock. Call without the engine's lock held,
  // after the engine stopped calling count_in_place, and while run_locked still works.
  void unbind_engine();
  // A hot event of the bound engine, counted in place. Only the bound engine, under its lock.
  void count_in_place(EventKind kind, PoolKind pool, std::size_t size_bytes, std::size_t requested_bytes) noexcept {
    switch (kind) {
      case EventKind::alloc: return count_alloc_in_place(pool, size_bytes, requested_bytes);
      case EventKind::free_requested: return count_free_requested_in_place(pool, size_bytes);
      case EventKind::free_completed: return count_free_completed_in_place(pool, size_bytes, requested_bytes);
      default: return;
    }
  }
  // The same for one kind, out of line (each a few dozen adds; the engine's hot sites name their
  // kind, so no dispatch is left), and a free that completes at once: its free_requested and
  // free_completed in one call.
  [[gnu::noinline]] void count_alloc_in_place(PoolKind pool, std::size_t size_bytes, std::size_t requested_bytes) noexcept;
  [[gnu::noinline]] void count_free_requested_in_place(PoolKind pool, std::size_t size_bytes) noexcept;
  [[gnu::noinline]] void count_free_completed_in_place(PoolKind pool, std::size_t size_bytes,
                                                       std::size_t requested_bytes) noexcept;
  [[gnu::noinline]] void count_free_in_place(PoolKind pool, std::size_t size_bytes, std::size_t requested_bytes) noexcept;
  // Whether publishers have met (Note [Stats shards]): from then on a thread's published hot
  // events may wait in its shard. A thread whose shard holds changes read true before making
  // them, so its own relaxed read here sees true too.
  bool publishers_met() const noexcept { return contended_.load(std::memory_order_relaxed); }
  // Folds the calling thread's shard of this observer, if it holds changes, into the hot counters.
  // Only the bound engine, under its lock, before it counts the first event of a call in place
  // once publishers have met: the thread's changes then reach the counters in the order it made
  // them (its allocations in the shard before its frees counted in place), so no peak of its own
  // sequence is lost. Takes no observer lock (the engine's lock guards the hot counters).
  [[gnu::noinline]] void fold_this_threads_shard() noexcept;

  // A growth of the bound engine synchronized `syncs` streams, waited for `marker_waits` markers
  // and passed over `skips` pieces fences did not show idle. Only the bound engine, under its lock.
  void count_recycle_waits(std::uint64_t syncs, std::uint64_t marker_waits, std::uint64_t skips) noexcept {
    hot_.num_recycle_syncs += static_cast<std::int64_t>(syncs);
    hot_.num_recycle_marker_waits += static_cast<std::int64_t>(marker_waits);
    hot_.num_recycle_fence_skips += static_cast<std::int64_t>(skips);
  }

 private:
  // Runs f with the hot counters' guard held: the bound engine's lock, or nothing more than
  // mutex_ (which the caller holds) while unbound.
  template <class F>
  void with_hot_locked(F&& f) const;
  void apply_locked(const AllocEvent& event);
  // on_events once publishers have met: the calling thread's shard, or the lock (out of line, so
  // that the uncontended path stays a small function).
  [[gnu::noinline]] void on_events_contended(std::span<const AllocEvent> events);
  // The calling thread's shard (made if `create`), or null (no slot free: the caller applies
  // under the lock).
  detail::StatsShard* shard_for_this_thread(bool create);
  // Applies `reset` to every Stat (the observer's and the hot ones, the shards folded first);
  // mutex_ held.
  template <class F>
  void reset_each_stat_locked(F&& reset);
  void fold_locked(detail::StatsShard& shard) const;  // mutex_ held
  void fold_all_locked() const;                        // mutex_ held

  // Read on every batch by every publishing thread, written almost never: kept off the lines the
  // lock and the totals are on, so that a fold (which writes those) does not make every other
  // publisher miss on these (and on the observer's needs(), next to them).
  const std::uint64_t id_;  // tells this observer apart in threads' shard slots (never reused)
  std::size_t max_split_size_bytes_;
  std::unique_ptr<SplitSegmentTracker> splits_;  // null when tracking is off
  std::atomic<bool> tracking_splits_{false};      // splits_ holds a segment (set under mutex_)
  std::atomic<bool> contended_{false};            // shards are in use (never cleared)
  std::atomic<bool> bound_{false};                // an engine guards hot_ (set under mutex_)
  // The bound engine's count_in_place writes these on every hot event, under its lock: a line
  // of their own, away from the fields above that every publisher reads.
  alignas(64) mutable detail::HotStats hot_;      // under the hot guard (with_hot_locked)
  alignas(64) mutable detail::SpinLock mutex_;    // no futex round trip: contended hand-offs are short
  RunLocked run_locked_;                          // under mutex_; empty while unbound
  // Under mutex_; shards folded in by reads. Its hot fields stay 0: they are in hot_.
  mutable DeviceStatsView stats_;
  std::vector<std::shared_ptr<detail::StatsShard>> shards_;  // under mutex_; every shard ever made
};

// PyTorch's torch.cuda.memory_stats() for this view: the full 2.11 key set (122 keys, e.g.
// "allocated_bytes.all.current", "num_ooms", "max_split_size"), sorted by key as memory_stats()
// returns them.
std::vector<std::pair<std::string, std::int64_t>> to_memory_stats(const DeviceStatsView& stats);

// gpumem's own counters as "gpumem.<name>" keys (kept apart so memory_stats stays PyTorch's).
std::vector<std::pair<std::string, std::int64_t>> to_gpumem_stats(const DeviceStatsView& stats);

}  // namespace gpumem::alloc
