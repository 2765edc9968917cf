// The C functions libgpumem_torch.so exports for torch.cuda.memory.CUDAPluggableAllocator:
//
//   a = torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_malloc", "gpumem_free")
//   lib = ctypes.CDLL(path)
//   fn = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
//   a.allocator().set_record_stream_fn(fn("gpumem_record_stream"))   # Tensor.record_stream
//   a.allocator().set_reset_fn(fn("gpumem_empty_cache"))             # torch.cuda.empty_cache
//   a.allocator().set_memory_fraction_fn(fn("gpumem_set_memory_fraction"))
//   torch.cuda.memory.change_current_allocator(a)
//
// Signatures are those torch/csrc/cuda/Module.cpp casts the symbols to (the free function gets
// the device as its third argument, whatever the Python docstring says). They serve the same
// per-device engines as the installed allocator, configured from GPUMEM_ALLOC_CONF (else
// PYTORCH_CUDA_ALLOC_CONF, else defaults) on first use. Errors (out of memory, a bad configuration,
// a pointer gpumem did not allocate) are thrown as c10::Error / c10::OutOfMemoryError, which
// propagate through libtorch's std::function wrappers to Python as RuntimeError /
// torch.OutOfMemoryError.
//
// Under CUDAPluggableAllocator torch.cuda.memory_stats() and _snapshot() raise (PyTorch's
// pluggable wrapper does not forward them); read gpumem's statistics with
// torch.ops.load_library(path) and torch.ops.gpumem.memory_stats(device) instead.
//
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

void* gpumem_malloc(size_t size, int device, cudaStream_t stream);
void gpumem_free(void* ptr, size_t size, int device, cudaStream_t stream);
void gpumem_record_stream(void* ptr, cudaStream_t stream);
void gpumem_empty_cache(void);
void gpumem_set_memory_fraction(double fraction, int device);

#ifdef __cplusplus
}
#endif
