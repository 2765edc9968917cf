#include "gpumem/forensics/fragmentation_tracker.h"

#include <algorithm>

#include "gpumem/forensics/alloc_context.h"
#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {

FragmentationTracker::FragmentationTracker(bool record_ops, bool keep_contexts)
    : alloc::AllocObserver(alloc::kNeedsSequence),
      record_ops_(record_ops),
      keep_contexts_(keep_contexts),
      live_(8192) {}  // 4096 live blocks (~590 KB) before it grows

void FragmentationTracker::on_events(std::span<const alloc::AllocEvent> events) {
  using alloc::EventKind;
  // The op, the time and the stack only matter to allocations: read once per batch that has one,
  // before the lock (interning an op's name may take the registry's lock).
  const bool allocates = std::any_of(events.begin(), events.end(),
                                     [](const alloc::AllocEvent& e) { return e.kind == EventKind::alloc; });
  std::uint32_t op = 0, scope = 0;
  std::uint64_t ticks = 0;
  std::shared_ptr<void> context;
  if (allocates) {
    if (record_ops_ || OpStack::switched_on()) {
      op = OpStack::current_op();
      scope = OpStack::current_scope();
    }
    ticks = detail::read_ticks();
    if (keep_contexts_) context = AllocContext::current();
  }
  std::lock_guard lock(mutex_);
  for (const auto& e : events) {
    switch (e.kind) {
      case EventKind::alloc:
        if (e.addr == 0) break;
        live_.assign(e.addr, LiveBlockInfo{e.size_bytes, e.requested_bytes, op, scope, ticks, e.seq, context});
        c_.allocated_bytes += e.size_bytes;
        c_.requested_bytes += e.requested_bytes;
        ++c_.live_blocks;
        break;
      case EventKind::free_requested: {
        const std::size_t slot = live_.find(e.addr);
        if (slot == live_.npos) break;
        const LiveBlockInfo& info = live_.at(slot);
        c_.allocated_bytes -= std::min<std::uint64_t>(c_.allocated_bytes, info.size_bytes);
        c_.requested_bytes -= std::min<std::uint64_t>(c_.requested_bytes, info.requested_bytes);
        c_.pending_free_bytes += info.size_bytes;
        --c_.live_blocks;
        live_.erase(slot);
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
  const std::size_t slot = live_.find(addr);
  if (slot == live_.npos) return std::nullopt;
  LiveBlockInfo info = live_.at(slot);
  info.t_ns = clock_.converter().to_steady_ns(info.t_ns);
  return info;
}

std::unordered_map<std::uintptr_t, LiveBlockInfo> FragmentationTracker::live_blocks() const {
  std::unordered_map<std::uintptr_t, LiveBlockInfo> out;
  {
    std::lock_guard lock(mutex_);
    out.reserve(live_.size());
    live_.for_each([&](std::uintptr_t addr, const LiveBlockInfo& info) { out.emplace(addr, info); });
  }
  const detail::TickCalibration::Converter to_ns = clock_.converter();
  for (auto& [addr, info] : out) info.t_ns = to_ns.to_steady_ns(info.t_ns);
  return out;
}

}  // namespace gpumem::forensics
