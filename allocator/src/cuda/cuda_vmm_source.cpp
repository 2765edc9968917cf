#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "cuda_driver.h"
#include "exported_fds.h"
#include "gpumem/alloc/cuda_sources.h"
#include "source_ledger.h"

namespace gpumem::alloc {

using detail::CudaDriver;
using detail::DeviceGuard;

namespace {

constexpr std::size_t kFallbackGranularity = std::size_t{2} << 20;

bool is_power_of_two(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

struct CudaVmmSource::Impl {
  Impl(int dev, CudaVmmOptions opts) : device(dev), options(opts), ledger(kFallbackGranularity) {}

  int device;
  CudaVmmOptions options;
  SourceStatus init_status = SourceStatus::ok;
  const CudaDriver* driver = nullptr;
  CUmemAllocationProp prop{};
  std::size_t granularity_bytes = kFallbackGranularity;
  // Pieces are created exportable (requestedHandleTypes = POSIX file descriptor); see
  // Note [IPC of pieces] in cuda_ipc.h.
  bool exportable = false;
  std::string not_exportable_why;

  mutable std::mutex mutex;
  detail::SourceLedger ledger;
  std::unordered_map<CUmemGenericAllocationHandle, int> exported_fds;  // piece -> its exported fd
  std::string last_error;
  CudaVmmCallTimes times;

  void init();
  // Closes the piece's exported descriptor, if it has one (before cuMemRelease).
  void close_exported(CUmemGenericAllocationHandle handle) {
    auto it = exported_fds.find(handle);
    if (it == exported_fds.end()) return;
    detail::close_exported_fd(it->second);
    exported_fds.erase(it);
  }

  SourceStatus fail(SourceStatus status, std::string message) {
    last_error = std::move(message);
    return status;
  }

  // Maps a driver failure to a status: out of memory is a value the engine acts on; anything else
  // is a driver error named with the call that failed.
  SourceStatus fail_cu(CUresult result, const std::string& call) {
    const SourceStatus status =
        result == CUDA_ERROR_OUT_OF_MEMORY ? SourceStatus::out_of_memory : SourceStatus::driver_error;
    return fail(status, fmt::format("{} on device {} failed: {}", call, device, driver->error_name(result)));
  }

  // Runs one driver call and adds its duration to slot.
  template <class F>
  CUresult timed(CudaCallTime& slot, F&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    const CUresult result = call();
    const auto ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    ++slot.calls;
    slot.total_ns += ns;
    slot.max_ns = std::max(slot.max_ns, ns);
    return result;
  }

  // The device guard for one call; false (with last_error set) if the device cannot be made current.
  bool enter(DeviceGuard& guard) {
    if (guard.status() == cudaSuccess) return true;
    fail(SourceStatus::driver_error,
         fmt::format("cudaSetDevice({}) failed: {}", device, detail::runtime_error_words(guard.status())));
    return false;
  }
};

CudaVmmSource::CudaVmmSource(int device, CudaVmmOptions options) : impl_(std::make_unique<Impl>(device, options)) {
  impl_->init();
}

// Finds the driver, the device and its granularity; on the first thing missing, records why and
// leaves the source answering init_status to every call.
void CudaVmmSource::Impl::init() {
  Impl& s = *this;
  auto unusable = [&](SourceStatus status, std::string why) {
    s.init_status = status;
    s.last_error = fmt::format("CudaVmmSource(device {}): {}", device, why);
  };
  const int count = cuda_device_count();
  if (count == 0) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    return unusable(SourceStatus::unsupported,
                    err != cudaSuccess ? fmt::format("no usable CUDA driver or device (cudaGetDeviceCount: {})",
                                                     detail::runtime_error_words(err))
                                       : std::string("no CUDA device is present"));
  }
  if (device < 0 || device >= count)
    return unusable(SourceStatus::invalid_argument,
                    fmt::format("device index {} is out of range; this machine has {} CUDA device(s): use 0..{}",
                                device, count, count - 1));
  const CudaDriver& driver = CudaDriver::for_new_source();
  if (!driver.missing.empty()) return unusable(SourceStatus::unsupported, driver.missing);
  s.driver = &driver;

  DeviceGuard guard(device, true);
  if (guard.status() != cudaSuccess)
    return unusable(SourceStatus::unsupported,
                    fmt::format("cudaSetDevice failed: {}", detail::runtime_error_words(guard.status())));
  CUdevice cu_device = 0;
  CUresult r = driver.device_get(&cu_device, device);
  if (r != CUDA_SUCCESS)
    return unusable(SourceStatus::unsupported, fmt::format("cuDeviceGet failed: {}", driver.error_name(r)));
  int vmm_supported = 0;
  r = driver.device_get_attribute(&vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device);
  if (r != CUDA_SUCCESS || vmm_supported == 0)
    return unusable(SourceStatus::unsupported,
                    r != CUDA_SUCCESS
                        ? fmt::format("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) failed: {}",
                                      driver.error_name(r))
                        : std::string("the device does not support the CUDA virtual memory API; use CudaMallocSource"));

  s.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s.prop.location.id = device;
  s.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  if (!options.exportable) {
    s.not_exportable_why = "the source was made with exportable pieces off (ipc_handles:False)";
  } else {
    int fd_supported = 0;
    r = driver.device_get_attribute(&fd_supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                    cu_device);
    if (r == CUDA_SUCCESS && fd_supported != 0) {
      s.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      s.exportable = true;
    } else {
      s.not_exportable_why =
          r != CUDA_SUCCESS
              ? fmt::format("cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) failed: {}",
                            driver.error_name(r))
              : std::string("the device cannot export memory as POSIX file descriptors");
    }
  }
  std::size_t granularity = 0;
  r = driver.mem_get_allocation_granularity(&granularity, &s.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS || granularity == 0)
    return unusable(SourceStatus::unsupported,
                    fmt::format("cuMemGetAllocationGranularity failed: {}", driver.error_name(r)));
  s.granularity_bytes = granularity;
  s.ledger = detail::SourceLedger(granularity);
}

CudaVmmSource::~CudaVmmSource() {
  Impl& s = *impl_;
  if (s.init_status != SourceStatus::ok) return;
  std::lock_guard lock(s.mutex);
  DeviceGuard guard(s.device, true);
  const CudaDriver& d = *s.driver;
  for (const auto& [handle, fd] : s.exported_fds) detail::close_exported_fd(fd);
  s.exported_fds.clear();
  for (const auto& [va, handle] : s.ledger.mappings()) (void)d.mem_unmap(va, s.ledger.piece(handle).size_bytes);
  for (const auto& [handle, piece] : s.ledger.pieces()) (void)d.mem_release(handle);
  for (const auto& [base, size] : s.ledger.ranges()) (void)d.mem_address_free(base, size);
}

SourceCaps CudaVmmSource::caps() const noexcept {
  SourceCaps c;
  c.name = "cuda_vmm";
  c.granularity_bytes = impl_->granularity_bytes;
  c.virtual_memory = true;
  c.host_accessible = false;
  c.device_memory = true;
  return c;
}

SourceResult<VaRange> CudaVmmSource::reserve(std::size_t size_bytes, std::size_t alignment_bytes) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return {s.init_status, {}};
  if (auto why = s.ledger.check_size("reserve", size_bytes); !why.empty())
    return {s.fail(SourceStatus::invalid_argument, std::move(why)), {}};
  if (alignment_bytes != 0 && !is_power_of_two(alignment_bytes))
    return {s.fail(SourceStatus::invalid_argument,
                   fmt::format("reserve: alignment {} is not a power of two; pass 0 for the granularity "
                               "or a power of two",
                               alignment_bytes)),
            {}};
  const std::size_t align = std::max(alignment_bytes, s.granularity_bytes);
  DeviceGuard guard(s.device, true);
  if (!s.enter(guard)) return {SourceStatus::driver_error, {}};
  CUdeviceptr base = 0;
  const CUresult r =
      s.timed(s.times.address_reserve, [&] { return s.driver->mem_address_reserve(&base, size_bytes, align, 0, 0); });
  if (r != CUDA_SUCCESS)
    return {s.fail_cu(r, fmt::format("cuMemAddressReserve(size={}, alignment={})", size_bytes, align)), {}};
  const VaRange range{static_cast<std::uintptr_t>(base), size_bytes};
  s.ledger.add_range(range);
  s.ledger.debug_check_invariants();
  return {SourceStatus::ok, range};
}

SourceStatus CudaVmmSource::release(VaRange range) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return s.init_status;
  if (auto why = s.ledger.check_release(range); !why.empty()) return s.fail(SourceStatus::invalid_argument, std::move(why));
  DeviceGuard guard(s.device, true);
  if (!s.enter(guard)) return SourceStatus::driver_error;
  const CUresult r = s.timed(s.times.address_free, [&] { return s.driver->mem_address_free(range.base, range.size_bytes); });
  if (r != CUDA_SUCCESS)
    return s.fail_cu(r, fmt::format("cuMemAddressFree({:#x}, size={})", range.base, range.size_bytes));
  s.ledger.remove_range(range);
  s.ledger.debug_check_invariants();
  return SourceStatus::ok;
}

SourceResult<PhysHandle> CudaVmmSource::create(std::size_t size_bytes) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return {s.init_status, 0};
  if (auto why = s.ledger.check_size("create", size_bytes); !why.empty())
    return {s.fail(SourceStatus::invalid_argument, std::move(why)), 0};
  DeviceGuard guard(s.device, true);
  if (!s.enter(guard)) return {SourceStatus::driver_error, 0};
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = s.timed(s.times.create, [&] { return s.driver->mem_create(&handle, size_bytes, &s.prop, 0); });
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && s.exportable) {
    // The driver refuses exportable pieces (a container without the IPC permissions, an old
    // driver): create plain pieces from now on; only IPC of this source's memory is lost.
    s.exportable = false;
    s.not_exportable_why = fmt::format("cuMemCreate with a POSIX file descriptor handle type failed: {}",
                                       s.driver->error_name(r));
    s.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    r = s.timed(s.times.create, [&] { return s.driver->mem_create(&handle, size_bytes, &s.prop, 0); });
  }
  if (r != CUDA_SUCCESS) return {s.fail_cu(r, fmt::format("cuMemCreate(size={})", size_bytes)), 0};
  s.ledger.add_piece(handle, size_bytes, handle);
  s.ledger.debug_check_invariants();
  return {SourceStatus::ok, handle};
}

SourceStatus CudaVmmSource::destroy(PhysHandle handle) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return s.init_status;
  if (auto why = s.ledger.check_destroy(handle); !why.empty()) return s.fail(SourceStatus::invalid_argument, std::move(why));
  DeviceGuard guard(s.device, true);
  if (!s.enter(guard)) return SourceStatus::driver_error;
  s.close_exported(handle);
  const CUresult r = s.timed(s.times.release, [&] { return s.driver->mem_release(handle); });
  if (r != CUDA_SUCCESS) return s.fail_cu(r, fmt::format("cuMemRelease(handle {:#x})", handle));
  s.ledger.remove_piece(handle);
  s.ledger.debug_check_invariants();
  return SourceStatus::ok;
}

SourceStatus CudaVmmSource::map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return s.init_status;
  if (auto why = s.ledger.check_map(va, size_bytes, handle); !why.empty())
    return s.fail(SourceStatus::invalid_argument, std::move(why));
  DeviceGuard guard(s.device, true);
  if (!s.enter(guard)) return SourceStatus::driver_error;
  CUresult r = s.timed(s.times.map, [&] { return s.driver->mem_map(va, size_bytes, 0, handle, 0); });
  if (r != CUDA_SUCCESS)
    return s.fail_cu(r, fmt::format("cuMemMap(va={:#x}, size={}, handle {:#x})", va, size_bytes, handle));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = s.device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = s.timed(s.times.set_access, [&] { return s.driver->mem_set_access(va, size_bytes, &access, 1); });
  if (r != CUDA_SUCCESS) {
    const SourceStatus status =
        s.fail_cu(r, fmt::format("cuMemSetAccess(va={:#x}, size={}, read/write)", va, size_bytes));
    (void)s.timed(s.times.unmap, [&] { return s.driver->mem_unmap(va, size_bytes); });  // leave nothing half-mapped
    return status;
  }
  s.ledger.add_mapping(va, handle);
  s.ledger.debug_check_invariants();
  return SourceStatus::ok;
}

SourceStatus CudaVmmSource::unmap(std::uintptr_t va, std::size_t size_bytes) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return s.init_status;
  if (auto why = s.ledger.check_unmap(va, size_bytes); !why.empty())
    return s.fail(SourceStatus::invalid_argument, std::move(why));
  DeviceGuard guard(s.device, true);
  if (!s.enter(guard)) return SourceStatus::driver_error;
  const CUresult r = s.timed(s.times.unmap, [&] { return s.driver->mem_unmap(va, size_bytes); });
  if (r != CUDA_SUCCESS) return s.fail_cu(r, fmt::format("cuMemUnmap(va={:#x}, size={})", va, size_bytes));
  s.ledger.remove_mapping(va);
  s.ledger.debug_check_invariants();
  return SourceStatus::ok;
}

ProviderMemInfo CudaVmmSource::mem_info() const {
  const Impl& s = *impl_;
  if (s.init_status != SourceStatus::ok) return {};
  return detail::device_mem_info(s.device, true);
}

std::string CudaVmmSource::last_error() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->last_error;
}

SourceStatus CudaVmmSource::init_status() const noexcept { return impl_->init_status; }

int CudaVmmSource::device() const noexcept { return impl_->device; }

CudaVmmCallTimes CudaVmmSource::call_times() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->times;
}

std::size_t CudaVmmSource::physical_bytes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->ledger.physical_bytes();
}

std::size_t CudaVmmSource::mapped_bytes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->ledger.mapped_bytes();
}

bool CudaVmmSource::exportable() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->init_status == SourceStatus::ok && impl_->exportable;
}

SourceResult<std::vector<ExportedPiece>> CudaVmmSource::export_pieces(std::uintptr_t va, std::size_t size_bytes) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  if (s.init_status != SourceStatus::ok) return {s.init_status, {}};
  if (!s.exportable)
    return {s.fail(SourceStatus::unsupported,
                   fmt::format("export_pieces: device {}'s pieces are not exportable: {}", s.device,
                               s.not_exportable_why)),
            {}};
  if (size_bytes == 0)
    return {s.fail(SourceStatus::invalid_argument, "export_pieces: the range is empty"), {}};
  // The mapping at or below va, then every mapping up to va + size_bytes, with no gap.
  const auto& mappings = s.ledger.mappings();
  auto it = mappings.upper_bound(va);
  std::vector<ExportedPiece> pieces;
  const std::uintptr_t end = va + size_bytes;
  std::uintptr_t covered = va;
  if (it != mappings.begin()) --it;
  for (; it != mappings.end() && it->first < end; ++it) {
    const std::size_t piece_bytes = s.ledger.piece(it->second).size_bytes;
    if (it->first + piece_bytes <= covered) continue;  // the mapping below va ends before it
    if (it->first > covered) break;                    // a gap: reported below
    pieces.push_back({it->first, piece_bytes, -1});
    covered = it->first + piece_bytes;
  }
  if (covered < end)
    return {s.fail(SourceStatus::invalid_argument,
                   fmt::format("export_pieces: [{:#x}, +{}) is not wholly mapped by this source ({:#x} is not)", va,
                               size_bytes, covered)),
            {}};
  DeviceGuard guard(s.device, true);
  if (!s.enter(guard)) return {SourceStatus::driver_error, {}};
  for (auto& piece : pieces) {
    const CUmemGenericAllocationHandle handle = s.ledger.handle_at(piece.va);
    auto found = s.exported_fds.find(handle);
    if (found == s.exported_fds.end()) {
      int fd = -1;
      const CUresult r =
          s.driver->mem_export_to_shareable_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (r != CUDA_SUCCESS)
        return {s.fail_cu(r, fmt::format("cuMemExportToShareableHandle(handle {:#x}, POSIX fd)", handle)), {}};
      detail::add_exported_fd(fd);
      found = s.exported_fds.emplace(handle, fd).first;
    }
    piece.fd = found->second;
  }
  return {SourceStatus::ok, std::move(pieces)};
}

std::unique_ptr<MemorySource> make_cuda_source(bool vmm, int device, CudaVmmOptions options) {
  if (vmm) return std::make_unique<CudaVmmSource>(device, options);
  return std::make_unique<CudaMallocSource>(device);
}

}  // namespace gpumem::alloc
