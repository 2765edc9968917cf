// host_vmm_calls: nanoseconds per HostVmmSource call (create, map, first touch, unmap, destroy) for
// 2 MiB and 20 MiB pieces: the host twin of cuda_vmm_calls, and the cost tests and CPU tensors pay
// per physical piece on HostVmmSource.
//
//   host_vmm_calls [--rounds R] [--pieces N]
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_args.h"
#include "gpumem/alloc/host_vmm_source.h"

namespace {

using namespace gpumem::alloc;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Timer {
  std::uint64_t total_ns = 0, calls = 0;
  template <class F>
  auto time(F&& f) {
    const auto t0 = Clock::now();
    auto r = f();
    total_ns += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    ++calls;
    return r;
  }
  double mean_ns() const { return calls ? static_cast<double>(total_ns) / static_cast<double>(calls) : 0.0; }
};

bool ok(SourceStatus s, const HostVmmSource& source, const char* what) {
  if (s == SourceStatus::ok) return true;
  std::fprintf(stderr, "host_vmm_calls: %s failed (%s): %s\n", what, to_string(s), source.last_error().c_str());
  return false;
}

bool run_size(std::size_t piece_bytes, int pieces, int rounds) {
  HostVmmSource source;
  const std::size_t n = static_cast<std::size_t>(pieces);
  auto range = source.reserve(2 * n * piece_bytes, 0);
  if (!ok(range.status, source, "reserve")) return false;
  Timer create, map, touch, unmap, destroy;
  std::vector<PhysHandle> handles(n);
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 0; i < n; ++i) {
      auto h = create.time([&] { return source.create(piece_bytes); });
      if (!ok(h.status, source, "create")) return false;
      handles[i] = h.value;
    }
    for (std::size_t half = 0; half < 2; ++half) {
      const std::uintptr_t base = range.value.base + half * n * piece_bytes;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uintptr_t va = base + i * piece_bytes;
        if (!ok(map.time([&] { return source.map(va, piece_bytes, handles[i]); }), source, "map")) return false;
        // First touch of every page: where the kernel actually provides memory (once per piece,
        // in the first half; the second half finds the pages already there).
        touch.time([&] {
          for (std::size_t off = 0; off < piece_bytes; off += 4096) reinterpret_cast<volatile char*>(va)[off] = 1;
          return 0;
        });
      }
      for (std::size_t i = 0; i < n; ++i) {
        const std::uintptr_t va = base + i * piece_bytes;
        if (!ok(unmap.time([&] { return source.unmap(va, piece_bytes); }), source, "unmap")) return false;
      }
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!ok(destroy.time([&] { return source.destroy(handles[i]); }), source, "destroy")) return false;
  }
  if (!ok(source.release(range.value), source, "release")) return false;
  std::printf("\npiece %zu MiB: %d pieces, %d rounds\n", piece_bytes / kMiB, pieces, rounds);
  std::printf("  %-34s %10.0f ns\n", "create (memfd_create + ftruncate)", create.mean_ns());
  std::printf("  %-34s %10.0f ns\n", "map (mmap MAP_FIXED|MAP_SHARED)", map.mean_ns());
  std::printf("  %-34s %10.0f ns\n", "touch every page (mean of 2 maps)", touch.mean_ns());
  std::printf("  %-34s %10.0f ns\n", "unmap (mmap PROT_NONE over it)", unmap.mean_ns());
  std::printf("  %-34s %10.0f ns\n", "destroy (close)", destroy.mean_ns());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, pieces = 32;
  gpumem::bench::BenchArgs args("host_vmm_calls", "[--rounds R] [--pieces N]");
  args.number("--rounds", rounds, 1, 100000).number("--pieces", pieces, 1, 100000);
  args.parse(argc, argv);
  bool good = run_size(2 * kMiB, pieces, rounds);
  good = run_size(20 * kMiB, pieces, rounds) && good;
  return good ? 0 : 1;
}
