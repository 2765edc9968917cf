#include "gpumem/forensics/op_table_observer.h"

#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {

std::optional<TraceAction> trace_action_of(alloc::EventKind kind) noexcept {
  using alloc::EventKind;
  switch (kind) {
    case EventKind::alloc: return TraceAction::alloc;
    case EventKind::free_requested: return TraceAction::free_requested;
    case EventKind::free_completed: return TraceAction::free_completed;
    case EventKind::segment_alloc: return TraceAction::segment_alloc;
    case EventKind::segment_free: return TraceAction::segment_free;
    case EventKind::segment_map: return TraceAction::segment_map;
    case EventKind::segment_unmap: return TraceAction::segment_unmap;
    case EventKind::oom: return TraceAction::oom;
    case EventKind::snapshot: return TraceAction::snapshot;
    case EventKind::empty_cache: return std::nullopt;
  }
  return std::nullopt;
}

void OpTableObserver::on_events(std::span<const alloc::AllocEvent> events) {
  std::uint32_t id = OpStack::current_op();
  if (id == 0) id = OpStack::current_scope();
  std::lock_guard lock(mutex_);
  auto it = key_of_registry_id_.find(id);
  if (it == key_of_registry_id_.end()) {
    it = key_of_registry_id_.emplace(id, builder_.intern(OpRegistry::global().name(id))).first;
  }
  const std::uint32_t key = it->second;
  for (const auto& e : events) {
    const auto action = trace_action_of(e.kind);
    if (!action) continue;
    const bool block_event = *action == TraceAction::alloc || *action == TraceAction::free_requested ||
                             *action == TraceAction::free_completed;
    builder_.add_id(*action, key, e.addr, block_event ? e.requested_bytes : e.size_bytes);
  }
}

std::vector<OpRow> OpTableObserver::rows() const {
  std::lock_guard lock(mutex_);
  return builder_.rows();
}

}  // namespace gpumem::forensics
