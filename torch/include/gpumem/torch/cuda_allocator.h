// gpumem's c10::cuda::CUDACachingAllocator::CUDAAllocator: the object install() hands to libtorch.
//
// There is one per process. cuda_allocator() returns it, creating it (with config, or with
// config_from_environment() when none is given) without installing it, so a program can drive it
// directly next to PyTorch's native allocator (bench/torch_alloc_pairs.cpp does: raw_alloc /
// raw_delete on both, in one process). install() uses the same object.
//
// What it implements (torch 2.11, all 33 pure virtuals): allocate / raw_alloc / raw_delete on
// per-device engines over CudaVmmSource (config source:cuda_vmm, the default) or CudaMallocSource
// (source:cuda_malloc); recordStream; emptyCache; getDeviceStats / resetPeakStats /
// resetAccumulatedStats (PyTorch's meaning); snapshot (segments, blocks, per-device traces,
// annotations, allocator settings); recordHistory (contexts and skip_actions included);
// attachOutOfMemoryObserver; attachAllocatorTraceTracker; set/getMemoryFraction; cacheInfo;
// getBaseAllocation; getExpandableSegmentSizes; enable(false) (uncached cudaMalloc/cudaFree, as
// PyTorch's); memcpyAsync (cudaMemcpyPeerAsync across devices); enablePeerAccess;
// user metadata and compile contexts in traces. OOM raises c10::OutOfMemoryError with PyTorch's
// message shape plus gpumem's explanation, after the OOM trace entry, the profiler report and the
// OOM observers.
//
// Not supported, each raising one c10::Error that names the feature: CUDA IPC (shareIpcHandle,
// getIpcDevPtr: sharing CUDA tensors between processes), CUDA-graph private pools and MemPool
// (beginAllocateToPool, endAllocateToPool, releasePool, createOrIncrefPool, ...), and cudagraph
// trees' checkpoint state (getCheckpointState, setCheckpointPoolState).
//
// Thread-safety: as PyTorch's allocator: every member may be called from any thread.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include "gpumem/torch/config.h"

namespace gpumem::torch {

using CUDAAllocator = c10::cuda::CUDACachingAllocator::CUDAAllocator;

// The process's gpumem CUDA allocator, created on first call. Throws c10::Error if config is
// given and differs from the one it was created with, or if config.adapter.source is not a CUDA
// source.
CUDAAllocator& cuda_allocator();
CUDAAllocator& cuda_allocator(const Config& config);

}  // namespace gpumem::torch
