// CUDA IPC's parts that need no GPU (white-box, through torch/src): the handle bytes PyTorch 2.11
// writes and reads, the plan of a pieces handle, descriptor passing between two processes
// (pidfd_getfd and gpumem's socket, with memfds standing in for exported pieces), and the import
// cache's sharing and release (a fake opener). scripts/gpu/package.sh runs the real thing:
// torch.multiprocessing between processes on the H200.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "fd_passing.h"
#include "ipc_handle.h"
#include "ipc_imports.h"

using namespace gpumem::torch::detail;

namespace {

IpcHandle pieces_handle(std::int32_t pid, std::uint64_t piece_bytes, std::vector<std::int32_t> fds) {
  IpcHandle h;
  h.kind = IpcHandle::Kind::pieces;
  h.pieces.pid = pid;
  h.pieces.sizes_bytes.assign(fds.size(), piece_bytes);
  h.pieces.fds = std::move(fds);
  return h;
}

template <class T>
T read_at(const std::string& s, std::size_t at) {
  T v{};
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

}  // namespace

TEST_CASE("a pieces handle has PyTorch's bytes: version 2, 'e', ShareHeader, descriptors", "[ipc][handle]") {
  const std::string bytes = encode_ipc_handle(pieces_handle(4242, 20 << 20, {7, 9, 11}));
  REQUIRE(bytes.size() == 2 + 24 + 3 * 4);
  CHECK(bytes[0] == 2);
  CHECK(bytes[1] == 'e');
  // struct ShareHeader { pid_t pid; size_t segment_size; size_t num_handles; } with zeroed padding
  CHECK(read_at<std::int32_t>(bytes, 2) == 4242);
  CHECK(read_at<std::int32_t>(bytes, 6) == 0);
  CHECK(read_at<std::uint64_t>(bytes, 10) == (20u << 20));
  CHECK(read_at<std::uint64_t>(bytes, 18) == 3);
  CHECK(read_at<std::int32_t>(bytes, 26) == 7);
  CHECK(read_at<std::int32_t>(bytes, 34) == 11);

  auto decoded = decode_ipc_handle(bytes);
  REQUIRE(std::holds_alternative<IpcHandle>(decoded));
  const IpcHandle& h = std::get<IpcHandle>(decoded);
  CHECK(h.kind == IpcHandle::Kind::pieces);
  CHECK(h.pieces.pid == 4242);
  CHECK(h.pieces.sizes_bytes == std::vector<std::uint64_t>(3, 20u << 20));
  CHECK(h.pieces.fds == std::vector<std::int32_t>{7, 9, 11});
  // Equal handles are byte-equal (the consumer's cache key).
  CHECK(encode_ipc_handle(h) == bytes);
}

TEST_CASE("cudaMalloc handles: versioned 'c' and the bare 64 bytes of older PyTorch", "[ipc][handle]") {
  IpcHandle h;
  h.kind = IpcHandle::Kind::cuda_malloc;
  for (std::size_t i = 0; i < h.cuda_handle.size(); ++i) h.cuda_handle[i] = static_cast<char>(i * 3 + 1);
  const std::string bytes = encode_ipc_handle(h);
  REQUIRE(bytes.size() == 66);
  CHECK(bytes[0] == 2);
  CHECK(bytes[1] == 'c');
  auto decoded = decode_ipc_handle(bytes);
  REQUIRE(std::holds_alternative<IpcHandle>(decoded));
  CHECK(std::get<IpcHandle>(decoded).cuda_handle == h.cuda_handle);

  auto legacy = decode_ipc_handle(bytes.substr(2));
  REQUIRE(std::holds_alternative<IpcHandle>(legacy));
  CHECK(std::get<IpcHandle>(legacy).kind == IpcHandle::Kind::cuda_malloc);
  CHECK(std::get<IpcHandle>(legacy).cuda_handle == h.cuda_handle);
}

TEST_CASE("malformed handles are refused with words, never read past their end", "[ipc][handle]") {
  const std::string good = encode_ipc_handle(pieces_handle(77, 2 << 20, {3, 4}));
  auto why = [](const std::string& bytes) {
    auto d = decode_ipc_handle(bytes);
    REQUIRE(std::holds_alternative<std::string>(d));
    return std::get<std::string>(d);
  };
  CHECK(why("").find("0 bytes") != std::string::npos);
  std::string future = good;
  future[0] = 3;
  CHECK(why(future).find("newer PyTorch") != std::string::npos);
  std::string unknown = good;
  unknown[1] = 'x';
  CHECK(why(unknown).find("unknown type") != std::string::npos);
  CHECK(why(good.substr(0, 20)).find("shorter than its header") != std::string::npos);
  CHECK(why(good.substr(0, good.size() - 1)).find("announces 2 pieces") != std::string::npos);
  std::string huge = good;
  const std::uint64_t count = std::uint64_t{1} << 40;
  std::memcpy(huge.data() + 18, &count, sizeof(count));
  CHECK(why(huge).find("pieces of") != std::string::npos);
  std::string short_c = encode_ipc_handle(IpcHandle{IpcHandle::Kind::cuda_malloc, {}, {}});
  CHECK(why(short_c + "x").find("instead of 64") != std::string::npos);
}

TEST_CASE("pieces of different sizes (pieces:adaptive) travel as gpumem's 'g': sizes after the descriptors",
          "[ipc][handle]") {
  IpcHandle h = pieces_handle(77, 0, {3, 4, 5});
  h.pieces.sizes_bytes = {2u << 20, 8u << 20, 2u << 20};
  const std::string bytes = encode_ipc_handle(h);
  REQUIRE(bytes.size() == 2 + 24 + 3 * 4 + 3 * 8);
  CHECK(bytes[1] == 'g');
  CHECK(read_at<std::uint64_t>(bytes, 10) == 0);  // no single piece size
  CHECK(read_at<std::uint64_t>(bytes, 18) == 3);
  CHECK(read_at<std::uint64_t>(bytes, 2 + 24 + 12 + 8) == (8u << 20));
  auto decoded = decode_ipc_handle(bytes);
  REQUIRE(std::holds_alternative<IpcHandle>(decoded));
  CHECK(std::get<IpcHandle>(decoded).pieces.sizes_bytes == h.pieces.sizes_bytes);
  CHECK(std::get<IpcHandle>(decoded).pieces.fds == h.pieces.fds);
  CHECK(encode_ipc_handle(std::get<IpcHandle>(decoded)) == bytes);
  // Truncated, or a piece of 0 bytes: refused with words.
  auto why = [](const std::string& b) {
    auto r = decode_ipc_handle(b);
    REQUIRE(std::holds_alternative<std::string>(r));
    return std::get<std::string>(r);
  };
  CHECK(why(bytes.substr(0, bytes.size() - 8)).find("announces 3 pieces") != std::string::npos);
  std::string zero = bytes;
  std::memset(zero.data() + 2 + 24 + 12, 0, 8);
  CHECK(why(zero).find("0 bytes") != std::string::npos);
}

TEST_CASE("a block's pieces handle: offset from the first piece; gaps refused", "[ipc][handle]") {
  const std::size_t mib = 1 << 20;
  const std::uintptr_t base = 0x7f0000000000;
  std::vector<SharedPiece> pieces = {{base, 20 * mib, 5}, {base + 20 * mib, 20 * mib, 6}};
  auto plan = plan_piece_share(base + 3 * mib, 30 * mib, pieces, 99);
  REQUIRE(std::holds_alternative<PieceShare>(plan));
  const PieceShare& share = std::get<PieceShare>(plan);
  CHECK(share.offset_bytes == 3 * mib);
  CHECK(share.pieces.pid == 99);
  CHECK(share.pieces.sizes_bytes == std::vector<std::uint64_t>{20 * mib, 20 * mib});
  CHECK(share.pieces.fds == std::vector<std::int32_t>{5, 6});
  // Pieces of different sizes under one block (pieces:adaptive) are shared too.
  auto mixed = plan_piece_share(base + mib, 10 * mib, {{base, 2 * mib, 5}, {base + 2 * mib, 8 * mib, 6},
                                                        {base + 10 * mib, 2 * mib, 7}}, 99);
  REQUIRE(std::holds_alternative<PieceShare>(mixed));
  CHECK(std::get<PieceShare>(mixed).pieces.sizes_bytes == std::vector<std::uint64_t>{2 * mib, 8 * mib, 2 * mib});
  CHECK(std::get<PieceShare>(mixed).offset_bytes == mib);

  auto refused = [&](const std::vector<SharedPiece>& p, std::size_t block_bytes) {
    auto r = plan_piece_share(base, block_bytes, p, 99);
    REQUIRE(std::holds_alternative<std::string>(r));
    return std::get<std::string>(r);
  };
  CHECK(refused({{base, 20 * mib, 5}, {base + 40 * mib, 20 * mib, 6}}, 50 * mib).find("back to back") !=
        std::string::npos);
  CHECK(refused({{base, 20 * mib, 5}}, 30 * mib).find("do not cover") != std::string::npos);
  CHECK(refused({}, mib).find("no mapped piece") != std::string::npos);
}

namespace {

// A child process that holds `count` memfds (piece i filled with byte 'A' + i), serves them with
// gpumem's descriptor server (its guard lets through only those), and waits for a byte on a pipe.
struct ServingChild {
  pid_t pid = -1;
  std::vector<int> fds;  // the child's numbers
  int release_fd = -1;   // write a byte to let it exit

  explicit ServingChild(int count) {
    int to_parent[2], to_child[2];
    REQUIRE(::pipe(to_parent) == 0);
    REQUIRE(::pipe(to_child) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::vector<int> mine;
      for (int i = 0; i < count; ++i) {
        const int fd = static_cast<int>(::memfd_create("gpumem-test-piece", 0));
        if (fd < 0 || ::ftruncate(fd, 4096) != 0) ::_exit(2);
        std::string fill(4096, static_cast<char>('A' + i));
        if (::pwrite(fd, fill.data(), fill.size(), 0) != 4096) ::_exit(3);
        mine.push_back(fd);
      }
      std::set<int> allowed(mine.begin(), mine.end());
      const std::string why =
          start_fd_server([allowed](std::span<const int> fds, const std::function<bool(std::span<const int>)>& send) {
            for (int fd : fds)
              if (allowed.count(fd) == 0) return false;
            return send(fds);
          });
      if (!why.empty()) ::_exit(4);
      for (int fd : mine)
        if (::write(to_parent[1], &fd, sizeof(fd)) != sizeof(fd)) ::_exit(5);
      char c = 0;
      (void)::read(to_child[0], &c, 1);
      ::_exit(0);
    }
    ::close(to_parent[1]);
    ::close(to_child[0]);
    for (int i = 0; i < count; ++i) {
      int fd = -1;
      REQUIRE(::read(to_parent[0], &fd, sizeof(fd)) == sizeof(fd));
      fds.push_back(fd);
    }
    ::close(to_parent[0]);
    release_fd = to_child[1];
  }

  ~ServingChild() {
    if (pid <= 0) return;
    char c = 1;
    (void)::write(release_fd, &c, 1);
    ::close(release_fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
};

void check_content(const std::vector<int>& fds) {
  for (std::size_t i = 0; i < fds.size(); ++i) {
    char buf[4096];
    REQUIRE(::pread(fds[i], buf, sizeof(buf), 0) == static_cast<ssize_t>(sizeof(buf)));
    CHECK(buf[0] == static_cast<char>('A' + i));
    CHECK(buf[4095] == static_cast<char>('A' + i));
  }
}

}  // namespace

TEST_CASE("descriptors come from another process through gpumem's socket", "[ipc][fd]") {
  ServingChild child(3);
  auto taken = take_fds(child.pid, child.fds, FdRoute::socket_only);
  if (auto* why = std::get_if<std::string>(&taken)) FAIL(*why);
  auto& fds = std::get<std::vector<int>>(taken);
  REQUIRE(fds.size() == 3);
  check_content(fds);
  for (int fd : fds) ::close(fd);

  SECTION("a descriptor the server does not offer is refused, and nothing is left open") {
    std::vector<int> asked = {child.fds[0], 0};  // 0: the child's stdin, not an exported piece
    auto refused = take_fds(child.pid, asked, FdRoute::socket_only);
    REQUIRE(std::holds_alternative<std::string>(refused));
    CHECK(std::get<std::string>(refused).find("refused") != std::string::npos);
  }
  SECTION("a process without the server: the error names the route that failed") {
    auto none = take_fds(::getppid(), child.fds, FdRoute::socket_only);
    REQUIRE(std::holds_alternative<std::string>(none));
    CHECK(std::get<std::string>(none).find("does not run gpumem's descriptor server") != std::string::npos);
  }
}

TEST_CASE("descriptors come from another process through pidfd_getfd where permitted", "[ipc][fd]") {
  ServingChild child(2);
  auto taken = take_fds(child.pid, child.fds, FdRoute::pidfd_only);
  if (auto* why = std::get_if<std::string>(&taken)) {
    // Kernels before 5.6, or a seccomp/Yama policy: the socket route covers it (test above).
    if (why->find("Operation not permitted") != std::string::npos || why->find("Function not implemented") != std::string::npos)
      GPUMEM_SKIP("pidfd_getfd is not available here: " + *why);
    FAIL(*why);
  }
  auto& fds = std::get<std::vector<int>>(taken);
  check_content(fds);
  for (int fd : fds) ::close(fd);
  // The default route takes the first that works.
  auto any = take_fds(child.pid, child.fds);
  REQUIRE(std::holds_alternative<std::vector<int>>(any));
  for (int fd : std::get<std::vector<int>>(any)) ::close(fd);
}

namespace {

struct FakeMemory final : ImportedMemory {
  FakeMemory(std::uintptr_t b, std::atomic<int>& c) : addr(b), closed(c) {}
  ~FakeMemory() override { ++closed; }
  void* base() const noexcept override { return reinterpret_cast<void*>(addr); }
  std::uintptr_t addr;
  std::atomic<int>& closed;
};

}  // namespace

TEST_CASE("imports are shared by handle and released with their last user", "[ipc][imports]") {
  std::atomic<int> opened{0}, closed{0};
  auto imports = std::make_shared<IpcImports>(
      [&](const std::string& handle, int device) -> std::variant<std::unique_ptr<ImportedMemory>, std::string> {
        if (handle == "bad") return std::string("the fake opener refuses 'bad'");
        ++opened;
        return std::unique_ptr<ImportedMemory>(
            new FakeMemory(0x1000 * static_cast<std::uintptr_t>(opened.load()) + static_cast<std::uintptr_t>(device),
                           closed));
      });
  auto a = imports->get("h1", 0);
  auto b = imports->get("h1", 0);
  REQUIRE(std::holds_alternative<std::shared_ptr<void>>(a));
  REQUIRE(std::holds_alternative<std::shared_ptr<void>>(b));
  auto pa = std::get<std::shared_ptr<void>>(a);
  auto pb = std::get<std::shared_ptr<void>>(b);
  CHECK(pa.get() == pb.get());
  CHECK(opened == 1);
  auto other_device = std::get<std::shared_ptr<void>>(imports->get("h1", 1));
  auto other_handle = std::get<std::shared_ptr<void>>(imports->get("h2", 0));
  CHECK(opened == 3);
  CHECK(imports->live_imports() == 3);

  auto bad = imports->get("bad", 0);
  REQUIRE(std::holds_alternative<std::string>(bad));
  CHECK(std::get<std::string>(bad) == "the fake opener refuses 'bad'");
  CHECK(imports->live_imports() == 3);

  pa.reset();
  CHECK(closed == 0);  // pb still uses it
  pb.reset();
  a = std::string();
  b = std::string();
  CHECK(closed == 1);
  CHECK(imports->live_imports() == 2);
  // Opened again after the release: a fresh import.
  auto again = std::get<std::shared_ptr<void>>(imports->get("h1", 0));
  CHECK(opened == 4);
  again.reset();
  other_device.reset();
  other_handle.reset();
  CHECK(closed == 4);
  CHECK(imports->live_imports() == 0);
}

TEST_CASE("imports released from many threads while others open the same handle", "[ipc][imports]") {
  std::atomic<int> opened{0}, closed{0};
  auto imports = std::make_shared<IpcImports>(
      [&](const std::string&, int) -> std::variant<std::unique_ptr<ImportedMemory>, std::string> {
        ++opened;
        return std::unique_ptr<ImportedMemory>(new FakeMemory(0x2000, closed));
      });
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto p = std::get<std::shared_ptr<void>>(imports->get("same", 0));
        if (p.get() != reinterpret_cast<void*>(0x2000)) ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  CHECK(imports->live_imports() == 0);
  CHECK(opened == closed);  // every import opened was destroyed exactly once
}
