// cuda_vmm_calls: microseconds per CUDA virtual-memory driver call, measured through CudaVmmSource,
// for 2 MiB and 20 MiB pieces (compare with the CUDA virtual memory calls measured on an H200
// with driver 580, 2 MiB (20 MiB): cuMemCreate 14 (13), cuMemMap 2 (1), cuMemSetAccess 35-40 (31),
// cuMemUnmap 20-24 (19-23), cuMemRelease 10-14 (26)).
//
// Each round creates N pieces, maps each into one half of a reservation, unmaps them, maps the
// same handles into the other half (what physical page recycling does), unmaps them; then maps
// each into the first half and a second time into the other half while the first mapping stays
// (a kept mapping, the engine's default), unmaps both and destroys them.
//
//   cuda_vmm_calls [--device N] [--rounds R] [--pieces-2mib N] [--pieces-20mib N]
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.h"
#include "gpumem/alloc/cuda_sources.h"

namespace {

using namespace gpumem::alloc;

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Args {
  int device = 0;
  int rounds = 5;
  int pieces_2mib = 64;
  int pieces_20mib = 32;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "cuda_vmm_calls: %s\nusage: cuda_vmm_calls [--device N] [--rounds R] [--pieces-2mib N] "
               "[--pieces-20mib N]  (all positive integers; device may be 0)\n",
               what.c_str());
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  gpumem::bench::BenchArgs args("cuda_vmm_calls", "[--device N] [--rounds R] [--pieces-2mib N] [--pieces-20mib N]");
  args.number("--device", a.device, 0, 1024)
      .number("--rounds", a.rounds, 1, 1000000)
      .number("--pieces-2mib", a.pieces_2mib, 1, 1000000)
      .number("--pieces-20mib", a.pieces_20mib, 1, 1000000);
  args.parse(argc, argv);
  return a;
}

bool check(SourceStatus status, const CudaVmmSource& source, const char* what) {
  if (status == SourceStatus::ok) return true;
  std::fprintf(stderr, "cuda_vmm_calls: %s failed (%s): %s\n", what, to_string(status), source.last_error().c_str());
  return false;
}

void print_row(const char* call, const CudaCallTime& t) {
  std::printf("  %-22s %8llu %10.1f %10.1f\n", call, static_cast<unsigned long long>(t.calls), t.mean_ns() / 1000.0,
              static_cast<double>(t.max_ns) / 1000.0);
}

// Returns false on a source failure (already reported).
bool run_size(const Args& args, std::size_t piece_bytes, int pieces) {
  CudaVmmSource source(args.device);
  if (source.init_status() != SourceStatus::ok) {
    std::fprintf(stderr, "cuda_vmm_calls: %s\n", source.last_error().c_str());
    return false;
  }
  const std::size_t n = static_cast<std::size_t>(pieces);
  auto range = source.reserve(2 * n * piece_bytes, 0);
  if (!check(range.status, source, "reserve")) return false;
  std::vector<PhysHandle> handles(n);
  std::uint64_t map_wall_ns = 0, map_calls = 0;
  std::uint64_t alias_map_ns = 0, first_map_ns = 0, alias_maps = 0;  // kept-mapping round
  const auto t_start = std::chrono::steady_clock::now();

  for (int round = 0; round < args.rounds; ++round) {
    for (std::size_t i = 0; i < n; ++i) {
      auto h = source.create(piece_bytes);
      if (!check(h.status, source, "create")) return false;
      handles[i] = h.value;
    }
    for (std::size_t half = 0; half < 2; ++half) {
      const std::uintptr_t base = range.value.base + half * n * piece_bytes;
      for (std::size_t i = 0; i < n; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!check(source.map(base + i * piece_bytes, piece_bytes, handles[i]), source, "map")) return false;
        map_wall_ns += static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
        ++map_calls;
      }
      for (std::size_t i = 0; i < n; ++i)
        if (!check(source.unmap(base + i * piece_bytes, piece_bytes), source, "unmap")) return false;
    }
    // Kept mappings (the engine's default): every piece mapped a second time, in the other half,
    // while its first mapping stays; then both unmapped.
    {
      const CudaVmmCallTimes t0 = source.call_times();
      for (std::size_t i = 0; i < n; ++i)
        if (!check(source.map(range.value.base + i * piece_bytes, piece_bytes, handles[i]), source, "map")) return false;
      const CudaVmmCallTimes t1 = source.call_times();
      for (std::size_t i = 0; i < n; ++i)
        if (!check(source.map(range.value.base + (n + i) * piece_bytes, piece_bytes, handles[i]), source,
                   "map (a second mapping of a mapped piece)"))
          return false;
      const CudaVmmCallTimes t2 = source.call_times();
      alias_map_ns += (t2.map.total_ns - t1.map.total_ns) + (t2.set_access.total_ns - t1.set_access.total_ns);
      first_map_ns += (t1.map.total_ns - t0.map.total_ns) + (t1.set_access.total_ns - t0.set_access.total_ns);
      alias_maps += n;
      for (std::size_t i = 0; i < 2 * n; ++i)
        if (!check(source.unmap(range.value.base + i * piece_bytes, piece_bytes), source, "unmap")) return false;
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!check(source.destroy(handles[i]), source, "destroy")) return false;
  }
  if (!check(source.release(range.value), source, "release")) return false;
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();

  const CudaVmmCallTimes t = source.call_times();
  std::printf("\npiece %zu MiB: %d pieces, %d rounds (create, map, unmap, map elsewhere, unmap, release)\n",
              piece_bytes / kMiB, pieces, args.rounds);
  std::printf("  %-22s %8s %10s %10s\n", "call", "calls", "mean_us", "max_us");
  print_row("cuMemCreate", t.create);
  print_row("cuMemMap", t.map);
  print_row("cuMemSetAccess", t.set_access);
  print_row("cuMemUnmap", t.unmap);
  print_row("cuMemRelease", t.release);
  print_row("cuMemAddressReserve", t.address_reserve);
  print_row("cuMemAddressFree", t.address_free);
  std::printf("  map() through the source (cuMemMap + cuMemSetAccess + bookkeeping): %.1f us per call\n",
              map_calls ? static_cast<double>(map_wall_ns) / static_cast<double>(map_calls) / 1000.0 : 0.0);
  const double remap_us = (t.unmap.mean_ns() + t.map.mean_ns() + t.set_access.mean_ns()) / 1000.0;
  std::printf("  one recycled mapping (unmap + map + set access): %.1f us = %.2f us per MiB\n", remap_us,
              remap_us / static_cast<double>(piece_bytes / kMiB));
  std::printf("  kept mappings: map + set access of a piece mapped nowhere else %.1f us, of a piece already mapped "
              "elsewhere (a second mapping) %.1f us\n",
              alias_maps ? static_cast<double>(first_map_ns) / static_cast<double>(alias_maps) / 1000.0 : 0.0,
              alias_maps ? static_cast<double>(alias_map_ns) / static_cast<double>(alias_maps) / 1000.0 : 0.0);
  std::printf("  wall time %.1f ms\n", total_ms);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  const int count = cuda_device_count();
  if (count == 0) {
    std::fprintf(stderr, "cuda_vmm_calls: no CUDA device is present; run this on a machine with a GPU\n");
    return 1;
  }
  if (args.device >= count) usage_error(fmt::format("--device {} is out of range: use 0..{}", args.device, count - 1));
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, args.device) == cudaSuccess) {
    int driver = 0;
    (void)cudaDriverGetVersion(&driver);
    CudaVmmSource probe(args.device);
    std::printf("device %d: %s, %.1f GiB, driver API %d, granularity %zu bytes\n", args.device, prop.name,
                static_cast<double>(prop.totalGlobalMem) / static_cast<double>(1ull << 30), driver,
                probe.caps().granularity_bytes);
  }
  bool ok = run_size(args, 2 * kMiB, args.pieces_2mib);
  ok = run_size(args, 20 * kMiB, args.pieces_20mib) && ok;
  return ok ? 0 : 1;
}
