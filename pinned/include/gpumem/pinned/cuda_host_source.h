// CudaHostSource: the HostMemorySource of the CUDA build. A region is one anonymous mmap, page-locked
// and made visible to every device with cudaHostRegister(cudaHostRegisterPortable); unmap is
// cudaHostUnregister + munmap. (PyTorch's pinned_use_cuda_host_register path does the same with
// malloc'd memory; cudaHostAlloc cannot be given an alignment or a size jemalloc chose.)
//
// Without a driver or a device, construction still succeeds: init_status() says unsupported and
// map_locked answers that, with last_error() saying why. Invalid options (touch_threads outside
// 1..128) make init_status() invalid_argument, with the reason in last_error(). Regions are always locked (CUDA either
// registers the pages or the map fails with out_of_memory / driver_error).
//
// Thread-safety: all members are safe to call concurrently (one mutex, held across the CUDA calls so
// the bookkeeping and the registrations never disagree).
#pragma once

#if !defined(GPUMEM_HAVE_CUDA)
#error "gpumem/pinned/cuda_host_source.h needs the CUDA build (GPUMEM_HAVE_CUDA)"
#endif

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "gpumem/pinned/host_memory_source.h"

namespace gpumem::pinned {

struct CudaHostSourceOptions {
  // PyTorch's pinned_num_register_threads: regions of at least 16 MiB are first touched by this many
  // threads, so the page faults that cudaHostRegister would take one by one are taken in parallel
  // (1 = leave them to cudaHostRegister). 1 to 128.
  unsigned touch_threads = 1;
};

struct CudaHostSourceCounters {
  std::uint64_t registers = 0, unregisters = 0;
  std::uint64_t register_ns = 0, unregister_ns = 0;  // time in cudaHostRegister / cudaHostUnregister (+ munmap)
  std::size_t registered_bytes = 0;                   // live regions
};

class CudaHostSource final : public HostMemorySource {
 public:
  explicit CudaHostSource(CudaHostSourceOptions options = {});
  ~CudaHostSource() override;  // unregisters and unmaps whatever is still live
  CudaHostSource(const CudaHostSource&) = delete;
  CudaHostSource& operator=(const CudaHostSource&) = delete;

  HostSourceCaps caps() const noexcept override;
  alloc::SourceResult<HostRegion> map_locked(std::size_t size_bytes, std::size_t alignment_bytes) override;
  alloc::SourceStatus unmap(const HostRegion& region) override;
  std::string last_error() const override;

  alloc::SourceStatus init_status() const noexcept { return init_status_; }
  CudaHostSourceCounters counters() const;

 private:
  mutable std::mutex mutex_;
  CudaHostSourceOptions options_;
  std::size_t page_bytes_ = 0;
  alloc::SourceStatus init_status_ = alloc::SourceStatus::ok;
  std::map<std::uintptr_t, std::size_t> live_;
  CudaHostSourceCounters counters_;
  std::string last_error_;
};

}  // namespace gpumem::pinned
