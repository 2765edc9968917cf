#include "gpumem/alloc/stats.h"

#include <algorithm>

#include "split_segment_tracker.h"

namespace gpumem::alloc {
namespace {

void increase(StatArray& stats, std::size_t pool_index, std::uint64_t amount) noexcept {
  stats[static_cast<std::size_t>(StatType::all)].increase(amount);
  stats[pool_index].increase(amount);
}

void decrease(StatArray& stats, std::size_t pool_index, std::uint64_t amount) noexcept {
  stats[static_cast<std::size_t>(StatType::all)].decrease(amount);
  stats[pool_index].decrease(amount);
}

// Adds a signed net change the way PyTorch does: one increase or one decrease.
void apply_net(StatArray& stats, std::size_t pool_index, std::int64_t delta) noexcept {
  if (delta > 0) increase(stats, pool_index, static_cast<std::uint64_t>(delta));
  if (delta < 0) decrease(stats, pool_index, static_cast<std::uint64_t>(-delta));
}

std::int64_t max_split_size_value(std::size_t bytes) noexcept {
  return bytes == kNoLimit ? -1 : static_cast<std::int64_t>(bytes);
}

}  // namespace

StatsObserver::StatsObserver(StatsObserverOptions options)
    : max_split_size_bytes_(options.max_split_size_bytes) {
  stats_.max_split_size = max_split_size_value(max_split_size_bytes_);
  if (options.track_inactive_split) splits_ = std::make_unique<SplitSegmentTracker>();
}

StatsObserver::StatsObserver(const Config& config)
    : StatsObserver(StatsObserverOptions{config.max_split_size_bytes, true}) {}

StatsObserver::~StatsObserver() = default;

void StatsObserver::on_events(std::span<const AllocEvent> events) {
  std::lock_guard lock(mutex_);
  for (const AllocEvent& e : events) apply_locked(e);
}

void StatsObserver::apply_locked(const AllocEvent& e) {
  DeviceStatsView& s = stats_;
  ++s.num_events;
  const std::size_t p = static_cast<std::size_t>(stat_type_of(e.pool));
  const bool oversize = e.size_bytes >= max_split_size_bytes_;
  SplitSegmentTracker::Change change;
  auto apply_split = [&](SplitSegmentTracker::Result r) {
    if (r == SplitSegmentTracker::Result::inconsistent) ++s.num_inconsistent_events;
    // remove_segment reports its change even when it was inconsistent.
    if (r == SplitSegmentTracker::Result::untracked) return;
    const std::size_t q = static_cast<std::size_t>(stat_type_of(change.pool));
    apply_net(s.inactive_split, q, change.blocks);
    apply_net(s.inactive_split_bytes, q, change.bytes);
  };
  switch (e.kind) {
    case EventKind::alloc:
      increase(s.allocation, p, 1);
      increase(s.allocated_bytes, p, e.size_bytes);
      increase(s.active, p, 1);
      increase(s.active_bytes, p, e.size_bytes);
      increase(s.requested_bytes, p, e.requested_bytes);
      if (oversize) s.oversize_allocations.increase(1);
      if (splits_ && !splits_->empty()) apply_split(splits_->activate(e.addr, e.size_bytes, change));
      break;
    case EventKind::free_requested:
      decrease(s.allocation, p, 1);
      decrease(s.allocated_bytes, p, e.size_bytes);
      if (oversize) s.oversize_allocations.decrease(1);
      break;
    case EventKind::free_completed:
      decrease(s.active, p, 1);
      decrease(s.active_bytes, p, e.size_bytes);
      decrease(s.requested_bytes, p, e.requested_bytes);
      if (splits_ && !splits_->empty()) {
        auto r = splits_->deactivate(e.addr, e.size_bytes, change);
        apply_split(r);
      }
      break;
    case EventKind::segment_alloc:
      increase(s.segment, p, 1);
      increase(s.reserved_bytes, p, e.size_bytes);
      ++s.num_device_alloc;
      if (oversize) s.oversize_segments.increase(1);
      if (splits_ && splits_->add_segment(e.addr, e.size_bytes, e.pool) !=
                         SplitSegmentTracker::Result::ok)
        ++s.num_inconsistent_events;
      break;
    case EventKind::segment_free:
      decrease(s.segment, p, 1);
      decrease(s.reserved_bytes, p, e.size_bytes);
      ++s.num_device_free;
      if (oversize) s.oversize_segments.decrease(1);
      if (splits_) {
        auto r = splits_->remove_segment(e.addr, change);
        if (r == SplitSegmentTracker::Result::untracked)
          ++s.num_inconsistent_events;  // a segment_free without its segment_alloc
        else
          apply_split(r);
      }
      break;
    case EventKind::segment_map:
      increase(s.reserved_bytes, p, e.size_bytes);
      ++s.num_device_alloc;
      ++s.num_segment_maps;
      s.num_pieces_created += e.pieces_created_or_destroyed;
      break;
    case EventKind::segment_unmap:
      decrease(s.reserved_bytes, p, e.size_bytes);
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
  return stats_;
}

void StatsObserver::reset_peak() {
  std::lock_guard lock(mutex_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes})
    for (Stat& st : *a) st.reset_peak();
  stats_.oversize_allocations.reset_peak();
  stats_.oversize_segments.reset_peak();
}

void StatsObserver::reset_accumulated() {
  std::lock_guard lock(mutex_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes})
    for (Stat& st : *a) st.reset_accumulated();
  stats_.oversize_allocations.reset_accumulated();
  stats_.oversize_segments.reset_accumulated();
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
  };
}

}  // namespace gpumem::alloc
