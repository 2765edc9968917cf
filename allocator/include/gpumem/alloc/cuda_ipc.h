// CUDA memory shared between processes (IPC), the provider side: what the torch adapter's
// shareIpcHandle / getIpcDevPtr build on. See Note [IPC of pieces] in docs/notes/cuda-ipc.md.
//
//   exporting process                          importing process
//   CudaVmmSource::export_pieces(va, size)      (descriptors taken from the exporter: pidfd_getfd,
//     -> pieces and their POSIX descriptors      or send_if_exported through a socket)
//                                               CudaImportedPieces::import(device, piece_bytes, fds)
//   CudaMallocSource::ipc_mem_handle(addr)      CudaIpcMemImport::open(device, handle)
//
// An import maps the exporter's physical memory into a fresh address range of this process; it
// stays valid while the import object lives, whatever the exporter does with its own mapping (the
// physical memory lives until both sides have released it). Data written on one side is seen by
// the other once the writer's stream work is complete (the caller orders it, e.g. with an IPC
// event, as torch.multiprocessing does).
//
// Thread-safety: the functions are safe to call concurrently; one import object is not shared
// between threads without the caller's synchronization (its destructor must run once).
#pragma once

#if !defined(GPUMEM_HAVE_CUDA)
#error "gpumem/alloc/cuda_ipc.h needs the CUDA build of gpumem_alloc (GPUMEM_HAVE_CUDA)"
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gpumem::alloc {

// Calls send(fds) if every descriptor in fds is one a CudaVmmSource of this process exported and
// has not closed, holding the lock under which sources close them; returns send's answer, or false
// (without calling send) if one is not.
bool send_if_exported(std::span<const int> fds, const std::function<bool(std::span<const int>)>& send);

// Another process's pieces (all piece_bytes long), imported from descriptors this process owns and
// mapped back to back into a fresh address range, read/write for `device`.
class CudaImportedPieces {
 public:
  // Imports and maps the pieces back to back, piece i of sizes_bytes[i] bytes (multiples of the
  // device's granularity); closes every descriptor in fds whatever happens. On failure returns
  // null and sets *error to one sentence (the driver call that failed and why).
  static std::unique_ptr<CudaImportedPieces> import(int device, std::span<const std::size_t> sizes_bytes,
                                                    std::span<const int> fds, std::string* error);
  // Waits for the device's work (the driver does not order unmapping after running kernels),
  // unmaps, releases the imported handles and frees the address range. Errors are ignored.
  ~CudaImportedPieces();
  CudaImportedPieces(const CudaImportedPieces&) = delete;
  CudaImportedPieces& operator=(const CudaImportedPieces&) = delete;

  std::uintptr_t base() const noexcept { return base_; }
  std::size_t size_bytes() const noexcept { return total_bytes_; }

 private:
  CudaImportedPieces(int device, std::vector<std::size_t> sizes) : device_(device), sizes_(std::move(sizes)) {
    for (auto s : sizes_) total_bytes_ += s;
  }
  void undo() noexcept;

  int device_;
  std::vector<std::size_t> sizes_;  // of each piece, in address order
  std::size_t total_bytes_ = 0;
  std::uintptr_t base_ = 0;   // the reserved range (0 until reserved)
  std::size_t mapped_ = 0;    // handles mapped so far, from base_
  std::vector<unsigned long long> handles_;  // CUmemGenericAllocationHandle, imported
};

// A cudaMalloc allocation of another process, opened with cudaIpcOpenMemHandle.
class CudaIpcMemImport {
 public:
  // handle: the 64 bytes of a cudaIpcMemHandle_t. On failure returns null and sets *error.
  static std::unique_ptr<CudaIpcMemImport> open(int device, const char (&handle)[64], std::string* error);
  ~CudaIpcMemImport();  // cudaIpcCloseMemHandle (errors ignored)
  CudaIpcMemImport(const CudaIpcMemImport&) = delete;
  CudaIpcMemImport& operator=(const CudaIpcMemImport&) = delete;

  void* base() const noexcept { return ptr_; }

 private:
  CudaIpcMemImport(int device, void* ptr) : device_(device), ptr_(ptr) {}
  int device_;
  void* ptr_;
};

}  // namespace gpumem::alloc
