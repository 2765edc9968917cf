// The process-wide set of file descriptors CudaVmmSources exported (cuda_ipc.h): a descriptor is
// in it from cuMemExportToShareableHandle until the source closes it (the piece is destroyed).
// send_if_exported (cuda_ipc.h) hands descriptors to another process only while they are in it,
// holding the lock close_exported_fd takes, so a descriptor number that was closed and reused for
// something else is never sent.
//
// Thread-safety: all functions are safe to call concurrently (one mutex).
#pragma once

namespace gpumem::alloc::detail {

void add_exported_fd(int fd);
// Removes fd from the set and closes it.
void close_exported_fd(int fd);

}  // namespace gpumem::alloc::detail
