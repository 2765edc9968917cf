#include <fmt/format.h>

#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "cuda_driver.h"
#include "gpumem/alloc/cuda_sources.h"

namespace gpumem::alloc {

using detail::DeviceGuard;

namespace {

// PyTorch rounds every cudaMalloc segment to a multiple of 2 MiB (kSmallBuffer, kRoundLarge).
constexpr std::size_t kGranularity = std::size_t{2} << 20;

bool is_power_of_two(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

struct CudaMallocSource::Impl {
  struct Segment {
    void* raw;                // what cudaMalloc returned (what cudaFree takes)
    std::size_t size_bytes;   // as reserved (the allocation may be larger, see reserve)
    std::size_t alloc_bytes;  // as passed to cudaMalloc
  };

  explicit Impl(int dev) : device(dev) {}

  int device;
  SourceStatus init_status = SourceStatus::ok;
  mutable std::mutex mutex;
  std::map<std::uintptr_t, Segment> segments;  // aligned base -> segment
  std::size_t physical_bytes = 0;
  std::string last_error;

  SourceStatus fail(SourceStatus status, std::string message) {
    last_error = std::move(message);
    return status;
  }

  SourceStatus fail_cuda(cudaError_t error, const std::string& call) {
    (void)cudaGetLastError();  // cudaMalloc's failure stays as the "last error" otherwise
    const SourceStatus status =
        error == cudaErrorMemoryAllocation ? SourceStatus::out_of_memory : SourceStatus::driver_error;
    return fail(status, fmt::format("{} on device {} failed: {}", call, device, detail::runtime_error_words(error)));
  }

  SourceStatus no_virtual_memory(const char* op) {
    return fail(SourceStatus::unsupported,
                fmt::format("{}: CudaMallocSource has no virtual memory (reserve() backs whole ranges); "
                            "use CudaVmmSource for create/map/unmap",
                            op));
  }
};

CudaMallocSource::CudaMallocSource(int device) : impl_(std::make_unique<Impl>(device)) {
  Impl& s = *impl_;
  const int count = cuda_device_count();
  if (count == 0) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    s.init_status = SourceStatus::unsupported;
    s.last_error = fmt::format("CudaMallocSource(device {}): {}", device,
                               err != cudaSuccess ? fmt::format("no usable CUDA driver or device (cudaGetDeviceCount: {})",
                                                                detail::runtime_error_words(err))
                                                  : std::string("no CUDA device is present"));
  } else if (device < 0 || device >= count) {
    s.init_status = SourceStatus::invalid_argument;
    s.last_error = fmt::format("CudaMallocSource(device {}): device index out of range; this machine has {} CUDA "
                               "device(s): use 0..{}",
                               device, count, count - 1);
  }
}

CudaMallocSource::~CudaMallocSource() {
  Impl& s = *impl_;
  if (s.init_status != SourceStatus::ok) return;
  std::lock_guard lock(s.mutex);
  if (s.segments.empty()) return;
  DeviceGuard guard(s.device, false);
  for (const auto& [base, seg] : s.segments)
    if (cudaFree(seg.raw) != cudaSuccess) (void)cudaGetLastError();
}

SourceCaps CudaMallocSource::caps() const noexcept {
  SourceCaps c;
  c.name = "cuda_malloc";
  c.granularity_bytes = kGranularity;
  c.virtual_memory = false;
  c.host_accessible = false;
  c.device_memory = true;
  return c;
}

SourceResult<VaRange> CudaMallocSource::reserve(std::size_t size_bytes, std::size_t alignment_bytes) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return {s.init_status, {}};
  if (size_bytes == 0 || size_bytes % kGranularity != 0)
    return {s.fail(SourceStatus::invalid_argument,
                   fmt::format("reserve: size {} is not a positive multiple of the granularity ({} bytes); "
                               "round it up to a multiple of caps().granularity_bytes",
                               size_bytes, kGranularity)),
            {}};
  if (alignment_bytes != 0 && !is_power_of_two(alignment_bytes))
    return {s.fail(SourceStatus::invalid_argument,
                   fmt::format("reserve: alignment {} is not a power of two; pass 0 for the granularity "
                               "or a power of two",
                               alignment_bytes)),
            {}};
  const std::size_t align = std::max(alignment_bytes, kGranularity);
  DeviceGuard guard(s.device, false);
  if (guard.status() != cudaSuccess)
    return {s.fail(SourceStatus::driver_error,
                   fmt::format("cudaSetDevice({}) failed: {}", s.device, detail::runtime_error_words(guard.status()))),
            {}};

  // cudaMalloc returns 2 MiB-aligned addresses for sizes like these in practice, but promises only
  // 256 bytes. If an address comes back misaligned, allocate align more and align inside it.
  void* raw = nullptr;
  std::size_t alloc_bytes = size_bytes;
  cudaError_t err = cudaMalloc(&raw, alloc_bytes);
  if (err != cudaSuccess) return {s.fail_cuda(err, fmt::format("cudaMalloc(size={})", alloc_bytes)), {}};
  if (reinterpret_cast<std::uintptr_t>(raw) % align != 0) {
    if (cudaFree(raw) != cudaSuccess) (void)cudaGetLastError();
    alloc_bytes = size_bytes + align;
    err = cudaMalloc(&raw, alloc_bytes);
    if (err != cudaSuccess) return {s.fail_cuda(err, fmt::format("cudaMalloc(size={}, over-allocated to align "
                                                                 "to {})", alloc_bytes, align)), {}};
  }
  const auto raw_base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t base = (raw_base + align - 1) / align * align;
  s.segments.emplace(base, Impl::Segment{raw, size_bytes, alloc_bytes});
  s.physical_bytes += alloc_bytes;
  return {SourceStatus::ok, VaRange{base, size_bytes}};
}

SourceStatus CudaMallocSource::release(VaRange range) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return s.init_status;
  auto it = s.segments.find(range.base);
  if (it == s.segments.end() || it->second.size_bytes != range.size_bytes)
    return s.fail(SourceStatus::invalid_argument,
                  fmt::format("release: [{:#x}, +{}) is not a range reserve() returned here", range.base,
                              range.size_bytes));
  DeviceGuard guard(s.device, false);
  const cudaError_t err = cudaFree(it->second.raw);
  if (err != cudaSuccess) return s.fail_cuda(err, fmt::format("cudaFree({})", it->second.raw));
  s.physical_bytes -= it->second.alloc_bytes;
  s.segments.erase(it);
  return SourceStatus::ok;
}

SourceResult<PhysHandle> CudaMallocSource::create(std::size_t) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->init_status != SourceStatus::ok) return {impl_->init_status, 0};
  return {impl_->no_virtual_memory("create"), 0};
}

SourceStatus CudaMallocSource::destroy(PhysHandle) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->init_status != SourceStatus::ok) return impl_->init_status;
  return impl_->no_virtual_memory("destroy");
}

SourceStatus CudaMallocSource::map(std::uintptr_t, std::size_t, PhysHandle) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->init_status != SourceStatus::ok) return impl_->init_status;
  return impl_->no_virtual_memory("map");
}

SourceStatus CudaMallocSource::unmap(std::uintptr_t, std::size_t) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->init_status != SourceStatus::ok) return impl_->init_status;
  return impl_->no_virtual_memory("unmap");
}

ProviderMemInfo CudaMallocSource::mem_info() const {
  const Impl& s = *impl_;
  if (s.init_status != SourceStatus::ok) return {};
  return detail::device_mem_info(s.device, false);
}

std::string CudaMallocSource::last_error() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->last_error;
}

SourceStatus CudaMallocSource::init_status() const noexcept { return impl_->init_status; }

int CudaMallocSource::device() const noexcept { return impl_->device; }

std::size_t CudaMallocSource::physical_bytes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->physical_bytes;
}

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

SourceResult<CudaIpcMemHandle> CudaMallocSource::ipc_mem_handle(std::uintptr_t addr) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return {s.init_status, {}};
  auto it = s.segments.upper_bound(addr);
  if (it == s.segments.begin() || addr >= std::prev(it)->first + std::prev(it)->second.size_bytes)
    return {s.fail(SourceStatus::invalid_argument,
                   fmt::format("ipc_mem_handle: {:#x} is not inside a range this source reserved", addr)),
            {}};
  const Impl::Segment& seg = std::prev(it)->second;
  DeviceGuard guard(s.device, false);
  cudaIpcMemHandle_t handle{};
  const cudaError_t err = cudaIpcGetMemHandle(&handle, seg.raw);
  if (err != cudaSuccess) return {s.fail_cuda(err, fmt::format("cudaIpcGetMemHandle({})", seg.raw)), {}};
  CudaIpcMemHandle out;
  out.allocation_base = reinterpret_cast<std::uintptr_t>(seg.raw);
  static_assert(sizeof(handle) == sizeof(out.bytes));
  std::memcpy(out.bytes, &handle, sizeof(handle));
  return {SourceStatus::ok, out};
}

}  // namespace gpumem::alloc
