#include "gpumem/alloc/stats.h"

#include <algorithm>
#include <functional>

#include "split_segment_tracker.h"

namespace gpumem::alloc {
namespace {

using detail::decrease_pool;
using detail::increase_pool;

// Adds a signed net change the way PyTorch does: one increase or one decrease.
void apply_net(StatArray& stats, std::size_t pool_index, std::int64_t delta) noexcept {
  if (delta > 0) increase_pool(stats, pool_index, static_cast<std::uint64_t>(delta));
  if (delta < 0) decrease_pool(stats, pool_index, static_cast<std::uint64_t>(-delta));
}

std::int64_t max_split_size_value(std::size_t bytes) noexcept {
  return bytes == kNoLimit ? -1 : static_cast<std::int64_t>(bytes);
}

std::uint64_t next_observer_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

namespace detail {

// Note [Stats shards] (stats.h): one thread's unfolded changes to the stats the engine's fast
// paths touch. A ShardStat holds a net change, the highest value the net change reached (a
// prefix maximum, >= 0) and the sums of increases and decreases, so that folding it keeps
// PyTorch's Stat semantics: peak = max(peak, current + high), current += net.
struct ShardStat {
  std::int64_t net = 0;
  std::int64_t high = 0;
  std::int64_t increased = 0;
  std::int64_t decreased = 0;
  void increase(std::uint64_t amount) noexcept {
    net += static_cast<std::int64_t>(amount);
    if (net > high) high = net;
    increased += static_cast<std::int64_t>(amount);
  }
  void decrease(std::uint64_t amount) noexcept {
    net -= static_cast<std::int64_t>(amount);
    decreased += static_cast<std::int64_t>(amount);
  }
  void fold_into(Stat& st) noexcept {
    if (st.current + high > st.peak) st.peak = st.current + high;
    st.current += net;
    st.allocated += increased;
    st.freed += decreased;
    *this = ShardStat{};
  }
};
using ShardArray = std::array<ShardStat, kNumStatTypes>;

// Invariants: only the owning thread (owned) adds to it, under `lock`; the observer folds it
// under its own lock and then `lock`. Kept alive by the observer and the owning thread's slot
// (shared), so a thread that exits after its observer was destroyed touches live memory.
// Aligned to a cache line: shards are made one after another, and two threads writing their own
// shards on one shared line would pass it back and forth on every batch.
struct alignas(64) StatsShard {
  SpinLock lock;
  std::atomic<bool> owned{true};          // a live thread's slot holds it
  std::atomic<bool> observer_alive{true};  // cleared by ~StatsObserver: the slot may be reused
  ShardArray allocation{}, allocated_bytes{}, active{}, active_bytes{}, requested_bytes{};
  ShardStat oversize_allocations{};
  std::int64_t num_events = 0;
  unsigned batches = 0;  // since the last fold
  // The most bytes one batch since the last fold allocated: the byte bound counts growth beyond
  // it, so a thread allocating one large block at a time does not fold (and take the observer's
  // lock) on every batch.
  std::int64_t largest_batch_bytes = 0;
};

namespace {

// A thread's shards, one per observer it published to (up to kSlots observers at once).
struct StatsShardSlots {
  static constexpr int kSlots = 8;
  struct Slot {
    std::uint64_t observer_id = 0;
    std::shared_ptr<StatsShard> shard;
  };
  Slot slots[kSlots];
  ~StatsShardSlots();
};
thread_local StatsShardSlots t_shard_slots;
// Set when this thread's slots are gone (thread exit): a free made by a later thread-local
// destructor (a cached workspace tensor, say) takes the locked path. Trivially destructible, so
// it stays readable until the thread ends.
thread_local bool t_shard_slots_gone = false;
// The slot this thread used last, looked at first: trivially destructible, so reading it costs no
// check of whether the thread's slots were made yet. Observer ids are never reused, so an entry of
// a destroyed observer never matches again; cleared with the slots at thread exit.
struct LastShard {
  std::uint64_t observer_id = 0;
  StatsShard* shard = nullptr;
};
thread_local LastShard t_last_shard;

StatsShardSlots::~StatsShardSlots() {
  t_shard_slots_gone = true;
  t_last_shard = LastShard{};
  for (Slot& s : slots)
    if (s.shard) s.shard->owned.store(false, std::memory_order_release);
}

// The hot events (detail::apply_hot, stats.h) are the only ones a shard takes.
template <class Target>
[[gnu::always_inline]] inline bool apply_hot_event(Target& t, const AllocEvent& e, std::size_t max_split_size_bytes,
                                             std::int64_t* alloc_bytes = nullptr) noexcept {
  return detail::apply_hot(t, e.kind, e.pool, e.size_bytes, e.requested_bytes, max_split_size_bytes, alloc_bytes);
}

inline bool is_hot(const AllocEvent& e) noexcept { return detail::is_hot(e.kind); }

bool any_hot(std::span<const AllocEvent> events) noexcept {
  for (const AllocEvent& e : events)
    if (is_hot(e)) return true;
  return false;
}

bool shardable(std::span<const AllocEvent> events) noexcept {
  for (const AllocEvent& e : events)
    if (!is_hot(e)) return false;
  return true;
}

// Whether the shard's hot events since its last fold touched column t (all, small pool, large
// pool): each changes by one the allocation count of [all] and [pool] (alloc up, free_requested
// down) or their active count (alloc up, free_completed down), so those sums are nonzero iff one
// did. An untouched column's stats are all zero (a fold zeroes them; only hot events of that
// column change them), and folding zeros changes nothing (peak >= current always holds), so
// leaving it out keeps every counter exact.
bool column_touched(const StatsShard& sh, std::size_t t) noexcept {
  return (sh.allocation[t].increased | sh.allocation[t].decreased | sh.active[t].decreased) != 0;
}

}  // namespace
}  // namespace detail

StatsObserver::StatsObserver(StatsObserverOptions options)
    : AllocObserver(kNeedsNothing), id_(next_observer_id()), max_split_size_bytes_(options.max_split_size_bytes) {
  stats_.max_split_size = max_split_size_value(max_split_size_bytes_);
  if (options.track_inactive_split) splits_ = std::make_unique<SplitSegmentTracker>();
}

StatsObserver::StatsObserver(const Config& config)
    : StatsObserver(StatsObserverOptions{config.max_split_size_bytes, true}) {}

StatsObserver::~StatsObserver() {
  for (const auto& shard : shards_) shard->observer_alive.store(false, std::memory_order_release);
}

detail::StatsShard* StatsObserver::shard_for_this_thread(bool create) {
  using Slots = detail::StatsShardSlots;
  if (detail::t_last_shard.observer_id == id_) return detail::t_last_shard.shard;
  if (detail::t_shard_slots_gone) return nullptr;
  Slots::Slot* free_slot = nullptr;
  for (Slots::Slot& slot : detail::t_shard_slots.slots) {
    if (slot.observer_id == id_) {
      detail::t_last_shard = {id_, slot.shard.get()};
      return slot.shard.get();
    }
    if (!free_slot && (slot.observer_id == 0 || !slot.shard->observer_alive.load(std::memory_order_acquire)))
      free_slot = &slot;
  }
  if (!create || !free_slot) return nullptr;
  std::shared_ptr<detail::StatsShard> shard;
  {
    std::lock_guard lock(mutex_);
    // A shard of a thread that exited serves again (what it holds stays counted).
    for (const auto& s : shards_) {
      bool was_owned = false;
      if (s->owned.compare_exchange_strong(was_owned, true, std::memory_order_acq_rel)) {
        shard = s;
        break;
      }
    }
    if (!shard) {
      shard = std::make_shared<detail::StatsShard>();
      shards_.push_back(shard);
    }
  }
  free_slot->observer_id = id_;
  free_slot->shard = std::move(shard);
  detail::t_last_shard = {id_, free_slot->shard.get()};
  return free_slot->shard.get();
}

bool StatsObserver::bind_engine(RunLocked run_locked) {
  std::lock_guard lock(mutex_);
  if (bound_.load(std::memory_order_relaxed) || !run_locked) return false;
  // Every writer of hot_ while unbound holds mutex_, and every later one reads bound_ under it (or
  // writes only its shard): from here on hot_ is the engine's.
  run_locked_ = std::move(run_locked);
  bound_.store(true, std::memory_order_release);
  return true;
}

void StatsObserver::unbind_engine() {
  std::lock_guard lock(mutex_);
  if (!bound_.load(std::memory_order_relaxed)) return;
  // The engine no longer counts in place; its lock, taken once more, orders its last writes
  // before this thread's next reads of hot_ under mutex_ alone.
  run_locked_([] {});
  run_locked_ = nullptr;
  bound_.store(false, std::memory_order_release);
}

template <class F>
void StatsObserver::with_hot_locked(F&& f) const {
  if (bound_.load(std::memory_order_relaxed))
    run_locked_(std::function<void()>(std::ref(f)));
  else
    f();
}

// The hot counters' guard held: mutex_ while unbound; while bound, the engine's lock (with_hot_locked
// takes it after mutex_, fold_this_threads_shard runs under it alone). sh.lock excludes the shard's
// owner.
void StatsObserver::fold_locked(detail::StatsShard& sh) const {
  detail::HotStats& s = hot_;
  std::lock_guard lock(sh.lock);
  if (sh.batches == 0) return;
  // Only what the shard touched (detail::column_touched): a thread's shard is folded before every
  // engine call it counts in place once publishers have met, and between two such calls it
  // usually holds one pool's events, with no oversize allocation. The test is made here rather than
  // by marking what each batch touches as it is written: that would add work to every batch (up to
  // 64 per fold, more often than not) to save part of one fold.
  for (std::size_t t = 0; t < kNumStatTypes; ++t) {
    if (!detail::column_touched(sh, t)) continue;
    sh.allocation[t].fold_into(s.allocation[t]);
    sh.allocated_bytes[t].fold_into(s.allocated_bytes[t]);
    sh.active[t].fold_into(s.active[t]);
    sh.active_bytes[t].fold_into(s.active_bytes[t]);
    sh.requested_bytes[t].fold_into(s.requested_bytes[t]);
  }
  // Changed by one per oversize alloc (up) and free_requested (down), nothing else.
  if ((sh.oversize_allocations.increased | sh.oversize_allocations.decreased) != 0)
    sh.oversize_allocations.fold_into(s.oversize_allocations);
  s.num_events += sh.num_events;
  sh.num_events = 0;
  sh.batches = 0;
  sh.largest_batch_bytes = 0;
}

void StatsObserver::count_alloc_in_place(PoolKind pool, std::size_t size_bytes, std::size_t requested_bytes) noexcept {
  detail::apply_hot(hot_, EventKind::alloc, pool, size_bytes, requested_bytes, max_split_size_bytes_);
}

void StatsObserver::count_free_requested_in_place(PoolKind pool, std::size_t size_bytes) noexcept {
  detail::apply_hot(hot_, EventKind::free_requested, pool, size_bytes, 0, max_split_size_bytes_);
}

void StatsObserver::count_free_completed_in_place(PoolKind pool, std::size_t size_bytes,
                                                  std::size_t requested_bytes) noexcept {
  detail::apply_hot(hot_, EventKind::free_completed, pool, size_bytes, requested_bytes, max_split_size_bytes_);
}

void StatsObserver::count_free_in_place(PoolKind pool, std::size_t size_bytes, std::size_t requested_bytes) noexcept {
  detail::apply_hot(hot_, EventKind::free_requested, pool, size_bytes, requested_bytes, max_split_size_bytes_);
  detail::apply_hot(hot_, EventKind::free_completed, pool, size_bytes, requested_bytes, max_split_size_bytes_);
}

void StatsObserver::fold_this_threads_shard() noexcept {
  // Called by the bound engine under its lock, which guards hot_ while bound; the shard's own
  // lock guards the shard. The observer's lock is not needed (and may not be taken: it comes
  // before the engine's). Without this, a thread that allocated through a path that publishes
  // (thread caches, another engine) and then freed through the engine's locked path had its free
  // counted before its allocation: the counters saw its allocations and frees out of order, and
  // the fold put its shard's high point on top of a current its later frees had already lowered.
  if (detail::StatsShard* sh = shard_for_this_thread(false)) fold_locked(*sh);
}

void StatsObserver::fold_all_locked() const {
  for (const auto& shard : shards_) fold_locked(*shard);
}

void StatsObserver::on_events(std::span<const AllocEvent> events) {
  if (!contended_.load(std::memory_order_relaxed)) {
    if (mutex_.try_lock()) {
      std::unique_lock lock(mutex_, std::adopt_lock);
      // The hot events with no classic segment tracked change a few counters each (apply_hot);
      // anything else takes the full switch.
      auto apply = [&] {
        if (!tracking_splits_.load(std::memory_order_relaxed)) {
          for (const AllocEvent& e : events)
            if (!detail::apply_hot_event(hot_, e, max_split_size_bytes_)) [[unlikely]] apply_locked(e);
        } else {
          for (const AllocEvent& e : events) apply_locked(e);
        }
      };
      if (!bound_.load(std::memory_order_relaxed)) [[likely]] {
        apply();
      } else {
        // Bound (another observer of the engine is awake, or the events come from a path that
        // does not count in place): applied in order under the engine's lock, the hot guard, so
        // that peaks stay exact while publishers have not met. Sending these to the threads'
        // shards instead made two threads that take turns (a training loop and autograd's
        // device thread: one allocates, the other frees) fold peaks that never happened,
        // e.g. a peak allocated above the peak reserved.
        with_hot_locked(apply);
      }
      return;
    }
    contended_.store(true, std::memory_order_relaxed);
  }
  on_events_contended(events);
}

void StatsObserver::on_events_contended(std::span<const AllocEvent> events) {
  // Publishers have met (contended_): hot events that reach on_events (an engine's lock-free
  // paths, other engines, or every event while another observer of a bound engine is awake) go
  // to the thread's shard: taking the observer's (and a bound engine's) lock for each batch would
  // undo what the thread caches save.
  const bool hot = !tracking_splits_.load(std::memory_order_acquire) && detail::shardable(events);
  detail::StatsShard* sh = shard_for_this_thread(hot);
  if (!hot || sh == nullptr) {
    // Under the lock, after this thread's own unfolded changes (its peaks stay in order). The
    // hot guard (the bound engine's lock) only when the batch or the shard has hot stats.
    std::lock_guard lock(mutex_);
    if (sh != nullptr || detail::any_hot(events)) {
      with_hot_locked([&] {
        if (sh) fold_locked(*sh);
        for (const AllocEvent& e : events) apply_locked(e);
      });
    } else {
      for (const AllocEvent& e : events) apply_locked(e);
    }
    return;
  }
  bool fold_due = false, must_fold = false;
  {
    std::lock_guard lock(sh->lock);
    std::int64_t batch_bytes = 0;
    for (const AllocEvent& e : events) detail::apply_hot_event(*sh, e, max_split_size_bytes_, &batch_bytes);
    ++sh->batches;
    sh->largest_batch_bytes = std::max(sh->largest_batch_bytes, batch_bytes);
    // The byte bound: growth beyond one (the largest) batch. Counting the batch itself made
    // every allocation of 2 MiB or more fold, i.e. take the observer's lock and write its totals,
    // so threads allocating large blocks queued there as before the shards (64 MiB pairs, 4
    // threads on the H200: 5.5 us per pair with the observer against 1.9 us for the engine alone).
    const std::int64_t high = sh->allocated_bytes[0].high;
    fold_due = sh->batches >= kFoldBatches || high >= kFoldBytes + sh->largest_batch_bytes;
    // Unfolded for too long (the lock was taken at every try): fold even if it means waiting.
    // Not on bytes: threads allocating large blocks would all queue for the lock again.
    must_fold = sh->batches >= 8 * kFoldBatches;
  }
  if (must_fold) {
    std::lock_guard lock(mutex_);
    with_hot_locked([&] { fold_locked(*sh); });
  } else if (fold_due && mutex_.try_lock()) {
    std::lock_guard lock(mutex_, std::adopt_lock);
    with_hot_locked([&] { fold_locked(*sh); });
  }
}

void StatsObserver::apply_locked(const AllocEvent& e) {
  DeviceStatsView& s = stats_;
  SplitSegmentTracker::Change change;
  auto apply_split = [&](SplitSegmentTracker::Result r) {
    if (r == SplitSegmentTracker::Result::inconsistent) ++s.num_inconsistent_events;
    // remove_segment reports its change even when it was inconsistent.
    if (r == SplitSegmentTracker::Result::untracked) return;
    const std::size_t q = static_cast<std::size_t>(stat_type_of(change.pool));
    apply_net(s.inactive_split, q, change.blocks);
    apply_net(s.inactive_split_bytes, q, change.bytes);
  };
  // alloc / free_requested / free_completed: the counters apply_hot keeps (one definition for
  // every path; the caller holds the hot guard), then the inactive-split tracking only this path does.
  if (detail::apply_hot_event(hot_, e, max_split_size_bytes_)) {
    if (!splits_ || splits_->empty()) return;
    if (e.kind == EventKind::alloc)
      apply_split(splits_->activate(e.addr, e.size_bytes, change));
    else if (e.kind == EventKind::free_completed)
      apply_split(splits_->deactivate(e.addr, e.size_bytes, change));
    return;
  }
  ++s.num_events;
  const std::size_t p = static_cast<std::size_t>(stat_type_of(e.pool));
  const bool oversize = e.size_bytes >= max_split_size_bytes_;
  switch (e.kind) {
    case EventKind::alloc:
    case EventKind::free_requested:
    case EventKind::free_completed:
      break;  // applied above
    case EventKind::segment_alloc:
      increase_pool(s.segment, p, 1);
      increase_pool(s.reserved_bytes, p, e.size_bytes);
      ++s.num_device_alloc;
      if (oversize) s.oversize_segments.increase(1);
      if (splits_ && splits_->add_segment(e.addr, e.size_bytes, e.pool) !=
                         SplitSegmentTracker::Result::ok)
        ++s.num_inconsistent_events;
      if (splits_) tracking_splits_.store(!splits_->empty(), std::memory_order_release);
      break;
    case EventKind::segment_free:
      decrease_pool(s.segment, p, 1);
      decrease_pool(s.reserved_bytes, p, e.size_bytes);
      ++s.num_device_free;
      if (oversize) s.oversize_segments.decrease(1);
      if (splits_) {
        auto r = splits_->remove_segment(e.addr, change);
        if (r == SplitSegmentTracker::Result::untracked)
          ++s.num_inconsistent_events;  // a segment_free without its segment_alloc
        else
          apply_split(r);
        tracking_splits_.store(!splits_->empty(), std::memory_order_release);
      }
      break;
    case EventKind::segment_map:
      increase_pool(s.reserved_bytes, p, e.size_bytes);
      ++s.num_device_alloc;
      ++s.num_segment_maps;
      s.num_pieces_created += e.pieces_created_or_destroyed;
      break;
    case EventKind::segment_unmap:
      decrease_pool(s.reserved_bytes, p, e.size_bytes);
      ++s.num_device_free;
      ++s.num_segment_unmaps;
      s.num_pieces_destroyed += e.pieces_created_or_destroyed;
      break;
    case EventKind::oom:
      ++s.num_ooms;
      break;
    case EventKind::empty_cache:
      ++s.num_sync_all_streams;
      ++s.num_empty_cache;
      break;
    case EventKind::snapshot:
      break;
  }
}

DeviceStatsView StatsObserver::stats() const {
  std::lock_guard lock(mutex_);
  DeviceStatsView view = stats_;
  with_hot_locked([&] {
    fold_all_locked();
    view.allocation = hot_.allocation;
    view.allocated_bytes = hot_.allocated_bytes;
    view.active = hot_.active;
    view.active_bytes = hot_.active_bytes;
    view.requested_bytes = hot_.requested_bytes;
    view.oversize_allocations = hot_.oversize_allocations;
    view.num_events += hot_.num_events;
    view.num_recycle_syncs = hot_.num_recycle_syncs;
    view.num_recycle_marker_waits = hot_.num_recycle_marker_waits;
    view.num_recycle_fence_skips = hot_.num_recycle_fence_skips;
  });
  return view;
}

template <class F>
void StatsObserver::reset_each_stat_locked(F&& reset) {
  for (StatArray* a : {&stats_.segment, &stats_.inactive_split, &stats_.reserved_bytes, &stats_.inactive_split_bytes})
    for (Stat& st : *a) reset(st);
  reset(stats_.oversize_segments);
  with_hot_locked([&] {
    fold_all_locked();
    for (StatArray* a : {&hot_.allocation, &hot_.allocated_bytes, &hot_.active, &hot_.active_bytes,
                         &hot_.requested_bytes})
      for (Stat& st : *a) reset(st);
    reset(hot_.oversize_allocations);
  });
}

void StatsObserver::reset_peak() {
  std::lock_guard lock(mutex_);
  reset_each_stat_locked([](Stat& st) { st.reset_peak(); });
}

void StatsObserver::reset_accumulated() {
  std::lock_guard lock(mutex_);
  reset_each_stat_locked([](Stat& st) { st.reset_accumulated(); });
  stats_.num_alloc_retries = 0;
  stats_.num_ooms = 0;
  stats_.num_sync_all_streams = 0;
  stats_.num_device_alloc = 0;
  stats_.num_device_free = 0;
  stats_.num_segment_maps = 0;
  stats_.num_segment_unmaps = 0;
  stats_.num_pieces_created = 0;
  stats_.num_pieces_destroyed = 0;
  stats_.num_empty_cache = 0;
  with_hot_locked([&] {
    hot_.num_recycle_syncs = 0;
    hot_.num_recycle_marker_waits = 0;
    hot_.num_recycle_fence_skips = 0;
  });
}

void StatsObserver::add_alloc_retries(std::int64_t count) {
  std::lock_guard lock(mutex_);
  stats_.num_alloc_retries += count;
}

void StatsObserver::add_sync_all_streams(std::int64_t count) {
  std::lock_guard lock(mutex_);
  stats_.num_sync_all_streams += count;
}

std::vector<std::pair<std::string, std::int64_t>> to_memory_stats(const DeviceStatsView& s) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  out.reserve(122);
  auto put_stat = [&out](const std::string& prefix, const Stat& st) {
    out.emplace_back(prefix + ".current", st.current);
    out.emplace_back(prefix + ".peak", st.peak);
    out.emplace_back(prefix + ".allocated", st.allocated);
    out.emplace_back(prefix + ".freed", st.freed);
  };
  const std::pair<const char*, const StatArray*> arrays[] = {
      {"allocation", &s.allocation},
      {"segment", &s.segment},
      {"active", &s.active},
      {"inactive_split", &s.inactive_split},
      {"allocated_bytes", &s.allocated_bytes},
      {"reserved_bytes", &s.reserved_bytes},
      {"active_bytes", &s.active_bytes},
      {"inactive_split_bytes", &s.inactive_split_bytes},
      {"requested_bytes", &s.requested_bytes},
  };
  const char* type_names[kNumStatTypes] = {"all", "small_pool", "large_pool"};
  for (const auto& [name, array] : arrays)
    for (std::size_t t = 0; t < kNumStatTypes; ++t)
      put_stat(std::string(name) + "." + type_names[t], (*array)[t]);
  put_stat("oversize_allocations", s.oversize_allocations);
  put_stat("oversize_segments", s.oversize_segments);
  out.emplace_back("num_alloc_retries", s.num_alloc_retries);
  out.emplace_back("num_ooms", s.num_ooms);
  out.emplace_back("num_sync_all_streams", s.num_sync_all_streams);
  out.emplace_back("num_device_alloc", s.num_device_alloc);
  out.emplace_back("num_device_free", s.num_device_free);
  out.emplace_back("max_split_size", s.max_split_size);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, std::int64_t>> to_gpumem_stats(const DeviceStatsView& s) {
  return {
      {"gpumem.num_segment_maps", s.num_segment_maps},
      {"gpumem.num_segment_unmaps", s.num_segment_unmaps},
      {"gpumem.num_pieces_created", s.num_pieces_created},
      {"gpumem.num_pieces_destroyed", s.num_pieces_destroyed},
      {"gpumem.num_empty_cache", s.num_empty_cache},
      {"gpumem.num_events", s.num_events},
      {"gpumem.num_inconsistent_events", s.num_inconsistent_events},
      {"gpumem.num_recycle_syncs", s.num_recycle_syncs},
      {"gpumem.num_recycle_marker_waits", s.num_recycle_marker_waits},
      {"gpumem.num_recycle_fence_skips", s.num_recycle_fence_skips},
  };
}

}  // namespace gpumem::alloc
