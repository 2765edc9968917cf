// gpumem's pinned host allocator as libtorch's CUDA host allocator.
//
// install_pinned() makes gpumem::pinned's PinnedAllocator (over CudaHostSource, markers through
// CudaDeviceEvents) the allocator at::getHostAllocator(at::kCUDA) returns: what pin_memory(),
// at::empty(..., pin_memory=true), at::cuda::getPinnedMemoryAllocator(), non_blocking copies
// (record_event), torch.cuda.host_memory_stats() and torch._C._host_emptyCache() use. Blocks the
// previous allocator handed out keep working: their deleters are its own, and record_event for a
// pointer that is not gpumem's is passed on to it.
//
// This code lives in its own library, libgpumem_pinned_torch.so (target gpumem::pinned_torch),
// never in libgpumem_torch.so: it carries gpumem's private jemalloc, whose constructor initializes
// jemalloc on load and which, when built from Debian's binary package, needs static TLS a late
// dlopen cannot get (pinned/README.md). libgpumem_torch.so dlopens it when the configuration says
// pinned_allocator:gpumem (GPUMEM_ALLOC_CONF, install(config)); that is the usual way in.
//
// Directly, from Python (after `import torch`; before the first pinned tensor is best):
//   torch.ops.load_library(".../libgpumem_pinned_torch.so")
//   torch.ops.gpumem_pinned.install()        # errors raise RuntimeError
//   torch.ops.gpumem_pinned.installed() -> bool
//   torch.ops.gpumem_pinned.dump_snapshot(path)   # regions, blocks and (trace_entries) history
//
// Thread-safety: install_pinned may be called from any thread; a second call is a no-op that
// returns the installed allocator (options are fixed by the first).
#pragma once

#include <string>

#include <cstddef>

#include "gpumem/forensics/snapshot.h"
#include "gpumem/pinned/cuda_host_source.h"
#include "gpumem/pinned/pinned_allocator.h"
#include "gpumem/torch/pinned_abi.h"

namespace gpumem::torch {

struct PinnedInstallOptions {
  pinned::PinnedOptions allocator;
  pinned::CudaHostSourceOptions source;
  // Events kept for snapshots (pinned_snapshot, torch.ops.gpumem_pinned.dump_snapshot); 0 = none.
  std::size_t trace_entries = 0;
};

// Installs (once) and returns gpumem's pinned allocator. Throws c10::Error naming the fix if CUDA
// is unavailable or the options are invalid.
pinned::PinnedAllocator& install_pinned(const PinnedInstallOptions& options = {});
// The installed allocator, or null.
pinned::PinnedAllocator* installed_pinned() noexcept;

// A snapshot of pinned host memory (forensics' model: regions as segments and the trace, device
// kPinnedHostDevice = -1, the trace in host_trace). Throws c10::Error when none is installed.
// torch.ops.gpumem_pinned.dump_snapshot(path) writes it (".json": JSON, else PyTorch's pickle);
// `gpumem report FILE --device -1` and `gpumem view FILE --device -1` read it.
forensics::Snapshot pinned_snapshot();

}  // namespace gpumem::torch

// For code that dlopens this library (libgpumem_torch.so's loader, torch/src/pinned_loader.h):
// gpumem_install_pinned_with, declared in gpumem/torch/pinned_abi.h.
