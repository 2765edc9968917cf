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
// Thread-safety: all members may be called concurrently. Lock order: the observer's lock -> a
// shard's lock (a shard's lock alone is taken by its thread for each batch).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
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

  friend bool operator==(const DeviceStatsView&, const DeviceStatsView&) = default;
};

struct StatsObserverOptions {
  std::size_t max_split_size_bytes = kNoLimit;  // for the oversize stats and max_split_size
  bool track_inactive_split = true;             // see the note on inactive_split above
};

class SplitSegmentTracker;  // allocator/src/split_segment_tracker.h
namespace detail {
struct StatsShard;
}

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

 private:
  void apply_locked(const AllocEvent& event);
  // on_events once publishers have met: the calling thread's shard, or the lock (out of line, so
  // that the uncontended path stays a small function).
  [[gnu::noinline]] void on_events_contended(std::span<const AllocEvent> events);
  // The calling thread's shard (made if `create`), or null (no slot free: the caller applies
  // under the lock).
  detail::StatsShard* shard_for_this_thread(bool create);
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
  alignas(64) mutable detail::SpinLock mutex_;    // no futex round trip: contended hand-offs are short
  mutable DeviceStatsView stats_;                 // under mutex_; shards folded in by reads
  std::vector<std::shared_ptr<detail::StatsShard>> shards_;  // under mutex_; every shard ever made
};

// PyTorch's torch.cuda.memory_stats() for this view: the full 2.11 key set (122 keys, e.g.
// "allocated_bytes.all.current", "num_ooms", "max_split_size"), sorted by key as memory_stats()
// returns them.
std::vector<std::pair<std::string, std::int64_t>> to_memory_stats(const DeviceStatsView& stats);

// gpumem's own counters as "gpumem.<name>" keys (kept apart so memory_stats stays PyTorch's).
std::vector<std::pair<std::string, std::int64_t>> to_gpumem_stats(const DeviceStatsView& stats);

}  // namespace gpumem::alloc
