// Pinned host memory on a GPU (gpumem::pinned over CudaHostSource): host-to-device copy bandwidth
// from gpumem's pinned blocks, from cudaHostAlloc memory (what PyTorch's pinned allocator hands out)
// and from pageable memory; then the DataLoader-style workload with real copies, its locked bytes
// against the bytes it requested, and the time spent registering memory.
//
//   bench_pinned_cuda [--reps N] [--steps N] [--multi-scale 0|1]
//
// Prints a table; exits 1 without a CUDA device.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "dataloader_workload.h"
#include "gpumem/alloc/cuda_sources.h"
#include "gpumem/pinned/cuda_device_events.h"
#include "gpumem/pinned/cuda_host_source.h"
#include "gpumem/pinned/pinned_allocator.h"

using namespace gpumem;
using namespace gpumem::pinned;

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fmt::print(stderr, "bench_pinned_cuda: {} failed: {}\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// GB/s of reps host-to-device copies of bytes from src on stream.
double h2d_gbps(const void* src, void* dev, std::size_t bytes, int reps, cudaStream_t stream) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, stream), "warm-up copy");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) check(cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, stream), "copy");
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(bytes) * reps / (static_cast<double>(ms) * 1e6);
}

std::size_t number(const char* flag, const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0') {
    fmt::print(stderr, "bench_pinned_cuda: {} wants a non-negative integer, got '{}'\n", flag, text);
    std::exit(2);
  }
  return static_cast<std::size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::size_t steps = 600;
  testing::DataLoaderShape shape;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--reps") reps = static_cast<int>(number("--reps", argv[i + 1]));
    else if (f == "--steps") steps = number("--steps", argv[i + 1]);
    else if (f == "--multi-scale") shape.multi_scale = number("--multi-scale", argv[i + 1]) != 0;
    else {
      fmt::print(stderr, "bench_pinned_cuda: unknown flag '{}' (--reps N, --steps N, --multi-scale 0|1)\n", f);
      return 2;
    }
  }
  if (alloc::cuda_device_count() == 0) {
    fmt::print(stderr, "bench_pinned_cuda: no CUDA device\n");
    return 1;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  CudaHostSource source;
  CudaDeviceEvents events;
  PinnedAllocator pa(source, events);

  // ---- bandwidth ----
  fmt::print("host-to-device copy bandwidth, GB/s ({} copies each)\n", reps);
  fmt::print("{:>10} {:>14} {:>14} {:>14}\n", "bytes", "gpumem pinned", "cudaHostAlloc", "pageable");
  for (std::size_t mb : {1, 16, 64, 256}) {
    const std::size_t bytes = mb << 20;
    void* dev = nullptr;
    check(cudaMalloc(&dev, bytes), "cudaMalloc");
    auto ours = pa.allocate(bytes);
    if (!ours.ok()) {
      fmt::print(stderr, "{}\n", ours.error);
      return 1;
    }
    std::memset(ours.ptr, 1, bytes);
    void* host_alloc = nullptr;
    check(cudaHostAlloc(&host_alloc, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    std::memset(host_alloc, 1, bytes);
    std::vector<unsigned char> pageable(bytes, 1);
    const double g = h2d_gbps(ours.ptr, dev, bytes, reps, stream);
    const double h = h2d_gbps(host_alloc, dev, bytes, reps, stream);
    const double p = h2d_gbps(pageable.data(), dev, bytes, std::max(2, reps / 4), stream);
    fmt::print("{:>10} {:>14.1f} {:>14.1f} {:>14.1f}\n", bytes, g, h, p);
    pa.free(ours.ptr);
    cudaFreeHost(host_alloc);
    cudaFree(dev);
  }
  pa.empty_cache();

  // ---- DataLoader-style workload with real copies ----
  std::mt19937_64 rng(2024);
  struct Batch {
    std::vector<std::pair<void*, std::size_t>> buffers;
  };
  std::deque<Batch> ahead;
  std::deque<std::pair<cudaEvent_t, std::size_t>> copying;
  void* dev = nullptr;
  check(cudaMalloc(&dev, std::size_t{64} << 20), "cudaMalloc");
  std::size_t live = 0, peak = 0;
  pa.reset_peaks();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t step = 0; step < steps; ++step) {
    Batch b;
    for (std::size_t bytes : testing::next_batch(rng, step, shape)) {
      auto r = pa.allocate(bytes);
      if (!r.ok()) {
        fmt::print(stderr, "{}\n", r.error);
        return 1;
      }
      std::memset(r.ptr, static_cast<int>(step), std::min<std::size_t>(bytes, 1 << 16));  // the collate writes
      b.buffers.emplace_back(r.ptr, bytes);
      live += bytes;
    }
    peak = std::max(peak, live);
    ahead.push_back(std::move(b));
    if (ahead.size() > shape.window) {
      std::size_t bytes = 0;
      for (auto [p, n] : ahead.front().buffers) {
        for (std::size_t off = 0; off < n; off += std::size_t{64} << 20)
          check(cudaMemcpyAsync(dev, static_cast<char*>(p) + off, std::min(n - off, std::size_t{64} << 20),
                                cudaMemcpyHostToDevice, stream),
                "copy");
        pa.record_stream(p, CudaDeviceEvents::stream_id(0, stream));
        pa.free(p);
        bytes += n;
      }
      cudaEvent_t done;
      check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventRecord(done, stream), "cudaEventRecord");
      copying.emplace_back(done, bytes);
      ahead.pop_front();
    }
    while (!copying.empty() && (copying.size() > shape.copy_lag || cudaEventQuery(copying.front().first) == cudaSuccess)) {
      check(cudaEventSynchronize(copying.front().first), "cudaEventSynchronize");
      cudaEventDestroy(copying.front().first);
      live -= copying.front().second;
      copying.pop_front();
    }
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto t = pa.totals();
  const auto c = source.counters();
  fmt::print("\nDataLoader-style workload ({}), {} steps in {:.2f} s\n",
             shape.multi_scale ? "multi-scale images" : "224x224 images", steps, seconds);
  fmt::print("{:<26} {:>14}\n", "peak requested bytes", peak);
  fmt::print("{:<26} {:>14}\n", "peak locked bytes", t.peak_locked_bytes);
  fmt::print("{:<26} {:>14.3f}\n", "locked / requested", static_cast<double>(t.peak_locked_bytes) / static_cast<double>(peak));
  fmt::print("{:<26} {:>14}\n", "cudaHostRegister calls", c.registers);
  fmt::print("{:<26} {:>14.1f}\n", "register+unregister ms", static_cast<double>(c.register_ns + c.unregister_ns) / 1e6);
  fmt::print("RESULT gpumem_locked_over_requested={:.3f} peak_requested={} peak_locked={}\n",
             static_cast<double>(t.peak_locked_bytes) / static_cast<double>(peak), peak, t.peak_locked_bytes);
  pa.check_invariants();
  cudaFree(dev);
  cudaStreamDestroy(stream);
  return 0;
}
