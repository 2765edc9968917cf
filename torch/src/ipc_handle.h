// The bytes of a CUDA IPC handle, as PyTorch 2.11's CUDACachingAllocator writes them in
// shareIpcHandle and reads them in getIpcDevPtr, so that unmodified torch.multiprocessing moves
// tensors between a gpumem process and a process on PyTorch's own allocator, either way:
//
//   legacy (older PyTorch):  64 bytes, a cudaIpcMemHandle_t
//   versioned:               version byte (2), then a type byte:
//     'c'  cudaMalloc memory: the 64-byte cudaIpcMemHandle_t of the allocation
//     'e'  pieces of virtual memory (PyTorch's expandable segments; gpumem's pieces):
//          ShareHeader {int32 pid, 4 zero bytes, uint64 piece_bytes, uint64 count} (native byte
//          order, PyTorch's struct layout), then count int32 file descriptors, the exporting
//          process's numbers, taken with pidfd_getfd (or gpumem's socket, fd_passing.h).
//     'g'  gpumem's pieces of different sizes (pieces:adaptive), which 'e' cannot describe: the
//          same header with piece_bytes 0, the count descriptors, then count uint64 piece sizes.
//          Only gpumem opens it (PyTorch's allocator refuses the type byte); blocks on pieces of
//          one size are sent as 'e'.
//
// The storage offset is not in the handle: shareIpcHandle returns it beside the bytes (offset of
// the block from the allocation or first piece). The consumer caches imports by the handle's
// bytes, so equal handles must be byte-equal (the padding is zero).
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gpumem::torch::detail {

inline constexpr char kIpcHandleVersion = 2;
inline constexpr char kIpcTypeCudaMalloc = 'c';
inline constexpr char kIpcTypePieces = 'e';
inline constexpr char kIpcTypeMixedPieces = 'g';
inline constexpr std::size_t kCudaIpcHandleBytes = 64;
inline constexpr std::size_t kIpcShareHeaderBytes = 24;
// Limits a handle read from outside must respect (a corrupt count must not allocate terabytes).
inline constexpr std::uint64_t kIpcMaxPieces = std::uint64_t{1} << 20;

struct IpcPieces {
  std::int32_t pid = 0;            // the exporting process
  std::vector<std::int32_t> fds;           // the exporter's descriptor numbers, in address order
  std::vector<std::uint64_t> sizes_bytes;  // each piece's size, same order and length as fds
  // Whether every piece has one size (sent as PyTorch's 'e'; else gpumem's 'g').
  bool one_size() const noexcept;
};

struct IpcHandle {
  enum class Kind : std::uint8_t { cuda_malloc, pieces };
  Kind kind = Kind::pieces;
  std::array<char, kCudaIpcHandleBytes> cuda_handle{};  // Kind::cuda_malloc
  IpcPieces pieces;                                       // Kind::pieces
};

// The versioned form (version 2).
std::string encode_ipc_handle(const IpcHandle& handle);

// The handle, or one sentence saying what is wrong with the bytes.
std::variant<IpcHandle, std::string> decode_ipc_handle(std::string_view bytes);

// A mapped piece as the exporter sees it.
struct SharedPiece {
  std::uintptr_t va = 0;
  std::size_t size_bytes = 0;
  int fd = -1;
};

struct PieceShare {
  IpcPieces pieces;
  std::size_t offset_bytes = 0;  // block_addr - the first piece's address
};

// The handle for the block [block_addr, block_addr + block_bytes) mapped by `pieces` (address
// order, as CudaVmmSource::export_pieces returns them): they must be back to back and cover the
// block. Otherwise one sentence why not.
std::variant<PieceShare, std::string> plan_piece_share(std::uintptr_t block_addr, std::size_t block_bytes,
                                                       const std::vector<SharedPiece>& pieces, std::int32_t pid);

}  // namespace gpumem::torch::detail
