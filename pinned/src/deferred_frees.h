// DeferredFrees: blocks the user freed while copies recorded on them (record_stream) may still be
// running, each with one marker per stream (StreamEvents::record at free time). A block leaves the
// queue only when every one of its markers has completed; its markers are then released.
//
// Markers are queried outside the queue's lock, by one thread at a time: a thread that finds
// another one querying skips (allocation must not wait for it) unless it asks to wait.
//
// Invariants: every queued marker was recorded and is released exactly once, when its entry leaves
// the queue (take_completed) or the queue is dropped (take_all).
// Thread-safety: all members may be called concurrently.
#pragma once

#include <atomic>
#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gpumem/alloc/stream_events.h"

namespace gpumem::pinned::detail {

struct PendingFree {
  std::uintptr_t addr = 0;
  std::size_t size_bytes = 0;
  std::size_t requested_bytes = 0;
  bool direct = false;  // BlockRecord::direct
  boost::container::small_vector<alloc::EventToken, 2> markers;
};

class DeferredFrees {
 public:
  void push(PendingFree entry);
  // Entries whose markers have all completed, in the order they were pushed; their markers are
  // released. Returns nothing if another thread is querying and wait is false.
  std::vector<PendingFree> take_completed(alloc::StreamEvents& events, bool wait);
  // Every entry, completed or not, markers released (the allocator is going away).
  std::vector<PendingFree> take_all(alloc::StreamEvents& events);
  std::size_t size() const noexcept { return count_.load(std::memory_order_relaxed); }

 private:
  std::mutex list_mutex_;   // guards list_
  std::mutex query_mutex_;  // one querying thread at a time
  std::vector<PendingFree> list_;
  std::atomic<std::size_t> count_{0};
};

}  // namespace gpumem::pinned::detail
