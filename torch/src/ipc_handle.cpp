#include "ipc_handle.h"

#include <cstring>

namespace gpumem::torch::detail {
namespace {

// PyTorch's ShareHeader {pid_t pid; size_t segment_size; size_t num_handles;} on LP64.
constexpr std::size_t kPidOffset = 0;
constexpr std::size_t kPieceBytesOffset = 8;
constexpr std::size_t kCountOffset = 16;

template <class T>
void put(std::string& out, std::size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <class T>
T get(std::string_view in, std::size_t at) {
  T value{};
  std::memcpy(&value, in.data() + at, sizeof(T));
  return value;
}

}  // namespace

bool IpcPieces::one_size() const noexcept {
  for (auto s : sizes_bytes)
    if (s != sizes_bytes.front()) return false;
  return true;
}

std::string encode_ipc_handle(const IpcHandle& handle) {
  std::string out;
  out.push_back(kIpcHandleVersion);
  if (handle.kind == IpcHandle::Kind::cuda_malloc) {
    out.push_back(kIpcTypeCudaMalloc);
    out.append(handle.cuda_handle.data(), handle.cuda_handle.size());
    return out;
  }
  const IpcPieces& p = handle.pieces;
  const bool one_size = p.one_size();
  out.push_back(one_size ? kIpcTypePieces : kIpcTypeMixedPieces);
  std::string header(kIpcShareHeaderBytes, '\0');
  put<std::int32_t>(header, kPidOffset, p.pid);
  put<std::uint64_t>(header, kPieceBytesOffset, one_size && !p.sizes_bytes.empty() ? p.sizes_bytes.front() : 0);
  put<std::uint64_t>(header, kCountOffset, p.fds.size());
  out += header;
  for (std::int32_t fd : p.fds) out.append(reinterpret_cast<const char*>(&fd), sizeof(fd));
  if (!one_size)
    for (std::uint64_t s : p.sizes_bytes) out.append(reinterpret_cast<const char*>(&s), sizeof(s));
  return out;
}

std::variant<IpcHandle, std::string> decode_ipc_handle(std::string_view bytes) {
  IpcHandle handle;
  if (bytes.size() == kCudaIpcHandleBytes) {  // an older PyTorch: a bare cudaIpcMemHandle_t
    handle.kind = IpcHandle::Kind::cuda_malloc;
    std::memcpy(handle.cuda_handle.data(), bytes.data(), kCudaIpcHandleBytes);
    return handle;
  }
  if (bytes.size() < 2)
    return std::string("the CUDA IPC handle is ") + std::to_string(bytes.size()) +
           " bytes long; a handle from shareIpcHandle has at least 2";
  const int version = static_cast<unsigned char>(bytes[0]);
  if (version > kIpcHandleVersion)
    return "the CUDA IPC handle has version " + std::to_string(version) + "; this gpumem reads versions up to " +
           std::to_string(kIpcHandleVersion) + " (the sending process runs a newer PyTorch or gpumem)";
  const char type = bytes[1];
  const std::string_view body = bytes.substr(2);
  if (type == kIpcTypeCudaMalloc) {
    if (body.size() != kCudaIpcHandleBytes)
      return "the CUDA IPC handle of type 'c' carries " + std::to_string(body.size()) + " bytes instead of " +
             std::to_string(kCudaIpcHandleBytes);
    handle.kind = IpcHandle::Kind::cuda_malloc;
    std::memcpy(handle.cuda_handle.data(), body.data(), kCudaIpcHandleBytes);
    return handle;
  }
  if (type != kIpcTypePieces && type != kIpcTypeMixedPieces)
    return std::string("the CUDA IPC handle has the unknown type byte ") +
           std::to_string(static_cast<unsigned char>(type)) + " (known: 'c', 'e', 'g')";
  const bool mixed = type == kIpcTypeMixedPieces;
  const std::string kind = mixed ? "'g'" : "'e'";
  if (body.size() < kIpcShareHeaderBytes)
    return "the CUDA IPC handle of type " + kind + " is " + std::to_string(bytes.size()) +
           " bytes, shorter than its header";
  handle.kind = IpcHandle::Kind::pieces;
  handle.pieces.pid = get<std::int32_t>(body, kPidOffset);
  const auto piece_bytes = get<std::uint64_t>(body, kPieceBytesOffset);
  const auto count = get<std::uint64_t>(body, kCountOffset);
  if (handle.pieces.pid <= 0) return "the CUDA IPC handle names process " + std::to_string(handle.pieces.pid);
  if ((!mixed && piece_bytes == 0) || count == 0 || count > kIpcMaxPieces)
    return "the CUDA IPC handle describes " + std::to_string(count) + " pieces of " + std::to_string(piece_bytes) +
           " bytes";
  const std::size_t per_piece = sizeof(std::int32_t) + (mixed ? sizeof(std::uint64_t) : 0);
  if (body.size() != kIpcShareHeaderBytes + count * per_piece)
    return "the CUDA IPC handle of type " + kind + " announces " + std::to_string(count) + " pieces but carries " +
           std::to_string(body.size() - kIpcShareHeaderBytes) + " bytes for them";
  handle.pieces.fds.resize(count);
  std::memcpy(handle.pieces.fds.data(), body.data() + kIpcShareHeaderBytes, count * sizeof(std::int32_t));
  if (!mixed) {
    handle.pieces.sizes_bytes.assign(count, piece_bytes);
    return handle;
  }
  handle.pieces.sizes_bytes.resize(count);
  std::memcpy(handle.pieces.sizes_bytes.data(), body.data() + kIpcShareHeaderBytes + count * sizeof(std::int32_t),
              count * sizeof(std::uint64_t));
  for (auto s : handle.pieces.sizes_bytes)
    if (s == 0) return std::string("the CUDA IPC handle of type 'g' has a piece of 0 bytes");
  return handle;
}

std::variant<PieceShare, std::string> plan_piece_share(std::uintptr_t block_addr, std::size_t block_bytes,
                                                       const std::vector<SharedPiece>& pieces, std::int32_t pid) {
  if (pieces.empty()) return std::string("no mapped piece holds the block");
  if (pieces.front().va > block_addr) return std::string("the block starts before its first mapped piece");
  std::uintptr_t next = pieces.front().va;
  PieceShare share;
  share.pieces.pid = pid;
  for (const auto& piece : pieces) {
    if (piece.va != next) return std::string("the pieces under the block are not back to back");
    if (piece.fd < 0) return std::string("a piece under the block has no exported descriptor");
    share.pieces.fds.push_back(piece.fd);
    share.pieces.sizes_bytes.push_back(piece.size_bytes);
    next += piece.size_bytes;
  }
  if (next < block_addr + block_bytes) return std::string("the pieces do not cover the block");
  share.offset_bytes = block_addr - pieces.front().va;
  return share;
}

}  // namespace gpumem::torch::detail
