// The memory probes available to programs, by name (a benchmark's --probe option):
//
//   gpumem-cpu   gpumem's statistics of its CPU engine: installs gpumem as c10's CPU allocator
//                (gpumem::torch::install_cpu) and reads gpumem::torch::stats(kCPU)
//   gpumem-cuda  gpumem's statistics of a CUDA device: installs gpumem as libtorch's CUDA
//                allocator (gpumem::torch::install_from_environment, so GPUMEM_ALLOC_CONF
//                applies; before any CUDA tensor exists) and reads gpumem::torch::stats
//   cpu-events   CPU tensors, counted from AllocEvents by the CountingCpuAllocator it installs in
//                front of c10's CPU allocator (an independent cross-check of gpumem-cpu)
//   cuda-native  the device stats of the installed c10 CUDA allocator (getDeviceStats): PyTorch's
//                native caching allocator when gpumem is not installed
//
// A probe that installs an allocator must be made before the model's tensors are, so that every
// byte is seen.
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
