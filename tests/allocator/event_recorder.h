// An observer that keeps every event it is sent, for tests: safe to be sent events from several
// threads at once (read `events` under `mutex` while the engine may still publish).
#pragma once

#include <mutex>
#include <span>
#include <vector>

#include "gpumem/alloc/events.h"

namespace gpumem::alloc::test {

struct EventRecorder : AllocObserver {
  std::mutex mutex;
  std::vector<AllocEvent> events;
  void on_events(std::span<const AllocEvent> batch) override {
    std::lock_guard lock(mutex);
    events.insert(events.end(), batch.begin(), batch.end());
  }
};

}  // namespace gpumem::alloc::test
