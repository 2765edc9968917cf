#include "deferred_frees.h"

#include <iterator>

namespace gpumem::pinned::detail {

void DeferredFrees::push(PendingFree entry) {
  std::lock_guard lock(list_mutex_);
  list_.push_back(std::move(entry));
  count_.store(list_.size(), std::memory_order_relaxed);
}

std::vector<PendingFree> DeferredFrees::take_completed(alloc::StreamEvents& events, bool wait) {
  std::vector<PendingFree> done;
  if (count_.load(std::memory_order_relaxed) == 0) return done;
  std::unique_lock query(query_mutex_, std::try_to_lock);
  if (!query.owns_lock()) {
    if (!wait) return done;
    query.lock();
  }
  std::vector<PendingFree> work;
  {
    std::lock_guard lock(list_mutex_);
    work.swap(list_);
  }
  std::vector<PendingFree> waiting;
  for (auto& entry : work) {
    bool complete = true;
    for (alloc::EventToken marker : entry.markers) {
      if (!events.query(marker)) {
        complete = false;
        break;
      }
    }
    if (complete) {
      for (alloc::EventToken marker : entry.markers) events.release(marker);
      done.push_back(std::move(entry));
    } else {
      waiting.push_back(std::move(entry));
    }
  }
  std::lock_guard lock(list_mutex_);
  // Entries pushed while we queried come after the older ones that still wait.
  waiting.insert(waiting.end(), std::make_move_iterator(list_.begin()), std::make_move_iterator(list_.end()));
  list_.swap(waiting);
  count_.store(list_.size(), std::memory_order_relaxed);
  return done;
}

std::vector<PendingFree> DeferredFrees::take_all(alloc::StreamEvents& events) {
  std::lock_guard query(query_mutex_);
  std::vector<PendingFree> all;
  {
    std::lock_guard lock(list_mutex_);
    all.swap(list_);
    count_.store(0, std::memory_order_relaxed);
  }
  for (auto& entry : all)
    for (alloc::EventToken marker : entry.markers) events.release(marker);
  return all;
}

}  // namespace gpumem::pinned::detail
