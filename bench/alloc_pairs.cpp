// ns per alloc+free pair of the engine on SimSource, single thread and T threads sharing one
// engine, for these op sequences: fixed 4 KiB, 1 MiB and 64 MiB pairs,
// and windows of W live allocations (W = 64, 1024; sizes log-uniform in 512 B..32 MiB; each step
// frees a random slot and allocates a new size into it).
//
//   bench_alloc_pairs [--ops N] [--threads T] [--rounds R] [--pattern TEXT]... [--observer]
//                     [--config TEXT] [--tsv] [--interleave] [--engine-per-thread] [--driver-costs]
//
// Every one-thread measurement (all patterns, all rounds) runs before any T-thread one, so the
// one-thread column times a process in which no other thread has used an engine, as in a
// single-threaded program. --interleave keeps the order of earlier versions (per pattern and
// round: one thread, then T threads). The order is not what spreads the one-thread column on the
// H200 host: one run there (commit 2ecaa8d) read 4 KiB pairs at 129 (83..132) ns in this order and
// at 114 (95..124) ns interleaved with thread_cache:False, against 79 (79..81) in this order with
// thread_cache:False (docs/notes/thread-caches.md, "Single-threaded programs").
// --threads 0 measures one thread only. --rounds R runs every measurement R times on a fresh
// engine and prints the median and the spread (min..max). --pattern keeps the patterns whose name
// contains TEXT (repeatable). --observer attaches the stats observer, as the torch adapter does.
// --config takes engine settings in GPUMEM_ALLOC_CONF's syntax (e.g. thread_cache:False).
// --engine-per-thread gives each of the T threads an engine (and SimSource) of its own, made before
// the threads start: nothing is shared but the host (cores, caches, memory). What per-thread
// arenas could at best reach with T threads on that host (docs/notes/thread-caches.md).
// --driver-costs makes SimSource's create, map and unmap take the CUDA driver's time on the H100
// host (spinning; TimedSource below), with the steady clock as the source's clock: the pairs then
// include the driver time a GPU's engine spends, and time-dependent rules see it.
// --tsv prints one tab-separated line per measurement instead of the table:
//   pairs <TAB> pattern <TAB> threads <TAB> median_ns <TAB> min_ns <TAB> max_ns
// The table's last column counts, for the last round, the SimSource calls and the peak physical
// bytes ("peak"; with an engine per thread, the sum of the engines' peaks), and for the multi-thread
// runs how often an allocate or free took the engine's lock and found it taken, per allocation
// (CachingAllocator::lock_counts; calls served by a thread cache take none).
// Every engine is made and destroyed outside the timed loops.
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
#include "bench_args.h"
#include "spread.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/forwarding_source.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/alloc/stats.h"

using namespace gpumem::alloc;

namespace {

using gpumem::bench::AllocPattern;
using gpumem::bench::Spread;
using gpumem::bench::spread_of;

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

// --driver-costs: SimSource's calls take what the CUDA driver's took on the H100 host through
// torch_alloc_pairs (docs/measurements/h200-2026-12-05-d/torch-pairs-final, window 1,024: cuMemCreate
// 7.4 us, cuMemMap + cuMemSetAccess 1.4 + 21.8 us, cuMemUnmap 18.8 us), spent spinning on the
// steady clock, which is also the source's clock: decisions that depend on time (the recycle
// budget, recycle_churn) then see driver time as a GPU's engine does.
struct DriverCosts {
  std::int64_t create_ns = 7'400, map_ns = 23'200, unmap_ns = 18'800;
};

class TimedSource final : public ForwardingSource {
 public:
  TimedSource(SimSource& inner, DriverCosts costs) : ForwardingSource(inner), costs_(costs) {}
  SourceResult<PhysHandle> create(std::size_t size) override {
    spin(costs_.create_ns);
    return ForwardingSource::create(size);
  }
  SourceStatus map(std::uintptr_t va, std::size_t size, PhysHandle handle) override {
    spin(costs_.map_ns);
    return ForwardingSource::map(va, size, handle);
  }
  SourceStatus unmap(std::uintptr_t va, std::size_t size) override {
    spin(costs_.unmap_ns);
    return ForwardingSource::unmap(va, size);
  }
  std::int64_t now_ns() const override { return steady_ns(); }

 private:
  static std::int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void spin(std::int64_t ns) {
    const std::int64_t end = steady_ns() + ns;
    while (steady_ns() < end) {
    }
  }
  DriverCosts costs_;
};

bool g_driver_costs = false;

struct Engine {
  SimSource source;
  std::unique_ptr<TimedSource> timed;
  std::unique_ptr<StreamEvents> events = make_immediate_events();
  std::unique_ptr<CachingAllocator> engine;
  Engine(bool observer, Config cfg) : source(options()) {
    cfg.va_reserve_bytes = std::size_t{1} << 42;
    if (g_driver_costs) timed = std::make_unique<TimedSource>(source, DriverCosts{});
    engine = std::make_unique<CachingAllocator>(timed ? static_cast<MemorySource&>(*timed) : source, *events, cfg);
    if (observer) engine->attach_observer(std::make_shared<StatsObserver>());
  }
  static SimSourceOptions options() {
    SimSourceOptions so;
    so.capacity_bytes = std::size_t{1} << 46;
    return so;
  }
};

// One measurement on a fresh engine: `threads` == 0 runs the pattern on this thread; otherwise
// that many threads run it at once, each with its own sequence. Returns ns per pair (per thread).
// own_engines: each thread gets an engine of its own (counters: their sums).
double measure(const AllocPattern& p, std::size_t ops, int threads, bool observer, const Config& config,
               SimSourceCounters* counters, bool own_engines = false, std::size_t* physical = nullptr,
               EngineLockCounts* locks = nullptr) {
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(std::make_unique<Engine>(observer, config));
  double ns = 0;
  if (threads == 0) {
    ns = run_pattern(*engines[0]->engine, p, ops, 1, 0);
  } else {
    if (own_engines)
      while (engines.size() < static_cast<std::size_t>(threads)) engines.push_back(std::make_unique<Engine>(observer, config));
    std::vector<double> per(static_cast<std::size_t>(threads));
    std::vector<std::thread> pool;
    std::barrier start(threads);
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        CachingAllocator& engine = *engines[own_engines ? static_cast<std::size_t>(t) : 0]->engine;
        start.arrive_and_wait();
        per[static_cast<std::size_t>(t)] = run_pattern(engine, p, ops, 100 + static_cast<std::uint64_t>(t), 0);
      });
    for (auto& th : pool) th.join();
    for (double v : per) ns += v / threads;
  }
  if (physical) {
    *physical = 0;
    for (const auto& e : engines) *physical += e->source.peak_physical_bytes();
  }
  if (locks) {
    *locks = EngineLockCounts{};
    for (const auto& e : engines) {
      const EngineLockCounts x = e->engine->lock_counts();
      locks->acquisitions += x.acquisitions;
      locks->contended += x.contended;
    }
  }
  if (counters) {
    *counters = SimSourceCounters{};
    for (const auto& e : engines) {
      const SimSourceCounters x = e->source.counters();
      counters->reserves += x.reserves;
      counters->releases += x.releases;
      counters->creates += x.creates;
      counters->destroys += x.destroys;
      counters->maps += x.maps;
      counters->unmaps += x.unmaps;
    }
  }
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 1'000'000;
  int threads = 4, rounds = 1;
  bool observer = false, tsv = false, interleave = false, own_engines = false;
  Config config;
  std::vector<std::string> wanted;
  gpumem::bench::BenchArgs args("bench_alloc_pairs",
                                "[--ops N] [--threads T] [--rounds R] [--pattern TEXT]... [--observer] [--config TEXT] [--tsv] "
                                "[--interleave] [--engine-per-thread] [--driver-costs]");
  args.count("--ops", ops, 1)
      .number("--threads", threads, 0, 1024)
      .number("--rounds", rounds, 1, 1000)
      .texts("--pattern", wanted)
      .flag("--observer", observer)
      .custom("--config",
              [&config](const std::string& text) -> std::string {
                auto parsed = parse_config(text);
                if (auto* err = std::get_if<ConfigError>(&parsed)) return err->message;
                config = std::get<Config>(parsed);
                return std::string();
              })
      .flag("--tsv", tsv)
      .flag("--interleave", interleave)
      .flag("--engine-per-thread", own_engines)
      .flag("--driver-costs", g_driver_costs);
  args.parse(argc, argv);
  std::vector<AllocPattern> patterns;
  for (const AllocPattern& p : gpumem::bench::alloc_patterns()) {
    bool keep = wanted.empty();
    for (const auto& w : wanted) keep = keep || std::string(p.name).find(w) != std::string::npos;
    if (keep) patterns.push_back(p);
  }
  if (patterns.empty()) args.fail("no pattern matches --pattern");

  if (!tsv) {
    fmt::print("gpumem engine on SimSource, {} pairs per thread{}{}{}\n", ops, observer ? ", stats observer attached" : "",
               own_engines && threads ? fmt::format(", {} threads each with an engine of its own", threads) : "",
               rounds > 1 ? fmt::format(", median (min..max) of {} rounds", rounds) : "");
    fmt::print("{:<28} {:>22} {:>26}\n", "pattern", "1 thread ns", threads ? fmt::format("{} threads ns/thread", threads) : "");
  }
  // single[i] / multi[i]: pattern i's rounds; the counters of its last round.
  const std::size_t n = patterns.size();
  std::vector<std::vector<double>> single(n), multi(n);
  std::vector<SimSourceCounters> c(n), cm(n);
  // The peak physical bytes of the last round (what the pattern made the engine reserve at most;
  // with an engine per thread, the sum of their peaks).
  std::vector<std::size_t> phys(n), physm(n);
  std::vector<EngineLockCounts> locksm(n);
  auto run_single = [&](std::size_t i) { single[i].push_back(measure(patterns[i], ops, 0, observer, config, &c[i], false, &phys[i])); };
  auto run_multi = [&](std::size_t i) {
    if (threads)
      multi[i].push_back(measure(patterns[i], ops, threads, observer, config, &cm[i], own_engines, &physm[i], &locksm[i]));
  };
  auto print_row = [&](std::size_t i) {
    const AllocPattern& p = patterns[i];
    // Allocations of one multi-thread round: every thread runs `ops` pairs after its first
    // allocations (1,000 warm-up pairs of a fixed size; the window's first blocks).
    const double allocs_per_round = static_cast<double>(threads) * static_cast<double>(ops + (p.fixed_bytes ? 1000 : p.window));
    const Spread s = spread_of(single[i]);
    if (tsv) {
      fmt::print("pairs\t{}\t1\t{:.1f}\t{:.1f}\t{:.1f}\n", p.name, s.median, s.min, s.max);
      if (threads) {
        const Spread m = spread_of(multi[i]);
        fmt::print("pairs\t{}\t{}\t{:.1f}\t{:.1f}\t{:.1f}\n", p.name, threads, m.median, m.min, m.max);
      }
    } else {
      constexpr double kMiB = 1 << 20;
      fmt::print("{:<28} {:>22} {:>26}   (1 thread: maps {}, unmaps {}, creates {}, peak {:.0f} MiB{})\n", p.name,
                 gpumem::bench::format_spread(s, rounds),
                 threads ? gpumem::bench::format_spread(spread_of(multi[i]), rounds) : "", c[i].maps, c[i].unmaps,
                 c[i].creates, static_cast<double>(phys[i]) / kMiB,
                 threads ? fmt::format("; {} threads: maps {}, creates {}, peak {:.0f} MiB, engine lock {:.4f} per allocation, "
                                       "{:.4f} contended",
                                       threads, cm[i].maps, cm[i].creates, static_cast<double>(physm[i]) / kMiB,
                                       static_cast<double>(locksm[i].acquisitions) / allocs_per_round,
                                       static_cast<double>(locksm[i].contended) / allocs_per_round)
                         : "");
    }
    std::fflush(stdout);
  };
  if (interleave) {
    for (std::size_t i = 0; i < n; ++i) {
      for (int r = 0; r < rounds; ++r) {
        run_single(i);
        run_multi(i);
      }
      print_row(i);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i)
      for (int r = 0; r < rounds; ++r) run_single(i);
    for (std::size_t i = 0; i < n; ++i) {
      for (int r = 0; r < rounds; ++r) run_multi(i);
      print_row(i);
    }
  }
  return 0;
}
