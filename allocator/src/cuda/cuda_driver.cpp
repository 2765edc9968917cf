#include "cuda_driver.h"

#include <fmt/format.h>

#include <atomic>

namespace gpumem::alloc::detail {
namespace {

// The driver ABI version of the entry points we ask for. Every function used here has kept its
// signature since CUDA 10.2, so asking for 12.0 gets today's variant and works on any 12+ driver.
constexpr unsigned kDriverAbiVersion = 12000;

template <class Fn>
bool resolve(const char* symbol, Fn& fn, std::string& missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbiVersion, cudaEnableDefault, &query);
  if (err != cudaSuccess || query != cudaDriverEntryPointSuccess || p == nullptr) {
    if (err != cudaSuccess) (void)cudaGetLastError();  // do not leave the failure for the next caller
    if (!missing.empty()) missing += "; ";
    if (err != cudaSuccess)
      missing += fmt::format("{}: cudaGetDriverEntryPointByVersion failed: {}", symbol, runtime_error_words(err));
    else if (query == cudaDriverEntryPointVersionNotSufficent)
      missing += fmt::format("{}: the installed driver is older than CUDA {}.{}", symbol, kDriverAbiVersion / 1000,
                             kDriverAbiVersion % 1000 / 10);
    else
      missing += fmt::format("{}: not found in the driver", symbol);
    return false;
  }
  fn = reinterpret_cast<Fn>(p);
  return true;
}

CudaDriver resolve_all() {
  CudaDriver d;
  bool ok = true;
  ok &= resolve("cuGetErrorName", d.get_error_name, d.missing);
  ok &= resolve("cuDeviceGet", d.device_get, d.missing);
  ok &= resolve("cuDeviceGetAttribute", d.device_get_attribute, d.missing);
  ok &= resolve("cuMemGetAllocationGranularity", d.mem_get_allocation_granularity, d.missing);
  ok &= resolve("cuMemAddressReserve", d.mem_address_reserve, d.missing);
  ok &= resolve("cuMemAddressFree", d.mem_address_free, d.missing);
  ok &= resolve("cuMemCreate", d.mem_create, d.missing);
  ok &= resolve("cuMemRelease", d.mem_release, d.missing);
  ok &= resolve("cuMemMap", d.mem_map, d.missing);
  ok &= resolve("cuMemUnmap", d.mem_unmap, d.missing);
  ok &= resolve("cuMemSetAccess", d.mem_set_access, d.missing);
  ok &= resolve("cuMemExportToShareableHandle", d.mem_export_to_shareable_handle, d.missing);
  ok &= resolve("cuMemImportFromShareableHandle", d.mem_import_from_shareable_handle, d.missing);
  if (!ok) {
    std::string missing = std::move(d.missing);
    d = CudaDriver{};  // all or nothing: no caller may use a partial table
    d.missing = "CUDA driver entry points unavailable (" + missing + ")";
  }
  return d;
}

std::atomic<const CudaDriver*> table_for_new_sources{nullptr};

}  // namespace

const CudaDriver& CudaDriver::get() {
  static const CudaDriver driver = resolve_all();
  return driver;
}

void CudaDriver::set_table_for_new_sources(const CudaDriver* table) noexcept {
  table_for_new_sources.store(table, std::memory_order_release);
}

const CudaDriver& CudaDriver::for_new_source() {
  const CudaDriver* table = table_for_new_sources.load(std::memory_order_acquire);
  return table != nullptr ? *table : get();
}

std::string CudaDriver::error_name(CUresult result) const {
  const char* name = nullptr;
  if (get_error_name != nullptr && get_error_name(result, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return fmt::format("CUresult {}", static_cast<int>(result));
}

std::string runtime_error_words(cudaError_t error) {
  return fmt::format("{}: {}", cudaGetErrorName(error), cudaGetErrorString(error));
}

DeviceGuard::DeviceGuard(int device, bool force) : device_(device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    (void)cudaGetLastError();
    previous_ = -1;
  }
  if (force || previous_ != device_) {
    status_ = cudaSetDevice(device_);
    if (status_ != cudaSuccess) (void)cudaGetLastError();
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_ && status_ == cudaSuccess) {
    if (cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
}

ProviderMemInfo device_mem_info(int device, bool force) {
  DeviceGuard guard(device, force);
  if (guard.status() != cudaSuccess) return {};
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return {free_bytes, total_bytes};
}

}  // namespace gpumem::alloc::detail
