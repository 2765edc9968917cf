// ManualStreamEvents: a StreamEvents whose markers complete when a test says so. Used to test
// record_stream and deferred reuse without a GPU.
//
// Thread-safety: all members are safe to call concurrently (one internal mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc {

class ManualStreamEvents final : public StreamEvents {
 public:
  EventToken record(StreamId stream) override;
  bool query(EventToken token) override;
  void synchronize(EventToken token) override;  // completes the marker (the "wait" finishes)
  void release(EventToken token) override;
  void synchronize_stream(StreamId stream) override;  // completes every marker on the stream

  // Completes every marker recorded so far on stream.
  void complete_stream(StreamId stream);
  void complete_all();
  std::size_t outstanding() const;  // recorded, not yet released
  std::uint64_t synchronize_calls() const;

 private:
  struct Marker {
    StreamId stream;
    bool complete;
  };
  mutable std::mutex mutex_;
  EventToken next_ = 1;
  std::map<EventToken, Marker> markers_;
  std::uint64_t synchronize_calls_ = 0;
};

}  // namespace gpumem::alloc
