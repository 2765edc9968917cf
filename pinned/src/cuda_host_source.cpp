#include "gpumem/pinned/cuda_host_source.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <sys/mman.h>

#include <chrono>

#include "host_mapping.h"

namespace gpumem::pinned {
namespace {

std::string cuda_words(cudaError_t err) {
  return fmt::format("{} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
}

std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count());
}

}  // namespace

CudaHostSource::CudaHostSource(CudaHostSourceOptions options)
    : options_(options), page_bytes_(detail::system_page_bytes()) {
  if (options_.touch_threads < 1 || options_.touch_threads > 128) {
    init_status_ = alloc::SourceStatus::invalid_argument;
    last_error_ = fmt::format("CudaHostSource: touch_threads = {} is outside 1..128 (pinned_num_register_threads); "
                              "use 1 (the default) or a power of two such as 8",
                              options_.touch_threads);
    return;
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    init_status_ = alloc::SourceStatus::unsupported;
    last_error_ = err != cudaSuccess ? "CudaHostSource: no CUDA driver: cudaGetDeviceCount failed: " + cuda_words(err)
                                     : std::string("CudaHostSource: no CUDA device");
  }
}

CudaHostSource::~CudaHostSource() {
  std::lock_guard lock(mutex_);
  for (const auto& [base, size] : live_) {
    (void)cudaHostUnregister(reinterpret_cast<void*>(base));
    ::munmap(reinterpret_cast<void*>(base), size);
  }
  (void)cudaGetLastError();
}

HostSourceCaps CudaHostSource::caps() const noexcept { return {"cuda_host_register", page_bytes_, true}; }

alloc::SourceResult<HostRegion> CudaHostSource::map_locked(std::size_t size_bytes, std::size_t alignment_bytes) {
  std::lock_guard lock(mutex_);
  if (init_status_ != alloc::SourceStatus::ok) return {init_status_, {}};
  if (auto bad = detail::check_region_request(size_bytes, alignment_bytes, page_bytes_); !bad.empty()) {
    last_error_ = "CudaHostSource::map_locked: " + bad;
    return {alloc::SourceStatus::invalid_argument, {}};
  }
  auto mapped = detail::map_aligned(size_bytes, alignment_bytes, page_bytes_);
  if (!mapped.ok()) {
    last_error_ = "CudaHostSource: " + mapped.error;
    return {alloc::SourceStatus::out_of_memory, {}};
  }
  const auto start = std::chrono::steady_clock::now();
  if (options_.touch_threads > 1 && size_bytes >= (std::size_t{16} << 20))
    detail::touch_pages(mapped.base, size_bytes, page_bytes_, options_.touch_threads);
  const cudaError_t err = cudaHostRegister(reinterpret_cast<void*>(mapped.base), size_bytes, cudaHostRegisterPortable);
  const std::uint64_t ns = elapsed_ns(start);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    ::munmap(reinterpret_cast<void*>(mapped.base), size_bytes);
    last_error_ = fmt::format("cudaHostRegister of {} bytes failed: {}", size_bytes, cuda_words(err));
    return {err == cudaErrorMemoryAllocation ? alloc::SourceStatus::out_of_memory : alloc::SourceStatus::driver_error,
            {}};
  }
  live_.emplace(mapped.base, size_bytes);
  ++counters_.registers;
  counters_.register_ns += ns;
  counters_.registered_bytes += size_bytes;
  return {alloc::SourceStatus::ok, HostRegion{mapped.base, size_bytes, true}};
}

alloc::SourceStatus CudaHostSource::unmap(const HostRegion& region) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(region.base);
  if (it == live_.end() || it->second != region.size_bytes) {
    last_error_ = fmt::format("CudaHostSource::unmap: [{:#x}, +{}) is not a region this source registered",
                              region.base, region.size_bytes);
    return alloc::SourceStatus::invalid_argument;
  }
  const auto start = std::chrono::steady_clock::now();
  const cudaError_t err = cudaHostUnregister(reinterpret_cast<void*>(region.base));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    last_error_ = fmt::format("cudaHostUnregister of {} bytes failed: {}", region.size_bytes, cuda_words(err));
    return alloc::SourceStatus::driver_error;
  }
  ::munmap(reinterpret_cast<void*>(region.base), region.size_bytes);
  counters_.unregister_ns += elapsed_ns(start);
  live_.erase(it);
  ++counters_.unregisters;
  counters_.registered_bytes -= region.size_bytes;
  return alloc::SourceStatus::ok;
}

std::string CudaHostSource::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

CudaHostSourceCounters CudaHostSource::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

}  // namespace gpumem::pinned
