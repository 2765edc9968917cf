// OpTableObserver: the per-op table of a running engine (op_table.h), fed by its events: each
// event is charged to the innermost op current on the publishing thread (OpStack), or, outside
// any op, to the innermost user scope, or to "" (none).
//
// Cost: one hash lookup of the op id and the table update per event, under the observer's own
// mutex; attach it only when op recording is on (Config::record_ops).
// Thread-safety: all members may be called from any thread.
#pragma once

#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "gpumem/alloc/events.h"
#include "gpumem/forensics/op_table.h"

namespace gpumem::forensics {

class OpTableObserver final : public alloc::AllocObserver {
 public:
  void on_events(std::span<const alloc::AllocEvent> events) override;
  unsigned needs() const noexcept override { return alloc::kNeedsNothing; }  // neither clock nor seq
  std::vector<OpRow> rows() const;

 private:
  mutable std::mutex mutex_;
  OpTableBuilder builder_;
  std::unordered_map<std::uint32_t, std::uint32_t> key_of_registry_id_;
};

// PyTorch's trace action for an engine event (nullopt for empty_cache, which PyTorch does not trace).
std::optional<TraceAction> trace_action_of(alloc::EventKind kind) noexcept;

}  // namespace gpumem::forensics
