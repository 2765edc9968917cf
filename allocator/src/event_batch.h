// EventBatch: the events one engine call produces, collected under the lock and published to the
// observers after it is dropped. Eight events fit inline (left uninitialized until pushed, so an
// engine call that records nothing pays nothing for them); more spill to the heap (only the slow
// paths produce more).
//
// Invariant: n_ events were pushed; while n_ <= kInline they are inline_[0, n_) and spill_ is
// null; past that, spill_ holds all of them in order. A push on the fast paths (at most three
// events per call) is one compare, a copy and an increment.
//
// Counting in place (Note [Stats in place], gpumem/alloc/stats.h): when the only awake observer
// is the StatsObserver bound to the engine, the batch carries it (in_place_sink), and the events
// the engine emits under its lock that it counts in place (alloc, free_requested, free_completed)
// are never pushed; the batch holds only what the observer still needs as events. Once the
// observer's publishers have met, the call's first event counted in place folds the calling
// thread's shard first (fold_shard_first), so the thread's changes stay in its order.
//
// Thread-safety: none; one engine call owns its batch.
#pragma once

#include <memory>
#include <new>
#include <span>
#include <vector>

#include "gpumem/alloc/events.h"

namespace gpumem::alloc {
class StatsObserver;
}

namespace gpumem::alloc::detail {

class EventBatch {
 public:
  explicit EventBatch(bool recording, unsigned needs = kNeedsTimestamps | kNeedsSequence) noexcept
      : recording_(recording), needs_(needs) {}
  EventBatch(const EventBatch&) = delete;
  EventBatch& operator=(const EventBatch&) = delete;

  // A recording batch whose hot events the bound StatsObserver `sink` counts in place.
  // fold_shard_first: publishers of `sink` have met, so this thread's shard may hold changes that
  // must reach the counters before the call's first event counted in place.
  EventBatch(StatsObserver* sink, bool fold_shard_first) noexcept
      : recording_(true), needs_(kNeedsNothing), in_place_sink_(sink), fold_shard_first_(fold_shard_first) {}

  bool recording() const noexcept { return recording_; }
  unsigned needs() const noexcept { return needs_; }
  StatsObserver* in_place_sink() const noexcept { return in_place_sink_; }
  // True until the first event counted in place asks (and the caller folds the thread's shard).
  bool take_fold_shard_first() noexcept {
    if (!fold_shard_first_) [[likely]] return false;
    fold_shard_first_ = false;
    return true;
  }
  void push(const AllocEvent& e) {
    if (n_ < kInline) [[likely]] {
      new (&inline_[n_ * sizeof(AllocEvent)]) AllocEvent(e);
      ++n_;
      return;
    }
    push_spilled(e);
  }
  std::span<const AllocEvent> view() const noexcept {
    if (n_ <= kInline) [[likely]] return {inline_events(), n_};
    return {spill_->data(), spill_->size()};
  }
  bool empty() const noexcept { return n_ == 0; }

 private:
  static constexpr std::size_t kInline = 8;
  const AllocEvent* inline_events() const noexcept {
    return std::launder(reinterpret_cast<const AllocEvent*>(inline_));
  }
  // The ninth event and later (slow paths only): everything moves to the heap, in order.
  void push_spilled(const AllocEvent& e) {
    if (!spill_) spill_ = std::make_unique<std::vector<AllocEvent>>(inline_events(), inline_events() + n_);
    spill_->push_back(e);
    ++n_;
  }
  bool recording_;
  unsigned needs_;
  StatsObserver* in_place_sink_ = nullptr;
  bool fold_shard_first_ = false;
  std::size_t n_ = 0;
  alignas(AllocEvent) unsigned char inline_[kInline * sizeof(AllocEvent)];  // AllocEvent is trivially destructible
  std::unique_ptr<std::vector<AllocEvent>> spill_;
};

}  // namespace gpumem::alloc::detail
