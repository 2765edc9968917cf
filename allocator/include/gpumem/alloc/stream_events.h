// StreamEvents: how the engine learns that work queued on a stream has finished.
//
// Blocks are owned by the stream they were allocated on. A block that was also used on other
// streams (record_stream) may only be reused once a marker recorded on each of those streams at
// free time has completed; a physical piece may only be unmapped once the work that touched it
// has completed. On CUDA a marker is a cudaEvent; on the host (and in simulation) work is
// synchronous and every marker is complete at once; tests use ManualStreamEvents to decide.
//
// Thread-safety: record/query/release are called under the engine's lock of one device;
// synchronize/synchronize_stream are called without it (the engine drops its lock for them, see
// docs/notes/engine-locking.md). Calls come from several threads and several devices at once;
// implementations must be safe for that.
#pragma once

#include <cstdint>
#include <memory>

namespace gpumem::alloc {

// The stream as an integer: the cudaStream_t value on CUDA, 0 for the default stream.
using StreamId = std::uint64_t;

// An opaque marker; 0 is never a valid marker.
using EventToken = std::uint64_t;

class StreamEvents {
 public:
  virtual ~StreamEvents() = default;
  // Records a marker after all work queued so far on stream.
  virtual EventToken record(StreamId stream) = 0;
  // True once the work before the marker has completed.
  virtual bool query(EventToken token) = 0;
  // Blocks until the marker completes.
  virtual void synchronize(EventToken token) = 0;
  // Returns the marker's resources. Called exactly once per recorded marker.
  virtual void release(EventToken token) = 0;
  // Blocks until all work queued on stream has completed (used before unmapping).
  virtual void synchronize_stream(StreamId stream) = 0;
};

// Every marker is complete as soon as it is recorded: host memory and simulation.
std::unique_ptr<StreamEvents> make_immediate_events();

}  // namespace gpumem::alloc
