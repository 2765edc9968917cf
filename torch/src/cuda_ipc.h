// CUDA IPC for the c10 allocator (cuda_allocator.cpp): shareIpcHandle and getIpcDevPtr, built on
// the handle format (ipc_handle.h), descriptor passing (fd_passing.h), the import cache
// (ipc_imports.h) and the CUDA sources' export and import (gpumem/alloc/cuda_ipc.h). See
// Note [IPC of pieces] in docs/notes/cuda-ipc.md.
//
// No torch header here: errors come back as strings; the caller raises them.
// Thread-safety: share_block may run concurrently with the engine's calls (it holds no engine
// lock; the block must stay allocated while it runs, which the caller's storage guarantees);
// the opener is safe to call from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <variant>

#include "device_engine.h"
#include "ipc_imports.h"

namespace gpumem::torch::detail {

struct IpcShare {
  std::ptrdiff_t offset_bytes = 0;  // of the block inside what the handle maps
  std::string handle;               // ipc_handle.h's bytes
};

// The IPC handle of the live block that starts at ptr in de's engine, or one sentence why it
// cannot be shared (not a block start, a simulated device, pieces not exportable).
std::variant<IpcShare, std::string> share_block(DeviceEngine& de, void* ptr);

// Opens handles of type 'c' (cudaIpcOpenMemHandle) and 'e' (pieces, through take_fds and
// CudaImportedPieces), from gpumem or from PyTorch's own allocator.
IpcOpener cuda_ipc_opener();

// Empty if bytes decode as a CUDA IPC handle, else the sentence the caller raises (before it asks
// CUDA for anything).
std::string check_ipc_handle(const std::string& bytes);

}  // namespace gpumem::torch::detail
