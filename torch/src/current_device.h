// Which CUDA device an allocation that names none is for: the calling thread's current device.
//
// c10::cuda::current_device() answers with cudaGetDevice on every call in torch 2.11 (its
// thread-local holds only a deferred target device, which SetDevice resets). On the H200 that call
// costs 86 ns on one thread and 5.4 us per call per thread with 4 threads calling at once
// (torch_alloc_pairs' first line): the CUDA runtime serialises it. Every raw_alloc and allocate()
// of a CUDA allocator asks for the device first, so with several threads allocating, that call
// was most of the time of a gpumem allocation.
//
// With exactly one visible device the current device can only be device 0, so nobody is asked.
// With several (or before the allocator's init() says how many) c10 answers: a per-thread cache
// keyed by the driver's current context would be wrong there, because c10 keeps a deferred target
// device (MaybeSetDevice on a device whose primary context does not exist yet) that differs from
// the current context until the context is made.
//
// Thread-safety: a pure function of its arguments.
#pragma once

namespace gpumem::torch::detail {

// visible_devices: what the allocator's init() was told (0 before it); ask: c10's answer.
template <class Ask>
auto current_device_of(int visible_devices, Ask&& ask) -> decltype(ask()) {
  using Device = decltype(ask());
  return visible_devices == 1 ? Device{0} : ask();
}

}  // namespace gpumem::torch::detail
