#include "gpumem/ckpt/event_stats_probe.h"

#include <algorithm>

namespace gpumem::ckpt {

EventStatsProbe::EventStatsProbe(std::string name, int device)
    : name_(std::move(name)), device_(device) {}

void EventStatsProbe::on_events(std::span<const alloc::AllocEvent> events) {
  std::lock_guard lock(mutex_);
  for (const alloc::AllocEvent& e : events) {
    if (e.device != device_) continue;
    const auto size = static_cast<std::int64_t>(e.size_bytes);
    switch (e.kind) {
      case alloc::EventKind::alloc:
        reading_.allocated_bytes += size;
        reading_.peak_allocated_bytes =
            std::max(reading_.peak_allocated_bytes, reading_.allocated_bytes);
        break;
      case alloc::EventKind::free_requested:
        reading_.allocated_bytes -= size;
        break;
      case alloc::EventKind::segment_alloc:
      case alloc::EventKind::segment_map:
        reading_.reserved_bytes += size;
        reading_.peak_reserved_bytes =
            std::max(reading_.peak_reserved_bytes, reading_.reserved_bytes);
        break;
      case alloc::EventKind::segment_free:
      case alloc::EventKind::segment_unmap:
        reading_.reserved_bytes -= size;
        break;
      default:
        break;  // free_completed, oom, empty_cache, snapshot change no count
    }
  }
}

MemoryReading EventStatsProbe::read() {
  std::lock_guard lock(mutex_);
  return reading_;
}

void EventStatsProbe::reset_peak() {
  std::lock_guard lock(mutex_);
  reading_.peak_allocated_bytes = reading_.allocated_bytes;
  reading_.peak_reserved_bytes = reading_.reserved_bytes;
}

}  // namespace gpumem::ckpt
