// CaptureAwareEvents: the StreamEvents the engines of one device use (its main engine and the
// engines of its private pools), in front of the device's own events. See Note [Engine during
// graph capture] (gpumem/alloc/caching_allocator.h) and docs/notes/graph-pools.md.
//
// While a CUDA graph capture may be underway on the device (CaptureGate open: PyTorch's
// "captures_underway" is non-empty, from beginAllocateToPool to endAllocateToPool), CUDA forbids
// querying and synchronizing events and streams, and an event recorded on a capturing stream
// could never be queried. So while the gate is open:
//   * record() records nothing: it returns a deferred marker, recorded on its stream (cudaEventRecord)
//     the first time it is asked about after the capture, as PyTorch defers "events until no
//     capture". Recording later than the free is safe: the marker then covers more work, not less.
//   * query() answers "not complete" without asking; synchronize() returns without waiting (the
//     engines are capturing then and ask neither; this only keeps a mistake from reaching CUDA).
// synchronize_stream() is never reached during a capture (capturing engines neither recycle nor
// release). For a private pool's engine it synchronizes the whole device instead of one stream: a
// graph may be replayed on any stream, and its pieces must be idle before they are unmapped (the
// way cudaFree synchronizes the device).
//
// Thread-safety: every member may be called from any thread (one mutex guards the deferred
// markers; the inner events are thread-safe by contract). The gate is an atomic counter.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "gpumem/alloc/stream_events.h"

namespace gpumem::torch::detail {

// Open while captures may be underway on a device (the number of entries in captures underway).
struct CaptureGate {
  std::atomic<int> captures{0};
  bool open() const noexcept { return captures.load(std::memory_order_acquire) > 0; }
};

class CaptureAwareEvents final : public alloc::StreamEvents {
 public:
  // inner and gate must outlive this. sync_device, if given, replaces synchronize_stream.
  CaptureAwareEvents(alloc::StreamEvents& inner, const CaptureGate& gate, std::function<void()> sync_device = {});
  ~CaptureAwareEvents() override;

  alloc::EventToken record(alloc::StreamId stream) override;
  bool query(alloc::EventToken token) override;
  void synchronize(alloc::EventToken token) override;
  void release(alloc::EventToken token) override;
  void synchronize_stream(alloc::StreamId stream) override;

  // Markers recorded while the gate was open and not yet recorded on their stream.
  std::size_t deferred_unrecorded() const;

 private:
  // Deferred tokens have this bit set; the inner events' tokens never do (pointers and small
  // counters).
  static constexpr alloc::EventToken kDeferredBit = alloc::EventToken{1} << 63;
  struct Deferred {
    alloc::StreamId stream = 0;
    alloc::EventToken real = 0;  // 0 until recorded on its stream
  };
  // The inner marker behind a deferred token, recording it now if it was not yet (gate closed).
  alloc::EventToken realize(alloc::EventToken token);

  alloc::StreamEvents& inner_;
  const CaptureGate& gate_;
  const std::function<void()> sync_device_;
  mutable std::mutex mutex_;
  alloc::EventToken next_ = 0;
  std::unordered_map<alloc::EventToken, Deferred> deferred_;
};

}  // namespace gpumem::torch::detail
