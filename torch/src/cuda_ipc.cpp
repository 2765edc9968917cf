#include "cuda_ipc.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <span>
#include <vector>

#include "fd_passing.h"
#include "gpumem/alloc/cuda_ipc.h"
#include "gpumem/alloc/cuda_sources.h"
#include "ipc_handle.h"

namespace gpumem::torch::detail {
namespace {

class ImportedPieces final : public ImportedMemory {
 public:
  explicit ImportedPieces(std::unique_ptr<alloc::CudaImportedPieces> p) : pieces_(std::move(p)) {}
  void* base() const noexcept override { return reinterpret_cast<void*>(pieces_->base()); }

 private:
  std::unique_ptr<alloc::CudaImportedPieces> pieces_;
};

class ImportedCudaMalloc final : public ImportedMemory {
 public:
  explicit ImportedCudaMalloc(std::unique_ptr<alloc::CudaIpcMemImport> m) : memory_(std::move(m)) {}
  void* base() const noexcept override { return memory_->base(); }

 private:
  std::unique_ptr<alloc::CudaIpcMemImport> memory_;
};

// The descriptor server hands out only descriptors of exported pieces, checked under the lock
// their sources close them with.
void ensure_fd_server() {
  const std::string why = start_fd_server(
      [](std::span<const int> fds, const std::function<bool(std::span<const int>)>& send) {
        return alloc::send_if_exported(fds, send);
      });
  if (!why.empty()) {
    static bool warned = false;  // once: receivers still have pidfd_getfd
    if (!warned)
      std::fprintf(stderr, "gpumem: CUDA IPC: %s; receiving processes can only use pidfd_getfd\n", why.c_str());
    warned = true;
  }
}

std::variant<std::unique_ptr<ImportedMemory>, std::string> open_handle(const std::string& bytes, int device) {
  auto decoded = decode_ipc_handle(bytes);
  if (auto* why = std::get_if<std::string>(&decoded)) return "gpumem: cannot open a CUDA IPC handle: " + *why;
  const IpcHandle& handle = std::get<IpcHandle>(decoded);
  std::string error;
  if (handle.kind == IpcHandle::Kind::cuda_malloc) {
    char raw[kCudaIpcHandleBytes];
    std::copy(handle.cuda_handle.begin(), handle.cuda_handle.end(), raw);
    auto opened = alloc::CudaIpcMemImport::open(device, raw, &error);
    if (!opened) return "gpumem: cannot open a CUDA IPC handle of cudaMalloc memory: " + error;
    return std::unique_ptr<ImportedMemory>(new ImportedCudaMalloc(std::move(opened)));
  }
  const IpcPieces& p = handle.pieces;
  auto taken = take_fds(p.pid, std::span<const int>(p.fds.data(), p.fds.size()));
  if (auto* why = std::get_if<std::string>(&taken))
    return "gpumem: cannot open a CUDA IPC handle of process " + std::to_string(p.pid) + " (" +
           std::to_string(p.fds.size()) + " pieces): " + *why +
           ". The sending process must still hold the tensor; if it runs PyTorch's own allocator, allow "
           "pidfd_getfd (ptrace permission) or send from a gpumem process";
  auto& fds = std::get<std::vector<int>>(taken);
  const std::vector<std::size_t> sizes(p.sizes_bytes.begin(), p.sizes_bytes.end());
  auto imported = alloc::CudaImportedPieces::import(device, sizes, fds, &error);
  if (!imported)
    return "gpumem: cannot map the CUDA IPC handle of process " + std::to_string(p.pid) + " on device " +
           std::to_string(device) + ": " + error;
  return std::unique_ptr<ImportedMemory>(new ImportedPieces(std::move(imported)));
}

}  // namespace

std::variant<IpcShare, std::string> share_block(DeviceEngine& de, void* ptr) {
  const auto found = de.engine->lookup(ptr);
  if (!found || found->block_addr != reinterpret_cast<std::uintptr_t>(ptr))
    return "cannot share " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
           ": it is not the start of a live gpumem allocation";
  if (de.simulated)
    return std::string("the simulated device (source:sim) has no memory another process could map");
  alloc::MemorySource& source = de.source->inner();
  IpcShare share;
  if (auto* vmm = dynamic_cast<alloc::CudaVmmSource*>(&source)) {
    auto exported = vmm->export_pieces(found->block_addr, found->block_size_bytes);
    if (!exported.ok()) {
      std::string why = vmm->last_error();
      if (exported.status == alloc::SourceStatus::unsupported)
        why += ". Set ipc_handles:True (the default) in GPUMEM_ALLOC_CONF, or use source:cuda_malloc, to share CUDA "
               "tensors between processes";
      return why;
    }
    std::vector<SharedPiece> pieces;
    for (const auto& piece : exported.value) pieces.push_back({piece.va, piece.size_bytes, piece.fd});
    auto plan = plan_piece_share(found->block_addr, found->block_size_bytes, pieces, static_cast<std::int32_t>(::getpid()));
    if (auto* why = std::get_if<std::string>(&plan)) return *why;
    auto& piece_share = std::get<PieceShare>(plan);
    ensure_fd_server();
    IpcHandle handle;
    handle.kind = IpcHandle::Kind::pieces;
    handle.pieces = std::move(piece_share.pieces);
    share.offset_bytes = static_cast<std::ptrdiff_t>(piece_share.offset_bytes);
    share.handle = encode_ipc_handle(handle);
    return share;
  }
  if (auto* malloc_source = dynamic_cast<alloc::CudaMallocSource*>(&source)) {
    auto got = malloc_source->ipc_mem_handle(found->block_addr);
    if (!got.ok()) return malloc_source->last_error();
    IpcHandle handle;
    handle.kind = IpcHandle::Kind::cuda_malloc;
    std::copy(std::begin(got.value.bytes), std::end(got.value.bytes), handle.cuda_handle.begin());
    share.offset_bytes = static_cast<std::ptrdiff_t>(found->block_addr - got.value.allocation_base);
    share.handle = encode_ipc_handle(handle);
    return share;
  }
  return std::string("this device's memory source cannot share memory with other processes");
}

IpcOpener cuda_ipc_opener() { return &open_handle; }

std::string check_ipc_handle(const std::string& bytes) {
  auto decoded = decode_ipc_handle(bytes);
  if (auto* why = std::get_if<std::string>(&decoded)) return "gpumem: cannot open a CUDA IPC handle: " + *why;
  return {};
}

}  // namespace gpumem::torch::detail
