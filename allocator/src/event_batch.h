// EventBatch: the events one engine call produces, collected under the lock and published to the
// observers after it is dropped. Eight events fit inline (left uninitialized until pushed, so an
// engine call that records nothing pays nothing for them); more spill to the heap (only the slow
// paths produce more).
#pragma once

#include <new>
#include <span>
#include <vector>

#include "gpumem/alloc/events.h"

namespace gpumem::alloc::detail {

class EventBatch {
 public:
  explicit EventBatch(bool recording, unsigned needs = kNeedsTimestamps | kNeedsSequence) noexcept
      : recording_(recording), needs_(needs) {}
  EventBatch(const EventBatch&) = delete;
  EventBatch& operator=(const EventBatch&) = delete;

  bool recording() const noexcept { return recording_; }
  unsigned needs() const noexcept { return needs_; }
  void push(const AllocEvent& e) {
    if (spill_.empty() && n_ < kInline) {
      new (&inline_[n_ * sizeof(AllocEvent)]) AllocEvent(e);
      ++n_;
      return;
    }
    if (spill_.empty()) spill_.assign(inline_events(), inline_events() + n_);
    spill_.push_back(e);
  }
  std::span<const AllocEvent> view() const noexcept {
    if (!spill_.empty()) return {spill_.data(), spill_.size()};
    return {inline_events(), n_};
  }
  bool empty() const noexcept { return n_ == 0 && spill_.empty(); }

 private:
  static constexpr std::size_t kInline = 8;
  const AllocEvent* inline_events() const noexcept {
    return std::launder(reinterpret_cast<const AllocEvent*>(inline_));
  }
  bool recording_;
  unsigned needs_;
  std::size_t n_ = 0;
  alignas(AllocEvent) unsigned char inline_[kInline * sizeof(AllocEvent)];  // AllocEvent is trivially destructible
  std::vector<AllocEvent> spill_;
};

}  // namespace gpumem::alloc::detail
