// The memory probes available to programs, by name (a benchmark's --probe option):
//
//   cpu-events   CPU tensors, counted from gpumem AllocEvents emitted by the
//                CountingCpuAllocator it installs in front of c10's CPU allocator (install it
//                before building the model so every byte is seen)
//   cuda-native  the device stats of the installed c10 CUDA allocator (getDeviceStats): PyTorch's
//                native caching allocator, or gpumem's CUDA adapter once it is installed
//
// Thread-safety: make_memory_probe may be called from any thread; see each probe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpumem/ckpt/memory_probe.h"

namespace gpumem::ckpt {

// Throws std::invalid_argument naming the known probes for an unknown name, and
// std::runtime_error when the probe cannot work in this build or on this machine.
std::unique_ptr<MemoryProbe> make_memory_probe(const std::string& name, int device = 0);

std::vector<std::string> memory_probe_names();

// True when this build's torch has CUDA and a CUDA device is visible.
bool cuda_available();

}  // namespace gpumem::ckpt
