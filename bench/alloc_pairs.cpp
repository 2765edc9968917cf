// ns per alloc+free pair of the engine on SimSource, single thread and 4 threads sharing one
// engine, for these op sequences: fixed 4 KiB, 1 MiB and 64 MiB pairs,
// and windows of W live allocations (W = 64, 1024; sizes log-uniform in 512 B..32 MiB; each step
// frees a random slot and allocates a new size into it).
//
//   bench_alloc_pairs [--ops N] [--threads T] [--observer]
//
// --observer attaches the stats observer, as the torch adapter does.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "alloc_pattern.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/sim_source.h"
#if __has_include("gpumem/alloc/stats.h")
#include "gpumem/alloc/stats.h"
#define GPUMEM_BENCH_HAVE_STATS 1
#endif

using namespace gpumem::alloc;

namespace {

using gpumem::bench::AllocPattern;

// Runs `ops` pairs of the pattern on one thread; returns ns per pair.
double run_pattern(CachingAllocator& engine, const AllocPattern& p, std::size_t ops, std::uint64_t seed, StreamId stream) {
  using clock = std::chrono::steady_clock;
  if (p.fixed_bytes) {
    // warm-up
    for (int i = 0; i < 1000; ++i) engine.free(engine.allocate(p.fixed_bytes, stream).ptr);
    const auto t0 = clock::now();
    for (std::size_t i = 0; i < ops; ++i) {
      auto r = engine.allocate(p.fixed_bytes, stream);
      if (!r.ok()) std::abort();
      engine.free(r.ptr);
    }
    return std::chrono::duration<double, std::nano>(clock::now() - t0).count() / static_cast<double>(ops);
  }
  const gpumem::bench::AllocSequence seq = gpumem::bench::make_alloc_sequence(p, ops, seed);
  std::vector<void*> live(p.window);
  for (std::size_t i = 0; i < p.window; ++i) live[i] = engine.allocate(seq.sizes[i], stream).ptr;
  const auto t0 = clock::now();
  for (std::size_t i = 0; i < ops; ++i) {
    void*& slot = live[seq.slots[i]];
    engine.free(slot);
    auto r = engine.allocate(seq.sizes[p.window + i], stream);
    if (!r.ok()) std::abort();
    slot = r.ptr;
  }
  const double ns = std::chrono::duration<double, std::nano>(clock::now() - t0).count() / static_cast<double>(ops);
  for (void* q : live) engine.free(q);
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 1'000'000;
  int threads = 4;
  bool observer = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ops" && i + 1 < argc) {
      ops = std::stoull(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--observer") {
      observer = true;
    } else {
      fmt::print(stderr, "bench_alloc_pairs: unknown argument '{}'; usage: bench_alloc_pairs [--ops N] [--threads T] [--observer]\n", a);
      return 2;
    }
  }
  fmt::print("gpumem engine on SimSource, {} pairs per thread{}\n", ops, observer ? ", stats observer attached" : "");
  fmt::print("{:<28} {:>14} {:>24}\n", "pattern", "1 thread ns", fmt::format("{} threads ns/thread", threads));
  for (const AllocPattern& p : gpumem::bench::alloc_patterns()) {
    SimSourceOptions so;
    so.capacity_bytes = std::size_t{1} << 46;
    SimSource source(so);
    auto events = make_immediate_events();
    Config cfg;
    cfg.va_reserve_bytes = std::size_t{1} << 42;
    CachingAllocator engine(source, *events, cfg);
#ifdef GPUMEM_BENCH_HAVE_STATS
    if (observer) engine.attach_observer(std::make_shared<StatsObserver>());
#endif
    const double single = run_pattern(engine, p, ops, 1, 0);
    std::vector<double> per(threads);
    std::vector<std::thread> pool;
    std::barrier start(threads);
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        start.arrive_and_wait();
        per[t] = run_pattern(engine, p, ops, 100 + t, 0);
      });
    for (auto& th : pool) th.join();
    double mean = 0;
    for (double v : per) mean += v / threads;
    const auto c = source.counters();
    fmt::print("{:<28} {:>14.1f} {:>24.1f}   (maps {}, unmaps {}, creates {})\n", p.name, single, mean, c.maps,
               c.unmaps, c.creates);
  }
  return 0;
}
