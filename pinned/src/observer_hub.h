// ObserverHub: the pinned allocator's observers, as a copy-on-write list (the device engine
// publishes the same way): attach/detach build a new list under a mutex, publishing reads the
// current one without a lock. Old lists live until the hub dies, since a publisher may still be
// walking one. With no observer attached, active() is the one branch a call pays.
//
// Thread-safety: all members may be called concurrently.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "gpumem/alloc/events.h"

namespace gpumem::pinned::detail {

class ObserverHub {
 public:
  using List = std::vector<std::shared_ptr<alloc::AllocObserver>>;

  bool active() const noexcept { return active_.load(std::memory_order_relaxed); }
  unsigned needs() const noexcept {
    unsigned n = alloc::kNeedsNothing;
    if (const List* list = current_.load(std::memory_order_acquire))
      for (const auto& o : *list) n |= o->needs();
    return n;
  }
  void publish(std::span<const alloc::AllocEvent> events) const {
    if (events.empty()) return;
    if (const List* list = current_.load(std::memory_order_acquire))
      for (const auto& o : *list) o->on_events(events);
  }
  void attach(std::shared_ptr<alloc::AllocObserver> observer) {
    std::lock_guard lock(mutex_);
    auto next = std::make_unique<List>(current_list());
    next->push_back(std::move(observer));
    install(std::move(next));
  }
  void detach(const alloc::AllocObserver* observer) {
    std::lock_guard lock(mutex_);
    auto next = std::make_unique<List>(current_list());
    next->erase(std::remove_if(next->begin(), next->end(), [&](const auto& o) { return o.get() == observer; }),
                next->end());
    install(std::move(next));
  }

 private:
  List current_list() const {
    const List* now = current_.load(std::memory_order_relaxed);
    return now ? *now : List{};
  }
  void install(std::unique_ptr<List> next) {
    active_.store(!next->empty(), std::memory_order_relaxed);
    current_.store(next.get(), std::memory_order_release);
    lists_.push_back(std::move(next));
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<List>> lists_;
  std::atomic<const List*> current_{nullptr};
  std::atomic<bool> active_{false};
};

}  // namespace gpumem::pinned::detail
