#include "gpumem/pinned/cuda_device_events.h"

#include <cstdio>
#include <cstdlib>

namespace gpumem::pinned {
namespace {

constexpr unsigned kShift = 56;
constexpr std::uint64_t kLowMask = (std::uint64_t{1} << kShift) - 1;

int device_of(std::uint64_t v) noexcept {
  const auto top = static_cast<int>(v >> kShift);
  return top == 0 ? 0 : top - 1;
}

}  // namespace

alloc::StreamId CudaDeviceEvents::stream_id(int device, const void* cuda_stream) noexcept {
  return (static_cast<std::uint64_t>(device + 1) << kShift) |
         (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(cuda_stream)) & kLowMask);
}

alloc::CudaStreamEvents& CudaDeviceEvents::device_events(int device) {
  if (device < 0 || device >= kMaxDevices) {
    std::fprintf(stderr, "gpumem pinned: a stream on device %d; devices 0..%d are supported\n", device,
                 kMaxDevices - 1);
    std::abort();
  }
  std::lock_guard lock(mutex_);
  auto& slot = devices_[static_cast<std::size_t>(device)];
  if (!slot) slot = std::make_unique<alloc::CudaStreamEvents>(device);
  return *slot;
}

alloc::EventToken CudaDeviceEvents::record(alloc::StreamId stream) {
  const int device = device_of(stream);
  const alloc::EventToken token = device_events(device).record(stream & kLowMask);
  return (static_cast<std::uint64_t>(device + 1) << kShift) | (token & kLowMask);
}

bool CudaDeviceEvents::query(alloc::EventToken token) {
  return device_events(device_of(token)).query(token & kLowMask);
}

void CudaDeviceEvents::synchronize(alloc::EventToken token) {
  device_events(device_of(token)).synchronize(token & kLowMask);
}

void CudaDeviceEvents::release(alloc::EventToken token) { device_events(device_of(token)).release(token & kLowMask); }

void CudaDeviceEvents::synchronize_stream(alloc::StreamId stream) {
  device_events(device_of(stream)).synchronize_stream(stream & kLowMask);
}

}  // namespace gpumem::pinned
