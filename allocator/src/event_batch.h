// EventBatch: the events one engine call produces, collected under the lock and published to the
// observers after it is dropped. Eight events live inline; more spill to the heap (only the slow
// paths produce more).
#pragma once

#include <array>
#include <span>
#include <vector>

#include "gpumem/alloc/events.h"

namespace gpumem::alloc::detail {

class EventBatch {
 public:
  explicit EventBatch(bool recording) noexcept : recording_(recording) {}
  bool recording() const noexcept { return recording_; }
  void push(const AllocEvent& e) {
    if (spill_.empty() && n_ < inline_.size()) {
      inline_[n_++] = e;
      return;
    }
    if (spill_.empty()) spill_.assign(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(n_));
    spill_.push_back(e);
  }
  std::span<const AllocEvent> view() const noexcept {
    if (!spill_.empty()) return {spill_.data(), spill_.size()};
    return {inline_.data(), n_};
  }
  bool empty() const noexcept { return n_ == 0 && spill_.empty(); }

 private:
  bool recording_;
  std::size_t n_ = 0;
  std::array<AllocEvent, 8> inline_;
  std::vector<AllocEvent> spill_;
};

}  // namespace gpumem::alloc::detail
