#include "gpumem/alloc/cuda_ipc.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "cuda_driver.h"
#include "exported_fds.h"

namespace gpumem::alloc {

using detail::CudaDriver;
using detail::DeviceGuard;

namespace {

struct ExportedFds {
  std::mutex mutex;
  std::unordered_set<int> fds;
};

ExportedFds& exported() {
  static auto* set = new ExportedFds();  // never destroyed: sources may close descriptors during exit
  return *set;
}

}  // namespace

namespace detail {

void add_exported_fd(int fd) {
  ExportedFds& e = exported();
  std::lock_guard lock(e.mutex);
  e.fds.insert(fd);
}

void close_exported_fd(int fd) {
  ExportedFds& e = exported();
  std::lock_guard lock(e.mutex);
  e.fds.erase(fd);
  ::close(fd);
}

}  // namespace detail

bool send_if_exported(std::span<const int> fds, const std::function<bool(std::span<const int>)>& send) {
  ExportedFds& e = exported();
  std::lock_guard lock(e.mutex);
  for (int fd : fds)
    if (e.fds.count(fd) == 0) return false;
  return send(fds);
}

// ---- CudaImportedPieces

std::unique_ptr<CudaImportedPieces> CudaImportedPieces::import(int device, std::span<const std::size_t> sizes_bytes,
                                                               std::span<const int> fds, std::string* error) {
  auto close_from = [&](std::size_t i) {
    for (; i < fds.size(); ++i) ::close(fds[i]);
  };
  const CudaDriver& d = CudaDriver::get();
  if (!d.missing.empty()) {
    close_from(0);
    *error = d.missing;
    return nullptr;
  }
  if (fds.empty() || sizes_bytes.size() != fds.size() ||
      std::find(sizes_bytes.begin(), sizes_bytes.end(), std::size_t{0}) != sizes_bytes.end()) {
    close_from(0);
    *error = fmt::format("no pieces to import ({} descriptors, {} sizes, or a piece of 0 bytes)", fds.size(),
                         sizes_bytes.size());
    return nullptr;
  }
  DeviceGuard guard(device, true);
  if (guard.status() != cudaSuccess) {
    close_from(0);
    *error = fmt::format("cudaSetDevice({}) failed: {}", device, detail::runtime_error_words(guard.status()));
    return nullptr;
  }
  std::unique_ptr<CudaImportedPieces> out(
      new CudaImportedPieces(device, std::vector<std::size_t>(sizes_bytes.begin(), sizes_bytes.end())));
  for (std::size_t i = 0; i < fds.size(); ++i) {
    CUmemGenericAllocationHandle handle = 0;
    const CUresult r = d.mem_import_from_shareable_handle(
        &handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[i])), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fds[i]);  // the imported handle keeps the memory; the descriptor is not needed any more
    if (r != CUDA_SUCCESS) {
      close_from(i + 1);
      *error = fmt::format("cuMemImportFromShareableHandle (piece {} of {}) on device {} failed: {}", i + 1, fds.size(),
                           device, d.error_name(r));
      return nullptr;  // the destructor releases what was imported
    }
    out->handles_.push_back(handle);
  }
  const std::size_t total = out->total_bytes_;
  CUdeviceptr base = 0;
  // Alignment 0: the granularity (a piece size of 20 MiB is no power of two, which an alignment must be).
  CUresult r = d.mem_address_reserve(&base, total, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    *error = fmt::format("cuMemAddressReserve(size={}) on device {} failed: {}", total, device, d.error_name(r));
    return nullptr;
  }
  out->base_ = static_cast<std::uintptr_t>(base);
  std::size_t at = 0;
  for (std::size_t i = 0; i < out->handles_.size(); ++i) {
    r = d.mem_map(base + at, sizes_bytes[i], 0, out->handles_[i], 0);
    if (r != CUDA_SUCCESS) {
      *error = fmt::format("cuMemMap (piece {} of {}, {} bytes) on device {} failed: {}", i + 1, fds.size(),
                           sizes_bytes[i], device, d.error_name(r));
      return nullptr;
    }
    ++out->mapped_;
    at += sizes_bytes[i];
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d.mem_set_access(base, total, &access, 1);
  if (r != CUDA_SUCCESS) {
    *error = fmt::format("cuMemSetAccess(size={}, read/write) on device {} failed: {}", total, device, d.error_name(r));
    return nullptr;
  }
  return out;
}

void CudaImportedPieces::undo() noexcept {
  const CudaDriver& d = CudaDriver::get();
  if (!d.missing.empty()) return;
  DeviceGuard guard(device_, true);
  if (mapped_ > 0) {
    // cuMemUnmap does not wait for kernels still reading the range.
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    std::size_t at = 0;
    for (std::size_t i = 0; i < mapped_; ++i) {
      (void)d.mem_unmap(base_ + at, sizes_[i]);
      at += sizes_[i];
    }
  }
  for (auto handle : handles_) (void)d.mem_release(handle);
  if (base_ != 0) (void)d.mem_address_free(base_, total_bytes_);
  mapped_ = 0;
  handles_.clear();
  base_ = 0;
}

CudaImportedPieces::~CudaImportedPieces() { undo(); }

// ---- CudaIpcMemImport

std::unique_ptr<CudaIpcMemImport> CudaIpcMemImport::open(int device, const char (&handle)[64], std::string* error) {
  DeviceGuard guard(device, false);
  if (guard.status() != cudaSuccess) {
    *error = fmt::format("cudaSetDevice({}) failed: {}", device, detail::runtime_error_words(guard.status()));
    return nullptr;
  }
  cudaIpcMemHandle_t h{};
  static_assert(sizeof(h) == sizeof(handle));
  std::memcpy(&h, handle, sizeof(h));
  void* ptr = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *error = fmt::format("cudaIpcOpenMemHandle on device {} failed: {}", device, detail::runtime_error_words(err));
    return nullptr;
  }
  return std::unique_ptr<CudaIpcMemImport>(new CudaIpcMemImport(device, ptr));
}

CudaIpcMemImport::~CudaIpcMemImport() {
  DeviceGuard guard(device_, false);
  if (cudaIpcCloseMemHandle(ptr_) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace gpumem::alloc
