#include "gpumem/forensics/fragmentation_tracker.h"

#include <algorithm>

#include "gpumem/forensics/alloc_context.h"
#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {

FragmentationTracker::FragmentationTracker(bool record_ops, bool keep_contexts)
    : alloc::AllocObserver(alloc::kNeedsSequence), record_ops_(record_ops), keep_contexts_(keep_contexts) {
  live_.reserve(4096);  // a training step's live blocks without rehashing
}

void FragmentationTracker::on_events(std::span<const alloc::AllocEvent> events) {
  using alloc::EventKind;
  std::uint32_t op = 0, scope = 0;
  if (record_ops_) {
    op = OpStack::current_op();
    scope = OpStack::current_scope();
  }
  const std::uint64_t ticks = detail::read_ticks();
  std::lock_guard lock(mutex_);
  for (const auto& e : events) {
    switch (e.kind) {
      case EventKind::alloc:
        live_[e.addr] = LiveBlockInfo{e.size_bytes, e.requested_bytes, op, scope, ticks, e.seq,
                                      keep_contexts_ ? AllocContext::current() : nullptr};
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
  LiveBlockInfo info = it->second;
  info.t_ns = clock_.converter().to_steady_ns(info.t_ns);
  return info;
}

std::unordered_map<std::uintptr_t, LiveBlockInfo> FragmentationTracker::live_blocks() const {
  std::unordered_map<std::uintptr_t, LiveBlockInfo> out;
  {
    std::lock_guard lock(mutex_);
    out = live_;
  }
  const detail::TickCalibration::Converter to_ns = clock_.converter();
  for (auto& [addr, info] : out) info.t_ns = to_ns.to_steady_ns(info.t_ns);
  return out;
}

}  // namespace gpumem::forensics
