// CudaDriver: the CUDA driver entry points gpumem uses, looked up once at run time through
// cudart's cudaGetDriverEntryPointByVersion so that nothing links libcuda. Also the small helpers
// every CUDA source shares: error words and the device guard.
//
// Thread-safety: CudaDriver::get() resolves once (a function-local static) and is read-only after;
// the test-only table for new sources is an atomic pointer;
// DeviceGuard is per-thread by nature (it changes the calling thread's current device).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "gpumem/alloc/memory_source.h"

namespace gpumem::alloc::detail {

struct CudaDriver {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity = nullptr;
  decltype(&::cuMemAddressReserve) mem_address_reserve = nullptr;
  decltype(&::cuMemAddressFree) mem_address_free = nullptr;
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  // For IPC (cuda_ipc.h): pieces exported as POSIX file descriptors and imported in another process.
  decltype(&::cuMemExportToShareableHandle) mem_export_to_shareable_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) mem_import_from_shareable_handle = nullptr;

  // Empty when every entry point above was found; otherwise why not (and all are null).
  std::string missing;

  static const CudaDriver& get();

  // Test-only hook (driver fault injection, tests/allocator/test_driver_faults.cpp): the table that
  // CudaVmmSources constructed from now on call instead of get() (nullptr: back to get()). A source
  // reads it once, in its constructor, so the hook costs nothing per driver call. The table must
  // outlive every source constructed with it, and have every entry point set.
  static void set_table_for_new_sources(const CudaDriver* table) noexcept;
  // get(), or the table set above when there is one.
  static const CudaDriver& for_new_source();

  // "CUDA_ERROR_OUT_OF_MEMORY" (or "CUresult 2" if the name is unknown).
  std::string error_name(CUresult result) const;
};

// "cudaErrorMemoryAllocation: out of memory".
std::string runtime_error_words(cudaError_t error);

// Makes device current on this thread for its lifetime and restores the previous device after.
// With force = true it calls cudaSetDevice even when device is already current, which also makes
// the device's primary context current on this thread for the driver calls that follow.
class DeviceGuard {
 public:
  DeviceGuard(int device, bool force);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  cudaError_t status() const noexcept { return status_; }  // of cudaSetDevice

 private:
  int previous_ = -1;
  int device_;
  cudaError_t status_ = cudaSuccess;
};

// cudaMemGetInfo on `device` (under a DeviceGuard with `force`); zeros if the device or the
// call fails (the sticky error is cleared).
ProviderMemInfo device_mem_info(int device, bool force);

}  // namespace gpumem::alloc::detail
