// Cost of StatsObserver::on_events per event, single thread and 4 threads sharing one observer
// (the engine publishes from every allocating thread to the device's one observer).
//
// Workloads, replayed from pre-built event batches (one batch per engine call: alloc = 1 event,
// free = free_requested + free_completed):
//   expandable  blocks in an expandable region: no classic segment, inactive_split tracking idle
//   classic     blocks inside classic 20 MiB segments: inactive_split tracked per block
//   classic-off the same with inactive_split tracking turned off
// Each thread keeps a window of 256 live blocks and frees a random one per step.
//
//   bench_stats_observer [events_per_thread]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "gpumem/alloc/stats.h"

using namespace gpumem::alloc;

namespace {

using Batches = std::vector<std::vector<AllocEvent>>;

AllocEvent make(EventKind kind, PoolKind pool, std::uintptr_t addr, std::size_t size) {
  AllocEvent e;
  e.kind = kind;
  e.pool = pool;
  e.addr = addr;
  e.size_bytes = size;
  e.requested_bytes = size - 3;
  return e;
}

// One thread's events. Slots of 1 MiB inside 20 MiB segments; a block takes part of its slot.
Batches build(std::size_t events, bool classic, unsigned thread, std::uint64_t seed) {
  constexpr std::size_t kWindow = 256, kSlot = kMiB, kSlotsPerSegment = 20;
  const std::uintptr_t base = 0x100000000000ull + (std::uintptr_t{thread} << 36);
  std::mt19937_64 rng(seed + thread);
  Batches out;
  std::size_t n = 0;
  if (classic) {
    for (std::size_t s = 0; s < (kWindow + kSlotsPerSegment - 1) / kSlotsPerSegment; ++s) {
      out.push_back({make(EventKind::segment_alloc, PoolKind::large,
                          base + s * kSlotsPerSegment * kSlot, kSlotsPerSegment * kSlot)});
      ++n;
    }
  }
  struct Live {
    std::uintptr_t addr;
    std::size_t size;
    PoolKind pool;
  };
  std::vector<Live> live;
  std::vector<std::size_t> free_slots(kWindow);
  for (std::size_t i = 0; i < kWindow; ++i) free_slots[i] = kWindow - 1 - i;
  auto alloc_one = [&] {
    std::size_t slot = free_slots.back();
    free_slots.pop_back();
    std::size_t size = 512 * (1 + rng() % 2048);  // 512 B .. 1 MiB
    PoolKind pool = size <= kMiB / 2 ? PoolKind::small : PoolKind::large;
    // Start somewhere inside the slot so that both neighbours can stay free.
    std::uintptr_t addr = base + slot * kSlot + 512 * (rng() % ((kSlot - size) / 512 + 1));
    live.push_back({addr, size, pool});
    out.push_back({make(EventKind::alloc, pool, addr, size)});
    n += 1;
  };
  while (live.size() < kWindow / 2) alloc_one();
  while (n < events) {
    std::size_t i = rng() % live.size();
    Live b = live[i];
    live[i] = live.back();
    live.pop_back();
    free_slots.push_back((b.addr - base) / kSlot);
    out.push_back({make(EventKind::free_requested, b.pool, b.addr, b.size),
                   make(EventKind::free_completed, b.pool, b.addr, b.size)});
    n += 2;
    alloc_one();
  }
  return out;
}

std::size_t count(const Batches& b) {
  std::size_t n = 0;
  for (const auto& x : b) n += x.size();
  return n;
}

// Returns ns per event per thread (wall time / events each thread published), best of `reps`.
double run(const std::vector<Batches>& per_thread, bool classic, bool track, int reps,
           std::int64_t* inconsistent) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    StatsObserver obs(StatsObserverOptions{kNoLimit, track});
    std::vector<std::thread> threads;
    auto t0 = std::chrono::steady_clock::now();
    if (per_thread.size() == 1) {
      for (const auto& batch : per_thread[0]) obs.on_events(batch);
    } else {
      for (const auto& batches : per_thread)
        threads.emplace_back([&obs, &batches] {
          for (const auto& batch : batches) obs.on_events(batch);
        });
      for (auto& t : threads) t.join();
    }
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    best = std::min(best, ns / static_cast<double>(count(per_thread[0])));
    *inconsistent = obs.stats().num_inconsistent_events;
    if (classic && track && obs.stats().inactive_split[0].allocated == 0) {
      std::fprintf(stderr, "classic workload produced no inactive splits: the bench is wrong\n");
      std::exit(1);
    }
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t events = 2000000;
  gpumem::bench::BenchArgs("bench_stats_observer", "[EVENTS_PER_THREAD]")
      .positional_number("EVENTS_PER_THREAD", events, std::size_t{1}, std::size_t{1} << 40)
      .parse(argc, argv);
  const int reps = 5;
  std::printf("StatsObserver::on_events, %zu events per thread, best of %d runs\n", events, reps);
  std::printf("%-12s %8s %16s %22s\n", "workload", "threads", "ns/event/thread",
              "aggregate Mevents/s");
  struct Case {
    const char* name;
    bool classic;
    bool track;
  };
  for (Case c : {Case{"expandable", false, true}, Case{"classic", true, true},
                 Case{"classic-off", true, false}}) {
    for (unsigned threads : {1u, 4u}) {
      std::vector<Batches> per_thread;
      for (unsigned t = 0; t < threads; ++t) per_thread.push_back(build(events, c.classic, t, 42));
      std::int64_t inconsistent = 0;
      double ns = run(per_thread, c.classic, c.track, reps, &inconsistent);
      std::printf("%-12s %8u %16.1f %22.1f\n", c.name, threads, ns, threads * 1e3 / ns);
      if (inconsistent != 0) {
        std::fprintf(stderr, "%lld inconsistent events: the bench is wrong\n",
                     static_cast<long long>(inconsistent));
        return 1;
      }
    }
  }
  return 0;
}
