#include "gpumem/forensics/fragmentation_tracker.h"

#include <algorithm>

#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {

void FragmentationTracker::on_events(std::span<const alloc::AllocEvent> events) {
  using alloc::EventKind;
  std::uint32_t op = 0, scope = 0;
  if (record_ops_) {
    op = OpStack::current_op();
    scope = OpStack::current_scope();
  }
  std::lock_guard lock(mutex_);
  for (const auto& e : events) {
    switch (e.kind) {
      case EventKind::alloc:
        live_[e.addr] = LiveBlockInfo{e.size_bytes, e.requested_bytes, op, scope, e.t_ns, e.seq};
        c_.allocated_bytes += e.size_bytes;
        c_.requested_bytes += e.requested_bytes;
        ++c_.live_blocks;
        break;
      case EventKind::free_requested: {
        auto it = live_.find(e.addr);
        if (it == live_.end()) break;
        c_.allocated_bytes -= std::min<std::uint64_t>(c_.allocated_bytes, it->second.size_bytes);
        c_.requested_bytes -= std::min<std::uint64_t>(c_.requested_bytes, it->second.requested_bytes);
        c_.pending_free_bytes += it->second.size_bytes;
        --c_.live_blocks;
        live_.erase(it);
        break;
      }
      case EventKind::free_completed:
        c_.pending_free_bytes -= std::min<std::uint64_t>(c_.pending_free_bytes, e.size_bytes);
        break;
      case EventKind::segment_alloc:
      case EventKind::segment_map:
        c_.reserved_bytes += e.size_bytes;
        break;
      case EventKind::segment_free:
      case EventKind::segment_unmap:
        c_.reserved_bytes -= std::min<std::uint64_t>(c_.reserved_bytes, e.size_bytes);
        break;
      default:
        break;
    }
    const std::uint64_t unallocated = c_.reserved_unallocated_bytes();
    if (unallocated > c_.peak_reserved_unallocated_bytes) {
      c_.peak_reserved_unallocated_bytes = unallocated;
      c_.peak_reserved_unallocated_seq = e.seq;
    }
  }
}

FragmentationCounters FragmentationTracker::counters() const {
  std::lock_guard lock(mutex_);
  return c_;
}

std::optional<LiveBlockInfo> FragmentationTracker::live_block(std::uintptr_t addr) const {
  std::lock_guard lock(mutex_);
  auto it = live_.find(addr);
  if (it == live_.end()) return std::nullopt;
  return it->second;
}

}  // namespace gpumem::forensics
