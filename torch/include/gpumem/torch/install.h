// Installing gpumem into libtorch: as its CUDA allocator (install) and as its CPU allocator
// (install_cpu). After install, every CUDA tensor libtorch creates comes from gpumem's engine and
// torch's own memory APIs (torch.cuda.memory_stats, memory_allocated, empty_cache, _snapshot, ...)
// report gpumem; after install_cpu the same holds for CPU tensors (read through memory_stats.h).
//
// Three ways in:
//   * C++: gpumem::torch::install(config) before the first CUDA allocation.
//   * Library load: when GPUMEM_ALLOC_CONF is set, loading libgpumem_torch.so installs the CUDA
//     allocator with that configuration (Python: torch.ops.load_library(path) right after
//     `import torch`, or LD_PRELOAD). A failure is reported on stderr and by
//     torch.ops.gpumem.load_error().
//   * torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_malloc", "gpumem_free"): see c_api.h.
//
// The allocators live until the process ends (libtorch keeps raw pointers to them and tensors
// keep their deleters), so nothing here is ever uninstalled except the CPU allocator, whose
// previous allocator can be put back (tensors gpumem made stay valid and return to gpumem).
//
// Thread-safety: call install / install_cpu / uninstall_cpu during initialization, before other
// threads use libtorch (c10::SetAllocator is not thread-safe). The query functions are safe anywhere.
#pragma once

#include "gpumem/torch/config.h"

namespace gpumem::torch {

// Makes gpumem libtorch's CUDA allocator (c10::cuda::CUDACachingAllocator::allocator and
// c10::SetAllocator(kCUDA)). config.adapter.source must be cuda_vmm (the default) or cuda_malloc.
// Throws c10::Error, with one message naming the problem and the fix, if the CUDA allocator was
// already initialized (a CUDA tensor exists or torch.cuda was initialized), if gpumem is already
// installed with a different configuration, or if the source kind is not a CUDA one. Installing
// twice with an equal configuration is a no-op.
void install(const Config& config = {});

// install(config_from_environment()): GPUMEM_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, else
// PYTORCH_ALLOC_CONF. A bad string throws c10::Error naming the variable and the key.
void install_from_environment();

// True once install succeeded in this process.
bool installed() noexcept;

// Replaces c10's CPU allocator with gpumem's engine on HostVmmSource (c10::SetAllocator(kCPU)
// with a priority above the default allocator's). Allocations are 512-byte aligned (c10 needs 64).
// config.adapter.source is ignored (the CPU engine always uses host memory). Throws c10::Error if the CPU
// allocator is already gpumem's with a different configuration; equal configuration is a no-op.
// fork(): the child goes back to the previous CPU allocator (HostVmmSource memory is a shared
// mapping, so tensors made before the fork are shared with the child rather than copied on write).
void install_cpu(const Config& config = {});

// Puts back the CPU allocator install_cpu replaced. Tensors gpumem allocated keep working and are
// returned to gpumem when freed; its engine stays alive. No-op if not installed.
void uninstall_cpu();

// True while gpumem is c10's CPU allocator.
bool cpu_installed() noexcept;

}  // namespace gpumem::torch
