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
// With --threads T (T >= 2) it then measures whether recycling from several threads at once runs in
// parallel (what arenas:N does on one device: each arena moves its own pieces): T threads each map
// 16 pieces of 2 MiB of their own into their own reservation and unmap them, --rounds times, first
// through one CudaVmmSource shared by the threads (its mutex holds every call, as the engine's
// arenas share their device's source), then through a source of each thread's own (only the driver
// is shared), each after the same loop on one thread. It prints the microseconds per cuMemMap +
// cuMemSetAccess + cuMemUnmap of one thread alone, of each thread (its wall time over its calls:
// equal to the one-thread time when the calls run in parallel, T times it when they take turns), and
// of the process (the span from the first thread's start to the last one's end over all the calls:
// 1/T of the one-thread time in parallel, equal to it when they take turns). Give --rounds 100 or
// more: with short loops the threads' starts spread over much of the run.
//
//   cuda_vmm_calls [--device N] [--rounds R] [--pieces-2mib N] [--pieces-20mib N] [--threads T]
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
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
  int threads = 0;  // 0: no concurrency measurement
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "cuda_vmm_calls: %s\nusage: cuda_vmm_calls [--device N] [--rounds R] [--pieces-2mib N] "
               "[--pieces-20mib N] [--threads T]  (all positive integers; device may be 0; T at least 2)\n",
               what.c_str());
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  gpumem::bench::BenchArgs args("cuda_vmm_calls",
                                "[--device N] [--rounds R] [--pieces-2mib N] [--pieces-20mib N] [--threads T]");
  args.number("--device", a.device, 0, 1024)
      .number("--rounds", a.rounds, 1, 1000000)
      .number("--pieces-2mib", a.pieces_2mib, 1, 1000000)
      .number("--pieces-20mib", a.pieces_20mib, 1, 1000000)
      .number("--threads", a.threads, 2, 256);
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

// One thread's recycling loop for the concurrency measurement: `kPieces` pieces of 2 MiB, created
// once, mapped into its reservation and unmapped, `rounds` times. Returns the wall nanoseconds of the
// map/unmap calls (0 on a failure, already reported), adds the mappings recycled to *recycles, and
// sets *first / *last to when its first round started and its last ended.
constexpr std::size_t kConcurrencyPieces = 16;
using Clock = std::chrono::steady_clock;
std::uint64_t recycle_loop(CudaVmmSource& source, int rounds, std::uint64_t* recycles, Clock::time_point* first,
                           Clock::time_point* last) {
  const std::size_t piece = 2 * kMiB;
  auto range = source.reserve(kConcurrencyPieces * piece, 0);
  if (!check(range.status, source, "reserve")) return 0;
  std::vector<PhysHandle> handles;
  for (std::size_t i = 0; i < kConcurrencyPieces; ++i) {
    auto h = source.create(piece);
    if (!check(h.status, source, "create")) return 0;
    handles.push_back(h.value);
  }
  std::uint64_t ns = 0;
  bool ok = true;
  *first = Clock::now();
  for (int r = 0; r < rounds && ok; ++r) {
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < kConcurrencyPieces && ok; ++i)
      ok = check(source.map(range.value.base + i * piece, piece, handles[i]), source, "map");
    for (std::size_t i = 0; i < kConcurrencyPieces && ok; ++i)
      ok = check(source.unmap(range.value.base + i * piece, piece), source, "unmap");
    *last = Clock::now();
    ns += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(*last - t0).count());
  }
  *recycles += ok ? static_cast<std::uint64_t>(rounds) * kConcurrencyPieces : 0;
  for (PhysHandle h : handles) ok = check(source.destroy(h), source, "destroy") && ok;
  ok = check(source.release(range.value), source, "release") && ok;
  return ok ? ns : 0;
}

// T threads recycling at once, on one shared source or a source each; prints us per recycled
// mapping (map + set access + unmap): of one thread alone; of each of the T threads (its wall time
// over its own calls); and of the process (from the first thread's start to the last one's end, over
// all threads' calls). Calls that run in parallel make the last one 1/T of the first; calls that take
// turns leave it equal.
bool run_concurrency(const Args& args) {
  std::printf("\nrecycling from %d threads at once: %zu pieces of 2 MiB per thread, %d rounds; us per "
              "cuMemMap + cuMemSetAccess + cuMemUnmap of a thread (wall time over its calls)\n",
              args.threads, kConcurrencyPieces, args.rounds);
  std::printf("  %-34s %10s %12s %8s %12s %8s\n", "sources", "1 thread", "per thread", "ratio", "process", "ratio");
  bool ok = true;
  for (const bool shared : {true, false}) {
    const int t = args.threads;
    std::vector<std::unique_ptr<CudaVmmSource>> sources;
    for (int i = 0; i < (shared ? 1 : t); ++i) {
      sources.push_back(std::make_unique<CudaVmmSource>(args.device));
      if (sources.back()->init_status() != SourceStatus::ok) {
        std::fprintf(stderr, "cuda_vmm_calls: %s\n", sources.back()->last_error().c_str());
        return false;
      }
    }
    std::uint64_t one_calls = 0;
    Clock::time_point one_first, one_last;
    const std::uint64_t one_ns = recycle_loop(*sources[0], args.rounds, &one_calls, &one_first, &one_last);
    std::vector<std::uint64_t> ns(static_cast<std::size_t>(t)), calls(static_cast<std::size_t>(t));
    std::vector<Clock::time_point> first(static_cast<std::size_t>(t)), last(static_cast<std::size_t>(t));
    std::barrier start(t);
    std::vector<std::thread> pool;
    for (int i = 0; i < t; ++i)
      pool.emplace_back([&, i] {
        if (cudaSetDevice(args.device) != cudaSuccess) return;
        start.arrive_and_wait();
        const auto k = static_cast<std::size_t>(i);
        ns[k] = recycle_loop(*sources[shared ? 0 : k], args.rounds, &calls[k], &first[k], &last[k]);
      });
    for (auto& th : pool) th.join();
    double per_thread_us = 0;
    int measured = 0;
    for (int i = 0; i < t; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (ns[k] == 0 || calls[k] == 0) continue;
      per_thread_us += static_cast<double>(ns[k]) / static_cast<double>(calls[k]) / 1000.0;
      ++measured;
    }
    if (one_ns == 0 || one_calls == 0 || measured != t) {
      std::fprintf(stderr, "cuda_vmm_calls: the concurrency loop failed (%s)\n", shared ? "shared source" : "a source each");
      ok = false;
      continue;
    }
    per_thread_us /= measured;
    const double one_us = static_cast<double>(one_ns) / static_cast<double>(one_calls) / 1000.0;
    std::uint64_t all_calls = 0;
    for (std::uint64_t c : calls) all_calls += c;
    const double span_us = std::chrono::duration<double, std::micro>(*std::max_element(last.begin(), last.end()) -
                                                                     *std::min_element(first.begin(), first.end()))
                               .count();
    const double process_us = span_us / static_cast<double>(all_calls);
    std::printf("  %-34s %10.1f %12.1f %7.2fx %12.1f %7.2fx\n",
                shared ? "one source shared by the threads" : "a source per thread", one_us, per_thread_us,
                per_thread_us / one_us, process_us, process_us / one_us);
  }
  return ok;
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
  if (args.threads >= 2) ok = run_concurrency(args) && ok;
  return ok ? 0 : 1;
}
