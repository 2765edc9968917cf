#include "fd_passing.h"

#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>

// Older C libraries lack the numbers; the kernel may still have the calls (added in 5.3 / 5.6).
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace gpumem::torch::detail {
namespace {

constexpr std::uint32_t kRequestMagic = 0x676d6664;  // "gmfd"
constexpr std::size_t kMaxFdsPerMessage = 250;         // the kernel's SCM_MAX_FD is 253
constexpr int kSocketTimeoutSeconds = 20;

std::string errno_words(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

void close_all(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

std::string by_pidfd(int pid, std::span<const int> remote, std::vector<int>& out) {
  const long pidfd = ::syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) return "pidfd_open(" + std::to_string(pid) + "): " + errno_words(errno);
  for (int fd : remote) {
    const long mine = ::syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), fd, 0);
    if (mine < 0) {
      const int err = errno;
      ::close(static_cast<int>(pidfd));
      close_all(out);
      return "pidfd_getfd(process " + std::to_string(pid) + ", fd " + std::to_string(fd) + "): " + errno_words(err) +
             (err == EPERM ? " (ptrace permission denied: Yama ptrace_scope or a seccomp profile)" : "");
    }
    out.push_back(static_cast<int>(mine));
  }
  ::close(static_cast<int>(pidfd));
  return {};
}

sockaddr_un socket_address(int pid, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = fd_socket_name(pid);
  addr.sun_path[0] = '\0';  // abstract namespace: no file, gone when the process ends
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

void set_timeouts(int sock) {
  timeval tv{};
  tv.tv_sec = kSocketTimeoutSeconds;
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

bool write_all(int sock, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(sock, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int sock, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(sock, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// One batch over one connection: request {magic, count, fds...}; reply one status byte (0: the
// descriptors follow as SCM_RIGHTS on it; 1: refused).
std::string socket_batch(int pid, std::span<const int> remote, std::vector<int>& out) {
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return "socket(AF_UNIX): " + errno_words(errno);
  set_timeouts(sock);
  socklen_t len = 0;
  const sockaddr_un addr = socket_address(pid, &len);
  if (::connect(sock, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    ::close(sock);
    return "connect to gpumem's descriptor socket of process " + std::to_string(pid) + ": " + errno_words(err) +
           (err == ECONNREFUSED ? " (that process does not run gpumem's descriptor server)" : "");
  }
  std::vector<std::int32_t> request = {static_cast<std::int32_t>(kRequestMagic),
                                       static_cast<std::int32_t>(remote.size())};
  request.insert(request.end(), remote.begin(), remote.end());
  if (!write_all(sock, request.data(), request.size() * sizeof(std::int32_t))) {
    const int err = errno;
    ::close(sock);
    return "sending the request to process " + std::to_string(pid) + ": " + errno_words(err);
  }
  char status = 1;
  iovec iov{&status, 1};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * remote.size()));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t r = 0;
  do r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  const int err = errno;
  ::close(sock);
  if (r != 1) return "no answer from process " + std::to_string(pid) + "'s descriptor server: " + errno_words(err);
  std::size_t got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.push_back(fd);
      ++got;
    }
  }
  if (status != 0 || got != remote.size() || (msg.msg_flags & MSG_CTRUNC) != 0) {
    return "process " + std::to_string(pid) + "'s descriptor server " +
           (status != 0 ? std::string("refused: the descriptors are not exported pieces (already freed?)")
                        : "sent " + std::to_string(got) + " of " + std::to_string(remote.size()) + " descriptors");
  }
  return {};
}

std::string by_socket(int pid, std::span<const int> remote, std::vector<int>& out) {
  for (std::size_t i = 0; i < remote.size(); i += kMaxFdsPerMessage) {
    const std::size_t n = std::min(kMaxFdsPerMessage, remote.size() - i);
    if (std::string why = socket_batch(pid, remote.subspan(i, n), out); !why.empty()) {
      close_all(out);
      return why;
    }
  }
  return {};
}

// ---- the server

void serve_one(int conn, const FdGuard& guard) {
  set_timeouts(conn);
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || (peer.uid != ::getuid() && peer.uid != 0))
    return;  // another user: say nothing
  std::int32_t header[2] = {};
  if (!read_all(conn, header, sizeof(header)) || static_cast<std::uint32_t>(header[0]) != kRequestMagic ||
      header[1] <= 0 || static_cast<std::size_t>(header[1]) > kMaxFdsPerMessage)
    return;
  std::vector<int> fds(static_cast<std::size_t>(header[1]));
  if (!read_all(conn, fds.data(), fds.size() * sizeof(int))) return;
  auto send = [conn](std::span<const int> allowed) {
    char status = 0;
    iovec iov{&status, 1};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * allowed.size()));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * allowed.size());
    std::memcpy(CMSG_DATA(c), allowed.data(), sizeof(int) * allowed.size());
    ssize_t w = 0;
    do w = ::sendmsg(conn, &msg, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    return w == 1;
  };
  if (!guard(fds, send)) {
    const char refused = 1;
    (void)write_all(conn, &refused, 1);
  }
}

struct Server {
  std::mutex mutex;
  pid_t pid = 0;  // the process whose server runs (a forked child has none)
};

Server& server() {
  static auto* s = new Server();  // never destroyed: the thread outlives static destruction
  return *s;
}

}  // namespace

std::string fd_socket_name(int pid) { return "gpumem-ipc-fds-" + std::to_string(pid); }

std::variant<std::vector<int>, std::string> take_fds(int pid, std::span<const int> remote_fds, FdRoute route) {
  std::vector<int> out;
  std::string pidfd_why, socket_why;
  if (route != FdRoute::socket_only) {
    pidfd_why = by_pidfd(pid, remote_fds, out);
    if (pidfd_why.empty()) return out;
  }
  if (route != FdRoute::pidfd_only) {
    socket_why = by_socket(pid, remote_fds, out);
    if (socket_why.empty()) return out;
  }
  std::string why = "cannot take the exporting process's file descriptors: ";
  if (!pidfd_why.empty()) why += pidfd_why;
  if (!pidfd_why.empty() && !socket_why.empty()) why += "; then ";
  if (!socket_why.empty()) why += socket_why;
  return why;
}

std::string start_fd_server(FdGuard guard) {
  Server& s = server();
  std::lock_guard lock(s.mutex);
  if (s.pid == ::getpid()) return {};
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return "socket(AF_UNIX): " + errno_words(errno);
  socklen_t len = 0;
  const sockaddr_un addr = socket_address(::getpid(), &len);
  if (::bind(sock, reinterpret_cast<const sockaddr*>(&addr), len) != 0 || ::listen(sock, 64) != 0) {
    const int err = errno;
    ::close(sock);
    return "binding gpumem's descriptor socket @" + fd_socket_name(::getpid()) + ": " + errno_words(err);
  }
  std::thread([sock, guard = std::move(guard)] {
    for (;;) {
      const int conn = ::accept4(sock, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
          if (errno == EMFILE || errno == ENFILE) ::usleep(10000);
          continue;
        }
        return;  // the socket is gone
      }
      serve_one(conn, guard);
      ::close(conn);
    }
  }).detach();
  s.pid = ::getpid();
  return {};
}

}  // namespace gpumem::torch::detail
