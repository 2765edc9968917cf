// ipc_pieces: what exportable pieces (CudaVmmOptions::exportable, the ipc_handles key) cost, and
// what sharing one costs, on a real GPU. Prints, for plain and exportable pieces of 2 MiB and
// 20 MiB, the mean microseconds of cuMemCreate and cuMemRelease (each piece also mapped and
// unmapped, as the engine does), then for exportable pieces: export_pieces of a block over N
// pieces the first time (cuMemExportToShareableHandle per piece) and again (cached), and an import
// of those descriptors (dup'ed: this process plays the receiver) with CudaImportedPieces (import,
// reserve, map, set access) and its release.
//
//   ipc_pieces [--device N] [--pieces N] [--rounds R]
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.h"
#include "gpumem/alloc/cuda_ipc.h"
#include "gpumem/alloc/cuda_sources.h"

namespace {

using namespace gpumem::alloc;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMiB = std::size_t{1} << 20;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ipc_pieces: %s\n", what.c_str());
  std::exit(1);
}

struct Costs {
  double create_us = 0, release_us = 0;
};

// rounds x (create `pieces` pieces, map them back to back, unmap, destroy).
Costs create_release(int device, bool exportable, std::size_t piece_bytes, int pieces, int rounds) {
  CudaVmmOptions options;
  options.exportable = exportable;
  CudaVmmSource source(device, options);
  if (source.init_status() != SourceStatus::ok) die(source.last_error());
  if (exportable && !source.exportable()) die("pieces are not exportable here: " + source.last_error());
  auto range = source.reserve(piece_bytes * static_cast<std::size_t>(pieces), 0);
  if (!range.ok()) die(source.last_error());
  for (int r = 0; r < rounds; ++r) {
    std::vector<PhysHandle> handles;
    for (int i = 0; i < pieces; ++i) {
      auto h = source.create(piece_bytes);
      if (!h.ok()) die(source.last_error());
      handles.push_back(h.value);
      if (source.map(range.value.base + static_cast<std::size_t>(i) * piece_bytes, piece_bytes, h.value) !=
          SourceStatus::ok)
        die(source.last_error());
    }
    for (int i = 0; i < pieces; ++i) {
      (void)source.unmap(range.value.base + static_cast<std::size_t>(i) * piece_bytes, piece_bytes);
      (void)source.destroy(handles[static_cast<std::size_t>(i)]);
    }
  }
  (void)source.release(range.value);
  const CudaVmmCallTimes t = source.call_times();
  return {t.create.mean_ns() / 1000.0, t.release.mean_ns() / 1000.0};
}

void share_and_import(int device, std::size_t piece_bytes, int pieces) {
  CudaVmmSource source(device);
  if (!source.exportable()) die("pieces are not exportable here: " + source.last_error());
  auto range = source.reserve(piece_bytes * static_cast<std::size_t>(pieces), 0);
  if (!range.ok()) die(source.last_error());
  std::vector<PhysHandle> handles;
  for (int i = 0; i < pieces; ++i) {
    auto h = source.create(piece_bytes);
    if (!h.ok() || source.map(range.value.base + static_cast<std::size_t>(i) * piece_bytes, piece_bytes, h.value) !=
                       SourceStatus::ok)
      die(source.last_error());
    handles.push_back(h.value);
  }
  const std::size_t block = piece_bytes * static_cast<std::size_t>(pieces);
  auto t0 = Clock::now();
  auto first = source.export_pieces(range.value.base, block);
  const double first_us = us_since(t0);
  if (!first.ok()) die(source.last_error());
  t0 = Clock::now();
  auto again = source.export_pieces(range.value.base, block);
  const double again_us = us_since(t0);
  if (!again.ok()) die(source.last_error());

  // The data survives the round trip: write through the exporter's mapping, read the import.
  std::vector<unsigned char> pattern(4096);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 3);
  if (cudaSetDevice(device) != cudaSuccess) die("cudaSetDevice failed");
  void* last_page = reinterpret_cast<void*>(range.value.base + block - pattern.size());
  if (cudaMemcpy(last_page, pattern.data(), pattern.size(), cudaMemcpyHostToDevice) != cudaSuccess)
    die("cudaMemcpy into the exported pieces failed");

  std::vector<int> fds;
  for (const auto& p : first.value) fds.push_back(::dup(p.fd));
  std::string error;
  t0 = Clock::now();
  const std::vector<std::size_t> sizes(fds.size(), piece_bytes);
  auto imported = CudaImportedPieces::import(device, sizes, fds, &error);
  const double import_us = us_since(t0);
  if (!imported) die("import: " + error);
  std::vector<unsigned char> back(pattern.size());
  if (cudaMemcpy(back.data(), reinterpret_cast<void*>(imported->base() + block - back.size()), back.size(),
                 cudaMemcpyDeviceToHost) != cudaSuccess)
    die("cudaMemcpy from the imported pieces failed");
  const bool same = back == pattern;
  t0 = Clock::now();
  imported.reset();
  const double release_us = us_since(t0);
  std::printf("  %3d x %2zu MiB  export %8.1f us (first)  %6.1f us (cached)  import+map %8.1f us  release %8.1f us  data %s\n",
              pieces, piece_bytes / kMiB, first_us, again_us, import_us, release_us, same ? "ok" : "DIFFERS");
  for (int i = 0; i < pieces; ++i) {
    (void)source.unmap(range.value.base + static_cast<std::size_t>(i) * piece_bytes, piece_bytes);
    (void)source.destroy(handles[static_cast<std::size_t>(i)]);
  }
  (void)source.release(range.value);
  if (!same) std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0, pieces = 32, rounds = 3;
  gpumem::bench::BenchArgs args("ipc_pieces", "[--device N] [--pieces N] [--rounds R]");
  args.number("--device", device, 0, 1024).number("--pieces", pieces, 1, 100000).number("--rounds", rounds, 1, 100000);
  args.parse(argc, argv);
  if (cuda_device_count() == 0) die("no CUDA device");
  std::printf("ipc_pieces: device %d, %d pieces x %d rounds; mean us per call\n", device, pieces, rounds);
  std::printf("  %-8s %-11s %10s %10s\n", "piece", "pieces", "cuMemCreate", "cuMemRelease");
  for (std::size_t piece : {2 * kMiB, 20 * kMiB}) {
    for (bool exportable : {false, true}) {
      const Costs c = create_release(device, exportable, piece, pieces, rounds);
      std::printf("  %2zu MiB   %-11s %10.1f %10.1f\n", piece / kMiB, exportable ? "exportable" : "plain",
                  c.create_us, c.release_us);
    }
  }
  std::printf("sharing a block of exportable pieces:\n");
  share_and_import(device, 2 * kMiB, pieces);
  share_and_import(device, 20 * kMiB, pieces);
  return 0;
}
