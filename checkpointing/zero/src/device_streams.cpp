#include "device_streams.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace gpumem::zero::detail {

DeviceStreams::DeviceStreams(at::Device device) : device_(device) {
  if (device.is_cuda()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    side_ = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  }
}

void DeviceStreams::run_on_side_stream(const std::function<void()>& fn) const {
  if (!side_) {
    fn();
    return;
  }
  c10::impl::VirtualGuardImpl impl(device_.type());
  const c10::Stream current = impl.getStream(device_);
  c10::Event ready(device_.type());
  ready.record(current);
  ready.block(*side_);
  c10::StreamGuard guard(*side_);
  fn();
}

void DeviceStreams::record_on_current_stream(const at::Tensor& t) const {
  if (!side_ || !t.defined() || t.storage().nbytes() == 0) return;
  c10::impl::VirtualGuardImpl impl(device_.type());
  impl.recordDataPtrOnStream(t.storage().data_ptr(), impl.getStream(device_));
}

}  // namespace gpumem::zero::detail
