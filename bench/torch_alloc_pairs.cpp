// ns per alloc+free pair: gpumem's CUDA allocator vs PyTorch's native caching allocator, side by
// side in one process, both driven through the same c10 calls (raw_alloc_with_stream /
// raw_delete) with the same op sequences as bench/alloc_pairs.cpp (one definition,
// bench/alloc_pattern.h):
// fixed 4 KiB, 1 MiB and 64 MiB pairs, and windows of W live allocations (W = 64, 1024; sizes
// log-uniform in 512 B..32 MiB; each step frees a random slot and allocates a new size into it),
// single-threaded and with T threads each running its own sequence.
//
//   torch_alloc_pairs [--ops N] [--thread-ops N] [--threads T] [--rounds R] [--config STR] [--sim]
//                     [--gpumem-only] [--pattern TEXT]...
//
// --pattern keeps the patterns whose name contains TEXT (repeatable), as in bench_alloc_pairs: one
// pattern alone under callgrind gives its instructions per pair.
//
// gpumem is not installed: libtorch keeps its native allocator, and gpumem's allocator object is
// driven directly (gpumem::torch::cuda_allocator()), so both run under the same conditions. Each
// pattern runs R rounds alternating native and gpumem; the table shows the median of the rounds.
// Every pattern's 1-thread rounds run before any T-thread round: once T threads have contended
// gpumem's engine it keeps its thread caches and the stats observer its shards for the rest of the
// process, so a 1-thread column measured after them would not be a single-threaded program's.
// Before the table, one line says what c10::cuda::current_device() costs (raw_alloc calls it in
// both allocators: it is the part of every pair that no allocator controls), 1 thread and T.
//
// --sim needs no GPU: gpumem only, on a simulated device (source:sim, GPUMEM_ALLOW_SIM=1 is set),
// through the C entry points CUDAPluggableAllocator calls (gpumem_malloc / gpumem_free: the
// adapter's per-call path without c10::cuda::current_device()). It is the CPU harness for the
// adapter's own cost and its contention between threads (compare bench_alloc_pairs --observer,
// the engine and observer alone).
// The last columns count gpumem's driver calls during the pattern's rounds, the 1-thread rounds and
// the T-thread rounds apart ("1t / Tt"), and, on a GPU, the host time those calls took per pair of
// the 1-thread rounds (memory_stats' gpumem.driver.*.ns: create, map, set_access, unmap, release;
// the median round, as for "gpumem ns", of which it is a part). A call costs microseconds on a GPU
// and nothing on a simulated device, so a pattern that keeps calling the driver in its steady
// state is slower through libtorch than on SimSource by about that much. After the table, a line
// per pattern splits the 1-thread rounds' driver calls by kind: calls, host ns per pair, us per call,
// and a second line the T-thread rounds' (ns per pair per thread: the calls' host time summed over
// the threads, over the pairs of one thread; the wall time they add to each thread's pairs if the
// calls take turns, T times what they add if they run in parallel; the microseconds per call,
// against the 1-thread line's, show which).
// --gpumem-only skips PyTorch's allocator (its columns read 0): a gpumem run to sample with a
// profiler (scripts/gpu/profile.sh), whose time is otherwise mostly native's four-thread rounds.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
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
#include "gpumem/torch/c_api.h"
#include "gpumem/torch/config.h"
#include "gpumem/torch/cuda_allocator.h"
#include "gpumem/torch/memory_stats.h"

namespace {

using Allocator = c10::cuda::CUDACachingAllocator::CUDAAllocator;

using gpumem::bench::AllocPattern;
using gpumem::bench::AllocSequence;

// The calls a pair makes: c10's allocator interface, or gpumem's C entry points (--sim).
struct Calls {
  Allocator* allocator = nullptr;  // null: gpumem_malloc / gpumem_free on device 0
  void* alloc(std::size_t n, cudaStream_t stream) const {
    return allocator ? allocator->raw_alloc_with_stream(n, stream) : gpumem_malloc(n, 0, stream);
  }
  void free(void* p) const {
    if (allocator) allocator->raw_delete(p);
    else gpumem_free(p, 0, 0, nullptr);
  }
};

double run(const Calls& a, const AllocPattern& p, const AllocSequence& seq, std::size_t ops, cudaStream_t stream) {
  using clock = std::chrono::steady_clock;
  if (p.fixed_bytes) {
    for (int i = 0; i < 1000; ++i) a.free(a.alloc(p.fixed_bytes, stream));
    const auto t0 = clock::now();
    for (std::size_t i = 0; i < ops; ++i) a.free(a.alloc(p.fixed_bytes, stream));
    return std::chrono::duration<double, std::nano>(clock::now() - t0).count() / static_cast<double>(ops);
  }
  std::vector<void*> live(p.window);
  for (std::size_t i = 0; i < p.window; ++i) live[i] = a.alloc(seq.sizes[i], stream);
  const auto t0 = clock::now();
  for (std::size_t i = 0; i < ops; ++i) {
    void*& slot = live[seq.slots[i]];
    a.free(slot);
    slot = a.alloc(seq.sizes[p.window + i], stream);
  }
  const double ns = std::chrono::duration<double, std::nano>(clock::now() - t0).count() / static_cast<double>(ops);
  for (void* q : live) a.free(q);
  return ns;
}

// T threads, each with its own sequence on the default stream; returns mean ns per pair per thread.
double run_threads(const Calls& a, const AllocPattern& p, std::size_t ops, int threads, bool gpu) {
  std::vector<AllocSequence> seqs;
  for (int t = 0; t < threads; ++t) {
    seqs.push_back(gpumem::bench::make_alloc_sequence(p, ops, 100 + static_cast<std::uint64_t>(t)));
  }
  std::vector<double> per(static_cast<std::size_t>(threads));
  std::barrier start(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      if (gpu) c10::cuda::set_device(0);
      start.arrive_and_wait();
      per[static_cast<std::size_t>(t)] = run(a, p, seqs[static_cast<std::size_t>(t)], ops, nullptr);
    });
  for (auto& th : pool) th.join();
  double mean = 0;
  for (double v : per) mean += v / threads;
  return mean;
}

// ns per c10::cuda::current_device() call, on `threads` threads at once (0: this thread).
double current_device_ns(int threads) {
  using clock = std::chrono::steady_clock;
  constexpr int kCalls = 200000;
  auto loop = [] {
    int sum = 0;
    const auto t0 = clock::now();
    for (int i = 0; i < kCalls; ++i) sum += c10::cuda::current_device();
    const double ns = std::chrono::duration<double, std::nano>(clock::now() - t0).count() / kCalls;
    return sum < 0 ? -ns : ns;  // keeps the calls
  };
  if (threads == 0) return loop();
  std::vector<double> per(static_cast<std::size_t>(threads));
  std::barrier start(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      c10::cuda::set_device(0);
      start.arrive_and_wait();
      per[static_cast<std::size_t>(t)] = loop();
    });
  for (auto& th : pool) th.join();
  double mean = 0;
  for (double v : per) mean += v / threads;
  return mean;
}

// The driver calls gpumem made so far (num_device_alloc + num_device_free: maps and unmaps of
// expandable memory, segment creations and releases): a pattern that keeps calling the driver in
// its steady state pays microseconds per call on a GPU and nothing on a simulated device.
long long driver_calls(Allocator& a) {
  const auto s = a.getDeviceStats(0);
  return static_cast<long long>(s.num_device_alloc + s.num_device_free);
}

// gpumem's driver calls so far, by kind: calls and host nanoseconds (memory_stats'
// gpumem.driver.<call>.{calls,ns}; zero where the source is not the CUDA driver's).
constexpr std::array<const char*, 5> kDriverCalls = {"create", "map", "set_access", "unmap", "release"};
struct DriverCall {
  long long calls = 0, ns = 0;
};
std::array<DriverCall, kDriverCalls.size()> driver_by_call() {
  const auto m = gpumem::torch::memory_stats(c10::Device(c10::DeviceType::CUDA, 0));
  std::array<DriverCall, kDriverCalls.size()> out{};
  for (std::size_t k = 0; k < kDriverCalls.size(); ++k) {
    const std::string base = std::string("gpumem.driver.") + kDriverCalls[k];
    if (const auto it = m.find(base + ".calls"); it != m.end()) out[k].calls = static_cast<long long>(it->second);
    if (const auto it = m.find(base + ".ns"); it != m.end()) out[k].ns = static_cast<long long>(it->second);
  }
  return out;
}

// Host nanoseconds gpumem spent in driver calls so far (the VMM source's timed calls; 0 where the
// source is not the CUDA driver's, e.g. --sim).
long long driver_ns() {
  long long ns = 0;
  for (const DriverCall& c : driver_by_call()) ns += c.ns;
  return ns;
}

// One line of gpumem's statistics after the run: classic segments (the stats observer keeps its
// lock for every event while one exists), driver calls, retries, the engines serving the device
// (arenas:N), the times the churn allowance opened (recycle_churn: the moves it saved cost memory),
// and the most memory reserved at once over the whole run (all patterns: the arenas' and the
// allowance's memory price shows here).
void print_gpumem_stats(Allocator& a) {
  const auto s = a.getDeviceStats(0);
  const auto m = gpumem::torch::memory_stats(c10::Device(c10::DeviceType::CUDA, 0));
  std::printf("gpumem after the run: classic segments peak %lld, device allocs %lld, device frees %lld, alloc retries "
              "%lld, OOMs %lld, engines %lld, churn allowance openings %lld, peak reserved %.0f MiB\n",
              static_cast<long long>(s.segment[0].peak), static_cast<long long>(s.num_device_alloc),
              static_cast<long long>(s.num_device_free), static_cast<long long>(s.num_alloc_retries),
              static_cast<long long>(s.num_ooms), static_cast<long long>(m.at("gpumem.arenas")),
              static_cast<long long>(m.at("gpumem.recycle_churn.openings")),
              static_cast<double>(s.reserved_bytes[0].peak) / 1048576.0);
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
  bool sim = false, gpumem_only = false;
  std::vector<std::string> wanted;
  gpumem::bench::BenchArgs args("torch_alloc_pairs",
                                "[--ops N] [--thread-ops N] [--threads T] [--rounds R] [--config STR] [--sim] "
                                "[--gpumem-only] [--pattern TEXT]...");
  args.count("--ops", ops, 1)
      .count("--thread-ops", thread_ops, 1)
      .number("--threads", threads, 1, 1024)
      .number("--rounds", rounds, 1, 1000)
      .text("--config", config_text)
      .flag("--sim", sim)
      .flag("--gpumem-only", gpumem_only)
      .texts("--pattern", wanted);
  args.parse(argc, argv);
  std::vector<AllocPattern> patterns;
  for (const AllocPattern& p : gpumem::bench::alloc_patterns()) {
    bool keep = wanted.empty();
    for (const auto& w : wanted) keep = keep || std::string(p.name).find(w) != std::string::npos;
    if (keep) patterns.push_back(p);
  }
  if (patterns.empty())
    args.fail("no pattern matches --pattern (names: 4 KiB pairs, 1 MiB pairs, 64 MiB pairs, window 64, window 1024)");
  if (sim) {
    if (config_text.find("source:") == std::string::npos) config_text += config_text.empty() ? "source:sim" : ",source:sim";
    ::setenv("GPUMEM_ALLOW_SIM", "1", 1);
  } else if (!torch::cuda::is_available()) {
    std::printf("torch_alloc_pairs: no CUDA device; nothing measured (--sim measures gpumem on a simulated device)\n");
    return 0;
  }
  auto parsed = gpumem::torch::parse_config(config_text);
  if (auto* error = std::get_if<gpumem::torch::ConfigError>(&parsed)) args.fail("--config: " + error->message);
  const gpumem::torch::Config config = std::get<gpumem::torch::Config>(parsed);
  const cudaStream_t stream = nullptr;  // the default stream, as raw_alloc uses with no stream set

  if (sim) {
    // gpumem only: the C entry points use the allocator made here (the configuration above).
    Allocator& ours_allocator = gpumem::torch::cuda_allocator(config);
    const Calls ours{};
    std::printf("torch_alloc_pairs --sim: gpumem on a simulated device through gpumem_malloc / gpumem_free, %zu pairs "
                "(1 thread), %zu pairs per thread (%d threads), median of %d rounds\n",
                ops, thread_ops, threads, rounds);
    std::printf("%-28s %12s   %14s %20s\n", "pattern", "gpumem ns", "gpumem ns/thr", "driver calls 1t / Tt");
    std::vector<double> g1(patterns.size());
    std::vector<long long> calls(patterns.size());
    for (std::size_t i = 0; i < patterns.size(); ++i) {  // 1 thread first (see the top)
      const AllocSequence seq = gpumem::bench::make_alloc_sequence(patterns[i], ops, 1);
      std::vector<double> r1;
      const long long calls0 = driver_calls(ours_allocator);
      for (int r = 0; r < rounds; ++r) r1.push_back(run(ours, patterns[i], seq, ops, stream));
      g1[i] = median(r1);
      calls[i] = driver_calls(ours_allocator) - calls0;
    }
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      std::vector<double> gt;
      const long long calls0 = driver_calls(ours_allocator);
      for (int r = 0; r < rounds; ++r) gt.push_back(run_threads(ours, patterns[i], thread_ops, threads, false));
      const long long calls_t = driver_calls(ours_allocator) - calls0;
      std::printf("%-28s %12.1f   %14.1f %20s\n", patterns[i].name, g1[i], median(gt),
                  (std::to_string(calls[i]) + " / " + std::to_string(calls_t)).c_str());
      std::fflush(stdout);
    }
    print_gpumem_stats(ours_allocator);
    return 0;
  }

  Allocator& native_allocator = *c10::cuda::CUDACachingAllocator::get();
  torch::empty({1}, torch::kCUDA);  // initializes CUDA and the native allocator
  Allocator& ours_allocator = gpumem::torch::cuda_allocator(config);
  ours_allocator.init(static_cast<int>(c10::cuda::device_count()));
  const Calls native{&native_allocator}, ours{&ours_allocator};

  std::printf("torch_alloc_pairs: %s vs %s, %zu pairs (1 thread), %zu pairs per thread (%d threads), median of %d "
              "rounds%s\n",
              native_allocator.name().c_str(), ours_allocator.name().c_str(), ops, thread_ops, threads, rounds,
              gpumem_only ? " (--gpumem-only: PyTorch's allocator not run, its columns 0)" : "");
  std::printf("c10::cuda::current_device() (in every raw_alloc of both): %.1f ns (1 thread), %.1f ns/thread (%d "
              "threads)\n",
              current_device_ns(0), current_device_ns(threads), threads);
  std::printf("%-28s %12s %12s %8s   %14s %14s %8s %20s %16s\n", "pattern", "native ns", "gpumem ns", "speedup",
              "native ns/thr", "gpumem ns/thr", "speedup", "driver calls 1t / Tt", "driver ns (1t)");
  std::vector<double> n1(patterns.size()), g1(patterns.size()), d1(patterns.size());
  std::vector<long long> calls(patterns.size());
  // Per pattern, the 1-thread rounds' driver calls by kind (all rounds together).
  std::vector<std::array<DriverCall, kDriverCalls.size()>> by_call(patterns.size());
  for (std::size_t i = 0; i < patterns.size(); ++i) {  // 1 thread first (see the top)
    const AllocSequence seq = gpumem::bench::make_alloc_sequence(patterns[i], ops, 1);
    std::vector<double> rn, rg, rd;  // rd: driver ns per pair of each gpumem round
    const long long calls0 = driver_calls(ours_allocator);
    const auto by_call0 = driver_by_call();
    for (int r = 0; r < rounds; ++r) {
      rn.push_back(gpumem_only ? 0.0 : run(native, patterns[i], seq, ops, stream));
      const long long ns0 = driver_ns();
      rg.push_back(run(ours, patterns[i], seq, ops, stream));
      rd.push_back(static_cast<double>(driver_ns() - ns0) / static_cast<double>(ops));
    }
    n1[i] = median(rn);
    g1[i] = median(rg);
    d1[i] = median(rd);
    calls[i] = driver_calls(ours_allocator) - calls0;
    const auto by_call1 = driver_by_call();
    for (std::size_t k = 0; k < kDriverCalls.size(); ++k)
      by_call[i][k] = {by_call1[k].calls - by_call0[k].calls, by_call1[k].ns - by_call0[k].ns};
  }
  // Per pattern, the T-thread rounds' driver calls by kind (all rounds together).
  std::vector<std::array<DriverCall, kDriverCalls.size()>> by_call_t(patterns.size());
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    std::vector<double> nt, gt;
    const long long calls0 = driver_calls(ours_allocator);
    const auto by_call0 = driver_by_call();
    for (int r = 0; r < rounds; ++r) {
      nt.push_back(gpumem_only ? 0.0 : run_threads(native, patterns[i], thread_ops, threads, true));
      gt.push_back(run_threads(ours, patterns[i], thread_ops, threads, true));
    }
    const long long calls_t = driver_calls(ours_allocator) - calls0;
    const auto by_call1 = driver_by_call();
    for (std::size_t k = 0; k < kDriverCalls.size(); ++k)
      by_call_t[i][k] = {by_call1[k].calls - by_call0[k].calls, by_call1[k].ns - by_call0[k].ns};
    const double a = n1[i], b = g1[i], c = median(nt), d = median(gt);
    std::printf("%-28s %12.1f %12.1f %7.2fx   %14.1f %14.1f %7.2fx %20s %16.1f\n", patterns[i].name, a, b, a / b, c, d,
                c / d, (std::to_string(calls[i]) + " / " + std::to_string(calls_t)).c_str(), d1[i]);
    std::fflush(stdout);
  }
  // Where the 1-thread rounds' driver time went, by call: calls, and host ns per pair of all the
  // rounds (their sum is the mean of the rounds' "driver ns (1t)", whose column is the median).
  std::printf("gpumem's driver calls by kind (all %d rounds): calls, ns per pair (%d threads: summed over the threads, "
              "per pair of one thread), us per call\n",
              rounds, threads);
  const auto by_kind = [&](const std::array<DriverCall, kDriverCalls.size()>& calls, std::size_t pairs) {
    std::string line;
    for (std::size_t k = 0; k < kDriverCalls.size(); ++k) {
      const DriverCall& c = calls[k];
      if (c.calls == 0) continue;
      char cell[96];
      std::snprintf(cell, sizeof cell, "  %s %lld, %.1f, %.1f", kDriverCalls[k], c.calls,
                    static_cast<double>(c.ns) / static_cast<double>(pairs),
                    static_cast<double>(c.ns) / 1e3 / static_cast<double>(c.calls));
      line += cell;
    }
    return line.empty() ? std::string("  no driver call") : line;
  };
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    std::printf("  %-28s 1t%s\n", patterns[i].name, by_kind(by_call[i], ops * rounds).c_str());
    std::printf("  %-28s %dt%s\n", "", threads, by_kind(by_call_t[i], thread_ops * rounds).c_str());
  }
  print_gpumem_stats(ours_allocator);
  return 0;
}
