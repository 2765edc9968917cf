// gpumem's pinned host allocator as libtorch's CUDA host allocator.
//
// install_pinned() makes gpumem::pinned's PinnedAllocator (over CudaHostSource, markers through
// CudaDeviceEvents) the allocator at::getHostAllocator(at::kCUDA) returns: what pin_memory(),
// at::empty(..., pin_memory=true), at::cuda::getPinnedMemoryAllocator(), non_blocking copies
// (record_event), torch.cuda.host_memory_stats() and torch._C._host_emptyCache() use. Blocks the
// previous allocator handed out keep working: their deleters are its own, and record_event for a
// pointer that is not gpumem's is passed on to it.
//
// This code lives in its own library, libgpumem_pinned_torch.so, never in libgpumem_torch.so:
// Debian's jemalloc inside it needs 2.6 KiB of static TLS, which a library dlopen'ed late (Python)
// only gets with GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 (pinned/README.md).
//
// From Python (after `import torch`, before the first pinned tensor is best):
//   torch.ops.load_library(".../libgpumem_pinned_torch.so")
//   torch.ops.gpumem_pinned.install()        # errors raise RuntimeError
//   torch.ops.gpumem_pinned.installed() -> bool
// With GPUMEM_ALLOC_CONF naming pinned_allocator:gpumem, loading the library installs it; a failure
// is printed on stderr and kept for torch.ops.gpumem_pinned.load_error().
//
// Thread-safety: install_pinned may be called from any thread; a second call is a no-op that
// returns the installed allocator (options are fixed by the first).
#pragma once

#include <string>

#include "gpumem/pinned/cuda_host_source.h"
#include "gpumem/pinned/pinned_allocator.h"

namespace gpumem::torch {

// Installs (once) and returns gpumem's pinned allocator. Throws c10::Error naming the fix if CUDA
// is unavailable or the options are invalid.
pinned::PinnedAllocator& install_pinned(const pinned::PinnedOptions& options = {},
                                        const pinned::CudaHostSourceOptions& source_options = {});
// The installed allocator, or null.
pinned::PinnedAllocator* installed_pinned() noexcept;

}  // namespace gpumem::torch

// For code that dlopens this library (libgpumem_torch.so, when its configuration says
// pinned_allocator:gpumem): installs with the default options, or with PyTorch's pinned settings
// (pinned_use_background_threads -> background_period_us, pinned_num_register_threads ->
// touch_threads); returns 0, or 1 with a sentence in error (NUL-terminated, truncated to error_len).
extern "C" int gpumem_install_pinned(char* error, unsigned long error_len);
extern "C" int gpumem_install_pinned_with(unsigned background_period_us, unsigned touch_threads, char* error,
                                          unsigned long error_len);
