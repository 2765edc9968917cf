// ns per alloc+free pair: gpumem's CUDA allocator vs PyTorch's native caching allocator, side by
// side in one process, both driven through the same c10 calls (raw_alloc_with_stream /
// raw_delete) with the same op sequences as bench/alloc_pairs.cpp (one definition,
// bench/alloc_pattern.h):
// fixed 4 KiB, 1 MiB and 64 MiB pairs, and windows of W live allocations (W = 64, 1024; sizes
// log-uniform in 512 B..32 MiB; each step frees a random slot and allocates a new size into it),
// single-threaded and with T threads each running its own sequence.
//
//   torch_alloc_pairs [--ops N] [--thread-ops N] [--threads T] [--rounds R] [--config STR]
//
// gpumem is not installed: libtorch keeps its native allocator, and gpumem's allocator object is
// driven directly (gpumem::torch::cuda_allocator()), so both run under the same conditions. Each
// pattern runs R rounds alternating native and gpumem; the table shows the median of the rounds.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "alloc_pattern.h"
#include "bench_args.h"
#include "gpumem/torch/config.h"
#include "gpumem/torch/cuda_allocator.h"

namespace {

using Allocator = c10::cuda::CUDACachingAllocator::CUDAAllocator;

using gpumem::bench::AllocPattern;
using gpumem::bench::AllocSequence;

double run(Allocator& a, const AllocPattern& p, const AllocSequence& seq, std::size_t ops, cudaStream_t stream) {
  using clock = std::chrono::steady_clock;
  if (p.fixed_bytes) {
    for (int i = 0; i < 1000; ++i) a.raw_delete(a.raw_alloc_with_stream(p.fixed_bytes, stream));
    const auto t0 = clock::now();
    for (std::size_t i = 0; i < ops; ++i) a.raw_delete(a.raw_alloc_with_stream(p.fixed_bytes, stream));
    return std::chrono::duration<double, std::nano>(clock::now() - t0).count() / static_cast<double>(ops);
  }
  std::vector<void*> live(p.window);
  for (std::size_t i = 0; i < p.window; ++i) live[i] = a.raw_alloc_with_stream(seq.sizes[i], stream);
  const auto t0 = clock::now();
  for (std::size_t i = 0; i < ops; ++i) {
    void*& slot = live[seq.slots[i]];
    a.raw_delete(slot);
    slot = a.raw_alloc_with_stream(seq.sizes[p.window + i], stream);
  }
  const double ns = std::chrono::duration<double, std::nano>(clock::now() - t0).count() / static_cast<double>(ops);
  for (void* q : live) a.raw_delete(q);
  return ns;
}

// T threads, each with its own sequence on the default stream; returns mean ns per pair per thread.
double run_threads(Allocator& a, const AllocPattern& p, std::size_t ops, int threads) {
  std::vector<AllocSequence> seqs;
  for (int t = 0; t < threads; ++t) {
    seqs.push_back(gpumem::bench::make_alloc_sequence(p, ops, 100 + static_cast<std::uint64_t>(t)));
  }
  std::vector<double> per(static_cast<std::size_t>(threads));
  std::barrier start(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      c10::cuda::set_device(0);
      start.arrive_and_wait();
      per[static_cast<std::size_t>(t)] = run(a, p, seqs[static_cast<std::size_t>(t)], ops, nullptr);
    });
  for (auto& th : pool) th.join();
  double mean = 0;
  for (double v : per) mean += v / threads;
  return mean;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 200000, thread_ops = 20000;
  int threads = 4, rounds = 3;
  std::string config_text;
  gpumem::bench::BenchArgs args("torch_alloc_pairs", "[--ops N] [--thread-ops N] [--threads T] [--rounds R] [--config STR]");
  args.count("--ops", ops, 1)
      .count("--thread-ops", thread_ops, 1)
      .number("--threads", threads, 1, 1024)
      .number("--rounds", rounds, 1, 1000)
      .text("--config", config_text);
  args.parse(argc, argv);
  if (!torch::cuda::is_available()) {
    std::printf("torch_alloc_pairs: no CUDA device; nothing measured\n");
    return 0;
  }
  auto parsed = gpumem::torch::parse_config(config_text);
  if (auto* error = std::get_if<gpumem::torch::ConfigError>(&parsed)) args.fail("--config: " + error->message);

  Allocator& native = *c10::cuda::CUDACachingAllocator::get();
  torch::empty({1}, torch::kCUDA);  // initializes CUDA and the native allocator
  const gpumem::torch::Config config = std::get<gpumem::torch::Config>(parsed);
  Allocator& ours = gpumem::torch::cuda_allocator(config);
  ours.init(static_cast<int>(c10::cuda::device_count()));
  const cudaStream_t stream = nullptr;  // the default stream, as raw_alloc uses with no stream set

  std::printf("torch_alloc_pairs: %s vs %s, %zu pairs (1 thread), %zu pairs per thread (%d threads), median of %d "
              "rounds\n",
              native.name().c_str(), ours.name().c_str(), ops, thread_ops, threads, rounds);
  std::printf("%-28s %12s %12s %8s   %14s %14s %8s\n", "pattern", "native ns", "gpumem ns", "speedup",
              "native ns/thr", "gpumem ns/thr", "speedup");
  for (const AllocPattern& p : gpumem::bench::alloc_patterns()) {
    const AllocSequence seq = gpumem::bench::make_alloc_sequence(p, ops, 1);
    std::vector<double> n1, g1, nt, gt;
    for (int r = 0; r < rounds; ++r) {
      n1.push_back(run(native, p, seq, ops, stream));
      g1.push_back(run(ours, p, seq, ops, stream));
      nt.push_back(run_threads(native, p, thread_ops, threads));
      gt.push_back(run_threads(ours, p, thread_ops, threads));
    }
    const double a = median(n1), b = median(g1), c = median(nt), d = median(gt);
    std::printf("%-28s %12.1f %12.1f %7.2fx   %14.1f %14.1f %7.2fx\n", p.name, a, b, a / b, c, d, c / d);
    std::fflush(stdout);
  }
  return 0;
}
