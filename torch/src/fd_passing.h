// File descriptors from one process to another (same user), for CUDA IPC handles of type 'e'
// (ipc_handle.h), which carry the exporting process's descriptor numbers.
//
// take_fds tries, in order:
//   1. pidfd_getfd (Linux >= 5.6): what PyTorch's own allocator does. It needs ptrace permission
//      over the exporter, which a Yama ptrace_scope of 1 (only descendants) or a container's
//      seccomp profile (Docker's default refuses it without CAP_SYS_PTRACE) can deny.
//   2. The exporter's gpumem socket: an abstract Unix socket named after its pid
//      (fd_socket_name), served by start_fd_server, that sends the descriptors with SCM_RIGHTS.
// The server answers only peers of the same user (or root) and sends only descriptors its guard
// lets through (the CUDA adapter's guard is alloc::send_if_exported: descriptors of exported
// pieces, checked under the lock their sources close them with).
//
// Thread-safety: take_fds may be called from any thread; start_fd_server is idempotent (one
// server per process; a forked child starts its own when it first exports).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace gpumem::torch::detail {

enum class FdRoute { any, pidfd_only, socket_only };

// Copies, owned by the caller, of the descriptors `remote_fds` (numbers in process pid). On
// failure none is left open, and the string says what each route answered.
std::variant<std::vector<int>, std::string> take_fds(int pid, std::span<const int> remote_fds,
                                                      FdRoute route = FdRoute::any);

// guard(fds, send): calls send(fds) and returns its answer if fds may be handed out; else false.
using FdGuard = std::function<bool(std::span<const int>, const std::function<bool(std::span<const int>)>&)>;

// Starts this process's descriptor server (a detached thread) unless it runs already. Returns ""
// or why it could not start (take_fds in other processes then has only pidfd_getfd).
std::string start_fd_server(FdGuard guard);

// The abstract socket name of process pid's server (without the leading NUL).
std::string fd_socket_name(int pid);

}  // namespace gpumem::torch::detail
