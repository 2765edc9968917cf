// TraceRing: the allocation history kept for one engine: an observer that copies the engine's
// events into a bounded ring (oldest overwritten), the thing torch.cuda.memory._snapshot()'s
// device_traces and _record_memory_history() are built on.
//
// Each record carries what PyTorch's TraceEntry carries beyond the event: a stack context (an
// opaque c10::GatheredContext the adapter gathered before calling the engine, handed over through
// set_thread_context on the calling thread; engines publish events on the thread that made the
// call), the compile context and the user metadata current at that moment, and, for OOM records
// the adapter adds itself, the provider's free bytes.
//
// With capacity 0 and no hook the ring is inactive and on_events returns after one atomic load.
// A hook (attachAllocatorTraceTracker) sees every record the ring would keep, even at capacity 0.
// skip_mask leaves kinds out of both.
//
// Thread-safety: all members are safe to call concurrently (one mutex; the hook is called after
// it is released, on the thread that published the events).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "gpumem/alloc/events.h"

namespace gpumem::torch::detail {

struct TraceRecord {
  alloc::AllocEvent event;
  std::size_t device_free_bytes = 0;  // oom records: provider free bytes at the failure
  std::shared_ptr<void> context;      // c10::GatheredContext, or null
  std::string compile_context;        // empty = none
  std::string user_metadata;
};

struct TraceSettings {
  std::size_t capacity = 0;       // records kept; 0 = none (SIZE_MAX = unbounded)
  std::uint32_t skip_mask = 0;    // bit (1u << EventKind) set = leave that kind out
  bool contexts = false;          // attach thread contexts to alloc records
};

constexpr std::uint32_t skip_bit(alloc::EventKind kind) noexcept {
  return std::uint32_t{1} << static_cast<unsigned>(kind);
}

class TraceRing final : public alloc::AllocObserver {
 public:
  using Hook = std::function<void(const TraceRecord&)>;

  // Times and order only matter while it keeps records.
  unsigned needs() const noexcept override {
    return active() ? (alloc::kNeedsTimestamps | alloc::kNeedsSequence) : alloc::kNeedsNothing;
  }
  // New settings; clear drops the records kept so far (so does a smaller capacity).
  void configure(const TraceSettings& settings, bool clear);
  TraceSettings settings() const;
  void clear();
  // Adds a hook called for every record kept from now on.
  void add_hook(Hook hook);

  void set_user_metadata(std::string metadata);
  std::string user_metadata() const;
  void push_compile_context(std::string context);
  void pop_compile_context();

  void on_events(std::span<const alloc::AllocEvent> events) override;
  // Adds a record the adapter made (the OOM entry with the provider's free bytes).
  void record(TraceRecord record);

  // The records kept, oldest first.
  std::vector<TraceRecord> records() const;
  bool active() const noexcept { return active_.load(std::memory_order_acquire); }

  // The stack context for the alloc event the calling thread's next engine call emits.
  static void set_thread_context(std::shared_ptr<void> context);

 private:
  void append_locked(TraceRecord&& record);
  void update_active_locked();

  mutable std::mutex mutex_;
  std::atomic<bool> active_{false};
  TraceSettings settings_;
  std::vector<TraceRecord> buffer_;
  std::size_t head_ = 0;  // when full: index of the oldest record
  std::vector<Hook> hooks_;
  std::string user_metadata_;
  std::vector<std::string> compile_contexts_;
};

}  // namespace gpumem::torch::detail
