// How the torch translation units find each other's engines: the CPU engine lives in
// cpu_allocator.cpp, the CUDA engines in cuda_allocator.cpp (no_cuda.cpp when built without CUDA).
//
// Thread-safety: the lookups are lock-free reads of pointers published once.
#pragma once

#include <c10/core/Device.h>

#include "device_engine.h"

namespace gpumem::torch::detail {

// The host engine, or null before install_cpu.
DeviceEngine* cpu_engine() noexcept;
// The engine of CUDA device index, or null if it does not exist (yet).
DeviceEngine* cuda_engine(int index) noexcept;

inline DeviceEngine* find_engine(c10::Device device) noexcept {
  if (device.is_cpu()) return cpu_engine();
  if (device.is_cuda()) return cuda_engine(device.has_index() ? device.index() : 0);
  return nullptr;
}

}  // namespace gpumem::torch::detail
