// CudaDeviceEvents: StreamEvents over the streams of every CUDA device, for a pinned allocator that
// serves copies to all of them (PyTorch's pinned allocator is one per process, not per device).
//
// A StreamId made by stream_id(device, stream) carries the device in its top byte (device + 1; the
// rest is the cudaStream_t, a user-space address below 2^56, or 0 for the legacy default stream).
// record() asks that device's CudaStreamEvents (created on first use) and returns its marker with
// the device folded into the top byte the same way, so release() finds the pool it came from. A
// StreamId without a device byte means device 0.
//
// Thread-safety: all members may be called concurrently.
#pragma once

#if !defined(GPUMEM_HAVE_CUDA)
#error "gpumem/pinned/cuda_device_events.h needs the CUDA build (GPUMEM_HAVE_CUDA)"
#endif

#include <array>
#include <memory>
#include <mutex>

#include "gpumem/alloc/cuda_sources.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::pinned {

class CudaDeviceEvents final : public alloc::StreamEvents {
 public:
  static constexpr int kMaxDevices = 64;

  // The StreamId of a cudaStream_t (as void*) on device (0 <= device < kMaxDevices).
  static alloc::StreamId stream_id(int device, const void* cuda_stream) noexcept;

  alloc::EventToken record(alloc::StreamId stream) override;
  bool query(alloc::EventToken token) override;
  void synchronize(alloc::EventToken token) override;
  void release(alloc::EventToken token) override;
  void synchronize_stream(alloc::StreamId stream) override;

 private:
  alloc::CudaStreamEvents& device_events(int device);

  std::mutex mutex_;
  std::array<std::unique_ptr<alloc::CudaStreamEvents>, kMaxDevices> devices_{};
};

}  // namespace gpumem::pinned
