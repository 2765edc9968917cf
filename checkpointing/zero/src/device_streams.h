// DeviceStreams: the stream logic of stage-3 prefetching, active only on CUDA.
//
// Prefetched all-gathers are issued with a side stream current, so the collective (which waits
// for the stream current when it is launched) does not wait for compute enqueued later, and the
// gathered buffer is allocated from the side stream's pool. Before the side stream works it
// waits for everything already enqueued on the compute stream (the optimizer wrote the shard it
// sends). Consumers on the compute stream wait for the collective's Work, and the buffer is
// recorded as used by the compute stream so the caching allocator does not hand it out again
// before compute is done with it.
//
// On CPU every member is a no-op and run_on_side_stream() just runs the function.
// Uses c10's device-generic stream interface: no CUDA headers, nothing to link.
//
// Thread-safety: none; used by the thread driving one trainer (and its autograd hooks).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <functional>
#include <optional>

namespace gpumem::zero::detail {

class DeviceStreams {
 public:
  explicit DeviceStreams(at::Device device);

  bool active() const { return side_.has_value(); }
  // Runs fn with the side stream current, after the side stream waits for the current stream.
  void run_on_side_stream(const std::function<void()>& fn) const;
  // Marks t's memory as used by the current stream (see above).
  void record_on_current_stream(const at::Tensor& t) const;

 private:
  at::Device device_;
  std::optional<c10::Stream> side_;
};

}  // namespace gpumem::zero::detail
