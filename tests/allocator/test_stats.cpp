// StatsObserver: PyTorch DeviceStats semantics from handmade event sequences, the flat
// memory_stats keys, thread safety, and the real PyTorch 2.11 traces.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <barrier>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/alloc/stats.h"
#include "gpumem/alloc/stream_events.h"

using namespace gpumem::alloc;

namespace {

constexpr std::size_t kAll = 0, kSmall = 1, kLarge = 2;

AllocEvent ev(EventKind kind, PoolKind pool, std::uintptr_t addr, std::size_t size,
              std::size_t requested = 0, std::uint16_t pieces = 0) {
  AllocEvent e;
  e.kind = kind;
  e.pool = pool;
  e.addr = addr;
  e.size_bytes = size;
  e.requested_bytes = requested;
  e.pieces_created_or_destroyed = pieces;
  return e;
}

void feed(StatsObserver& obs, std::initializer_list<AllocEvent> events) {
  std::vector<AllocEvent> v(events);
  static std::uint64_t seq = 0;
  for (auto& e : v) e.seq = ++seq;
  obs.on_events(v);
}

Stat stat(std::int64_t current, std::int64_t peak, std::int64_t allocated, std::int64_t freed) {
  return Stat{current, peak, allocated, freed};
}

std::int64_t lookup(const std::vector<std::pair<std::string, std::int64_t>>& kv, const std::string& key) {
  for (const auto& [k, v] : kv)
    if (k == key) return v;
  FAIL("key " << key << " missing");
  return 0;
}

constexpr std::size_t MiB = kMiB;

// Compares every number of two views, key by key, so a failure names the number.
void check_same(const DeviceStatsView& got, const DeviceStatsView& want) {
  auto g = to_memory_stats(got), w = to_memory_stats(want);
  auto g2 = to_gpumem_stats(got), w2 = to_gpumem_stats(want);
  g.insert(g.end(), g2.begin(), g2.end());
  w.insert(w.end(), w2.begin(), w2.end());
  REQUIRE(g.size() == w.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO(w[i].first);
    CHECK(g[i].first == w[i].first);
    CHECK(g[i].second == w[i].second);
  }
  CHECK(got == want);  // also catches a field missing from the flat lists
}

}  // namespace

TEST_CASE("stats: Stat follows c10::Stat", "[stats]") {
  Stat s;
  s.increase(10);
  s.increase(5);
  s.decrease(12);
  CHECK(s == stat(3, 15, 15, 12));
  s.reset_peak();
  CHECK(s == stat(3, 3, 15, 12));
  s.increase(1);
  CHECK(s.peak == 4);
  s.reset_accumulated();
  CHECK(s == stat(4, 4, 0, 0));
}

TEST_CASE("stats: an expandable-mode sequence, every number", "[stats]") {
  StatsObserver obs(StatsObserverOptions{100 * MiB, true});
  const std::uintptr_t L = 0x7f0000000000, S = 0x7e0000000000;

  feed(obs, {ev(EventKind::segment_map, PoolKind::large, L, 40 * MiB, 0, 2)});
  feed(obs, {ev(EventKind::alloc, PoolKind::large, L, 4 * MiB, 4000000)});
  feed(obs, {ev(EventKind::segment_map, PoolKind::small, S, 2 * MiB, 0, 1)});
  feed(obs, {ev(EventKind::alloc, PoolKind::small, S, 512, 100)});
  feed(obs, {ev(EventKind::alloc, PoolKind::small, S + 512, 1024, 1000)});
  // The large block is freed but waits for another stream: allocation drops, active stays.
  feed(obs, {ev(EventKind::free_requested, PoolKind::large, L, 4 * MiB, 4000000)});

  DeviceStatsView mid = obs.stats();
  CHECK(mid.allocation[kAll] == stat(2, 3, 3, 1));
  CHECK(mid.allocation[kLarge] == stat(0, 1, 1, 1));
  CHECK(mid.allocation[kSmall] == stat(2, 2, 2, 0));
  CHECK(mid.active[kAll] == stat(3, 3, 3, 0));
  CHECK(mid.active_bytes[kLarge] == stat(4 * MiB, 4 * MiB, 4 * MiB, 0));
  CHECK(mid.requested_bytes[kAll] == stat(4001100, 4001100, 4001100, 0));

  feed(obs, {ev(EventKind::free_completed, PoolKind::large, L, 4 * MiB, 4000000)});
  feed(obs, {ev(EventKind::free_requested, PoolKind::small, S, 512, 100),
             ev(EventKind::free_completed, PoolKind::small, S, 512, 100)});
  feed(obs, {ev(EventKind::segment_unmap, PoolKind::large, L + 20 * MiB, 20 * MiB, 0, 1)});
  feed(obs, {ev(EventKind::oom, PoolKind::large, 0, 200 * MiB, 200000000)});
  feed(obs, {ev(EventKind::empty_cache, PoolKind::large, 0, 20 * MiB)});
  feed(obs, {ev(EventKind::segment_unmap, PoolKind::large, L, 20 * MiB, 0, 0)});
  feed(obs, {ev(EventKind::snapshot, PoolKind::large, 0, 1024)});
  obs.add_alloc_retries(2);
  obs.add_sync_all_streams(1);

  DeviceStatsView want;
  want.allocation[kAll] = stat(1, 3, 3, 2);
  want.allocation[kSmall] = stat(1, 2, 2, 1);
  want.allocation[kLarge] = stat(0, 1, 1, 1);
  want.active = want.allocation;
  want.allocated_bytes[kAll] = stat(1024, 4 * MiB + 1536, 4 * MiB + 1536, 4 * MiB + 512);
  want.allocated_bytes[kSmall] = stat(1024, 1536, 1536, 512);
  want.allocated_bytes[kLarge] = stat(0, 4 * MiB, 4 * MiB, 4 * MiB);
  want.active_bytes = want.allocated_bytes;
  want.requested_bytes[kAll] = stat(1000, 4001100, 4001100, 4000100);
  want.requested_bytes[kSmall] = stat(1000, 1100, 1100, 100);
  want.requested_bytes[kLarge] = stat(0, 4000000, 4000000, 4000000);
  want.reserved_bytes[kAll] = stat(2 * MiB, 42 * MiB, 42 * MiB, 40 * MiB);
  want.reserved_bytes[kSmall] = stat(2 * MiB, 2 * MiB, 2 * MiB, 0);
  want.reserved_bytes[kLarge] = stat(0, 40 * MiB, 40 * MiB, 40 * MiB);
  // segment, inactive_split(_bytes), oversize_*: untouched in expandable mode.
  want.num_alloc_retries = 2;
  want.num_ooms = 1;
  want.num_sync_all_streams = 2;  // the empty_cache event + the one added
  want.num_device_alloc = 2;
  want.num_device_free = 2;
  want.max_split_size = 100 * MiB;
  want.num_segment_maps = 2;
  want.num_segment_unmaps = 2;
  want.num_pieces_created = 3;
  want.num_pieces_destroyed = 1;
  want.num_empty_cache = 1;
  want.num_events = 14;
  want.num_inconsistent_events = 0;
  check_same(obs.stats(), want);

  SECTION("reset_peak") {
    obs.reset_peak();
    DeviceStatsView v = obs.stats();
    CHECK(v.allocation[kAll] == stat(1, 1, 3, 2));
    CHECK(v.reserved_bytes[kAll] == stat(2 * MiB, 2 * MiB, 42 * MiB, 40 * MiB));
    CHECK(v.requested_bytes[kLarge] == stat(0, 0, 4000000, 4000000));
    CHECK(v.num_ooms == 1);  // counters are not peaks
  }
  SECTION("reset_accumulated") {
    obs.reset_accumulated();
    DeviceStatsView v = obs.stats();
    CHECK(v.allocation[kAll] == stat(1, 3, 0, 0));
    CHECK(v.reserved_bytes[kLarge] == stat(0, 40 * MiB, 0, 0));
    CHECK(v.num_alloc_retries == 0);
    CHECK(v.num_ooms == 0);
    CHECK(v.num_sync_all_streams == 0);
    CHECK(v.num_device_alloc == 0);
    CHECK(v.num_device_free == 0);
    CHECK(v.num_segment_maps == 0);
    CHECK(v.num_pieces_created == 0);
    CHECK(v.num_events == 14);
    CHECK(v.max_split_size == 100 * MiB);
  }
}

TEST_CASE("stats: classic segments, inactive_split as PyTorch counts it", "[stats]") {
  // Numbers checked against PyTorch's alloc_found_block / free_block bookkeeping, step by step.
  StatsObserver obs;  // max_split_size unlimited
  const std::uintptr_t B = 0x10000000;
  auto split = [&] { return std::pair{obs.stats().inactive_split, obs.stats().inactive_split_bytes}; };

  feed(obs, {ev(EventKind::segment_alloc, PoolKind::large, B, 20 * MiB)});
  CHECK(split().first[kAll] == stat(0, 0, 0, 0));  // one unsplit free block

  // a = [0, 2): the rest becomes one split free block (PyTorch: increase(1), increase(18 MiB)).
  feed(obs, {ev(EventKind::alloc, PoolKind::large, B, 2 * MiB, 2 * MiB)});
  CHECK(split().first[kLarge] == stat(1, 1, 1, 0));
  CHECK(split().second[kLarge] == stat(18 * MiB, 18 * MiB, 18 * MiB, 0));
  // b = [2, 4), c = [4, 6): the split block shrinks (decrease(2 MiB) each).
  feed(obs, {ev(EventKind::alloc, PoolKind::large, B + 2 * MiB, 2 * MiB, 2 * MiB)});
  feed(obs, {ev(EventKind::alloc, PoolKind::large, B + 4 * MiB, 2 * MiB, 2 * MiB)});
  CHECK(split().first[kLarge] == stat(1, 1, 1, 0));
  CHECK(split().second[kLarge] == stat(14 * MiB, 18 * MiB, 18 * MiB, 4 * MiB));
  // free a: no free neighbour, the block is split: +1 block, +2 MiB.
  feed(obs, {ev(EventKind::free_requested, PoolKind::large, B, 2 * MiB, 2 * MiB),
             ev(EventKind::free_completed, PoolKind::large, B, 2 * MiB, 2 * MiB)});
  CHECK(split().first[kLarge] == stat(2, 2, 2, 0));
  CHECK(split().second[kLarge] == stat(16 * MiB, 18 * MiB, 20 * MiB, 4 * MiB));
  // free b: merges with a (-1 block, -2 MiB) and is split (+1, +4 MiB): net 0 blocks, +2 MiB.
  feed(obs, {ev(EventKind::free_requested, PoolKind::large, B + 2 * MiB, 2 * MiB, 2 * MiB),
             ev(EventKind::free_completed, PoolKind::large, B + 2 * MiB, 2 * MiB, 2 * MiB)});
  CHECK(split().first[kLarge] == stat(2, 2, 2, 0));
  CHECK(split().second[kLarge] == stat(18 * MiB, 18 * MiB, 22 * MiB, 4 * MiB));
  // free c: merges both sides into the whole segment, no longer split: -2 blocks, -18 MiB.
  feed(obs, {ev(EventKind::free_requested, PoolKind::large, B + 4 * MiB, 2 * MiB, 2 * MiB),
             ev(EventKind::free_completed, PoolKind::large, B + 4 * MiB, 2 * MiB, 2 * MiB)});
  CHECK(split().first[kLarge] == stat(0, 2, 2, 2));
  CHECK(split().second[kLarge] == stat(0, 18 * MiB, 22 * MiB, 22 * MiB));
  CHECK(split().first[kSmall] == stat(0, 0, 0, 0));
  CHECK(split().first[kAll] == split().first[kLarge]);

  // A block that takes the whole segment never splits it.
  feed(obs, {ev(EventKind::alloc, PoolKind::large, B, 20 * MiB, 19 * MiB)});
  CHECK(split().first[kLarge].current == 0);
  feed(obs, {ev(EventKind::free_requested, PoolKind::large, B, 20 * MiB, 19 * MiB),
             ev(EventKind::free_completed, PoolKind::large, B, 20 * MiB, 19 * MiB)});

  // A small segment, and a block in the middle of a free run (both sides stay free).
  const std::uintptr_t SB = 0x20000000;
  feed(obs, {ev(EventKind::segment_alloc, PoolKind::small, SB, 2 * MiB)});
  feed(obs, {ev(EventKind::alloc, PoolKind::small, SB + 4096, 512, 500)});
  CHECK(split().first[kSmall] == stat(2, 2, 2, 0));
  CHECK(split().second[kSmall] == stat(2 * MiB - 512, 2 * MiB - 512, 2 * MiB - 512, 0));
  CHECK(split().first[kAll].current == 2);
  feed(obs, {ev(EventKind::free_requested, PoolKind::small, SB + 4096, 512, 500),
             ev(EventKind::free_completed, PoolKind::small, SB + 4096, 512, 500)});
  feed(obs, {ev(EventKind::segment_free, PoolKind::small, SB, 2 * MiB)});
  feed(obs, {ev(EventKind::segment_free, PoolKind::large, B, 20 * MiB)});

  DeviceStatsView v = obs.stats();
  CHECK(v.segment[kAll] == stat(0, 2, 2, 2));
  CHECK(v.segment[kLarge] == stat(0, 1, 1, 1));
  CHECK(v.segment[kSmall] == stat(0, 1, 1, 1));
  CHECK(v.reserved_bytes[kAll] == stat(0, 22 * MiB, 22 * MiB, 22 * MiB));
  CHECK(v.inactive_split[kAll].current == 0);
  CHECK(v.inactive_split_bytes[kAll].current == 0);
  CHECK(v.allocation[kAll] == stat(0, 3, 5, 5));
  CHECK(v.requested_bytes[kAll] == stat(0, 19 * MiB, 25 * MiB + 500, 25 * MiB + 500));
  CHECK(v.num_device_alloc == 2);
  CHECK(v.num_device_free == 2);
  CHECK(v.num_inconsistent_events == 0);
  CHECK(v.max_split_size == -1);
}

TEST_CASE("stats: oversize allocations and segments", "[stats]") {
  Config config = std::get<Config>(parse_config("max_split_size_mb:100"));
  StatsObserver obs(config);
  feed(obs, {ev(EventKind::segment_alloc, PoolKind::large, 0x1000000, 200 * MiB),
             ev(EventKind::alloc, PoolKind::large, 0x1000000, 200 * MiB, 150 * MiB)});
  feed(obs, {ev(EventKind::segment_alloc, PoolKind::large, 0x40000000, 20 * MiB),
             ev(EventKind::alloc, PoolKind::large, 0x40000000, 99 * MiB / 10, 9 * MiB)});
  DeviceStatsView v = obs.stats();
  CHECK(v.oversize_allocations == stat(1, 1, 1, 0));
  CHECK(v.oversize_segments == stat(1, 1, 1, 0));
  CHECK(v.max_split_size == 100 * MiB);
  feed(obs, {ev(EventKind::free_requested, PoolKind::large, 0x1000000, 200 * MiB, 150 * MiB),
             ev(EventKind::free_completed, PoolKind::large, 0x1000000, 200 * MiB, 150 * MiB),
             ev(EventKind::segment_free, PoolKind::large, 0x1000000, 200 * MiB)});
  v = obs.stats();
  CHECK(v.oversize_allocations == stat(0, 1, 1, 1));
  CHECK(v.oversize_segments == stat(0, 1, 1, 1));
  obs.reset_peak();
  obs.reset_accumulated();
  CHECK(obs.stats().oversize_allocations == stat(0, 0, 0, 0));
}

TEST_CASE("stats: events that contradict the layout are counted, not fatal", "[stats]") {
  StatsObserver obs;
  const std::uintptr_t B = 0x10000000;
  feed(obs, {ev(EventKind::segment_alloc, PoolKind::large, B, 20 * MiB)});
  feed(obs, {ev(EventKind::alloc, PoolKind::large, B, 4 * MiB, 4 * MiB)});
  feed(obs, {ev(EventKind::alloc, PoolKind::large, B + 2 * MiB, 4 * MiB, 4 * MiB)});  // overlaps
  CHECK(obs.stats().num_inconsistent_events == 1);
  feed(obs, {ev(EventKind::free_completed, PoolKind::large, B + 8 * MiB, 2 * MiB, 0)});  // unknown
  CHECK(obs.stats().num_inconsistent_events == 2);
  feed(obs, {ev(EventKind::segment_alloc, PoolKind::large, B + 10 * MiB, 20 * MiB)});  // overlaps
  CHECK(obs.stats().num_inconsistent_events == 3);
  // Freed with an active block left: inconsistent, and its contribution is taken back.
  feed(obs, {ev(EventKind::segment_free, PoolKind::large, B, 20 * MiB)});
  CHECK(obs.stats().num_inconsistent_events == 4);
  CHECK(obs.stats().inactive_split[kAll].current == 0);
  CHECK(obs.stats().inactive_split_bytes[kAll].current == 0);
  feed(obs, {ev(EventKind::segment_free, PoolKind::large, 0x90000000, 20 * MiB)});  // never seen
  CHECK(obs.stats().num_inconsistent_events == 5);
}

TEST_CASE("stats: inactive_split tracking can be turned off", "[stats]") {
  StatsObserver obs(StatsObserverOptions{kNoLimit, false});
  feed(obs, {ev(EventKind::segment_alloc, PoolKind::large, 0x10000000, 20 * MiB),
             ev(EventKind::alloc, PoolKind::large, 0x10000000, 2 * MiB, 2 * MiB)});
  DeviceStatsView v = obs.stats();
  CHECK(v.inactive_split[kAll] == stat(0, 0, 0, 0));
  CHECK(v.inactive_split_bytes[kAll] == stat(0, 0, 0, 0));
  CHECK(v.allocation[kAll].current == 1);
}

TEST_CASE("stats: PyTorch's flat memory_stats keys", "[stats]") {
  StatsObserver obs(StatsObserverOptions{64 * MiB, true});
  feed(obs, {ev(EventKind::segment_map, PoolKind::small, 0x1000, 2 * MiB, 0, 1),
             ev(EventKind::alloc, PoolKind::small, 0x1000, 1536, 1500)});
  auto kv = to_memory_stats(obs.stats());
  CHECK(kv.size() == 122);
  CHECK(std::is_sorted(kv.begin(), kv.end()));
  std::set<std::string> keys;
  for (const auto& [k, v] : kv) keys.insert(k);
  CHECK(keys.size() == kv.size());
  for (const char* a : {"allocation", "segment", "active", "inactive_split", "allocated_bytes",
                        "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"})
    for (const char* t : {"all", "small_pool", "large_pool"})
      for (const char* f : {"current", "peak", "allocated", "freed"})
        CHECK(keys.count(std::string(a) + "." + t + "." + f) == 1);
  for (const char* a : {"oversize_allocations", "oversize_segments"})
    for (const char* f : {"current", "peak", "allocated", "freed"}) CHECK(keys.count(std::string(a) + "." + f) == 1);
  for (const char* k : {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                        "num_device_free", "max_split_size"})
    CHECK(keys.count(k) == 1);
  CHECK(keys.count("allocated.all.current") == 0);  // the docstring's name is not the real key

  CHECK(lookup(kv, "allocated_bytes.all.current") == 1536);
  CHECK(lookup(kv, "allocated_bytes.small_pool.peak") == 1536);
  CHECK(lookup(kv, "allocated_bytes.large_pool.current") == 0);
  CHECK(lookup(kv, "requested_bytes.all.allocated") == 1500);
  CHECK(lookup(kv, "reserved_bytes.all.current") == static_cast<std::int64_t>(2 * MiB));
  CHECK(lookup(kv, "num_device_alloc") == 1);
  CHECK(lookup(kv, "max_split_size") == static_cast<std::int64_t>(64 * MiB));
  CHECK(lookup(to_memory_stats(StatsObserver().stats()), "max_split_size") == -1);

  auto extra = to_gpumem_stats(obs.stats());
  CHECK(lookup(extra, "gpumem.num_segment_maps") == 1);
  CHECK(lookup(extra, "gpumem.num_pieces_created") == 1);
  CHECK(lookup(extra, "gpumem.num_events") == 2);
}

TEST_CASE("stats: concurrent publishers", "[stats][threads]") {
  StatsObserver obs;
  constexpr int kThreads = 4, kRounds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&obs, t] {
      const PoolKind pool = t % 2 ? PoolKind::small : PoolKind::large;
      const std::uintptr_t base = 0x100000000ull * (t + 1);
      for (int i = 0; i < kRounds; ++i) {
        std::size_t size = 512 * static_cast<std::size_t>(1 + i % 8);
        AllocEvent a = ev(EventKind::alloc, pool, base, size, size - 7);
        obs.on_events(std::span(&a, 1));
        AllocEvent f[2] = {ev(EventKind::free_requested, pool, base, size, size - 7),
                           ev(EventKind::free_completed, pool, base, size, size - 7)};
        obs.on_events(f);
      }
    });
  }
  for (auto& th : threads) th.join();
  DeviceStatsView v = obs.stats();
  std::int64_t bytes_per_thread = 0;
  for (int i = 0; i < kRounds; ++i) bytes_per_thread += 512 * (1 + i % 8);
  CHECK(v.num_events == kThreads * kRounds * 3);
  CHECK(v.allocation[kAll].current == 0);
  CHECK(v.allocation[kAll].allocated == kThreads * kRounds);
  CHECK(v.allocation[kAll].peak >= 1);
  CHECK(v.allocation[kAll].peak <= kThreads);
  CHECK(v.allocation[kSmall].allocated == 2 * kRounds);
  CHECK(v.allocated_bytes[kAll] .allocated == kThreads * bytes_per_thread);
  CHECK(v.allocated_bytes[kAll].freed == kThreads * bytes_per_thread);
  CHECK(v.requested_bytes[kAll].current == 0);
  CHECK(v.requested_bytes[kAll].allocated == kThreads * (bytes_per_thread - 7 * kRounds));
  CHECK(v.active_bytes[kLarge].current == 0);
}

TEST_CASE("stats: per-thread shards of threads that come and go keep totals exact", "[stats][threads]") {
  // Note [Stats shards]: once publishers meet, each thread's alloc/free batches go to its shard;
  // shards of exited threads serve new threads. Totals are exact; a peak is at least every value
  // one thread's own sequence reached.
  StatsObserver obs;
  constexpr int kWaves = 6, kThreads = 4, kRounds = 3000;
  constexpr std::size_t kHeld = 64 * MiB;
  std::int64_t bytes_per_thread = 0;
  for (int i = 0; i < kRounds; ++i) bytes_per_thread += 512 * (1 + i % 8);
  for (int wave = 0; wave < kWaves; ++wave) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&obs, t, wave] {
        const std::uintptr_t base = 0x100000000ull * static_cast<std::uintptr_t>(1 + t + kThreads * wave);
        // One large block held across the thread's pairs.
        AllocEvent held = ev(EventKind::alloc, PoolKind::large, base, kHeld, kHeld);
        obs.on_events(std::span(&held, 1));
        for (int i = 0; i < kRounds; ++i) {
          const std::size_t size = 512 * static_cast<std::size_t>(1 + i % 8);
          AllocEvent a = ev(EventKind::alloc, PoolKind::small, base + kHeld, size, size);
          obs.on_events(std::span(&a, 1));
          AllocEvent f[2] = {ev(EventKind::free_requested, PoolKind::small, base + kHeld, size, size),
                             ev(EventKind::free_completed, PoolKind::small, base + kHeld, size, size)};
          obs.on_events(f);
          if (i % 500 == 0) (void)obs.stats();  // readers fold shards while they are written
        }
        AllocEvent f[2] = {ev(EventKind::free_requested, PoolKind::large, base, kHeld, kHeld),
                           ev(EventKind::free_completed, PoolKind::large, base, kHeld, kHeld)};
        obs.on_events(f);
      });
    for (auto& th : threads) th.join();
  }
  const DeviceStatsView v = obs.stats();
  const std::int64_t n = kWaves * kThreads;
  CHECK(v.num_events == n * (3 * kRounds + 3));
  CHECK(v.num_inconsistent_events == 0);
  CHECK(v.allocation[kAll].current == 0);
  CHECK(v.allocation[kAll].allocated == n * (kRounds + 1));
  CHECK(v.allocation[kAll].freed == n * (kRounds + 1));
  CHECK(v.allocated_bytes[kAll].current == 0);
  CHECK(v.allocated_bytes[kSmall].allocated == n * bytes_per_thread);
  CHECK(v.allocated_bytes[kLarge].allocated == n * static_cast<std::int64_t>(kHeld));
  CHECK(v.active_bytes[kAll].current == 0);
  CHECK(v.requested_bytes[kAll].current == 0);
  CHECK(v.allocated_bytes[kAll].peak >= static_cast<std::int64_t>(kHeld) + 512);
  CHECK(v.allocated_bytes[kAll].peak <= kThreads * static_cast<std::int64_t>(kHeld + 4096));
  CHECK(v.allocation[kLarge].peak >= 1);
  // reset_peak folds first: the peak is then the (zero) current value.
  obs.reset_peak();
  CHECK(obs.stats().allocated_bytes[kAll].peak == 0);
}

TEST_CASE("stats: a shard folded with only some pools, kinds or oversize touched keeps every number exact",
          "[stats][threads][fold]") {
  // A fold skips the columns (all, small, large) and the oversize stat a shard's events did not
  // touch since its last fold. One thread's sequence through its shard, read (folded) after
  // batches that touch one pool, one event kind, or the oversize stat alone, must give the numbers
  // an observer applying every event under its lock gives.
  const StatsObserverOptions options{8 * MiB, false};
  StatsObserver sharded(options), locked(options);
  // Publishers meet: two threads publish balanced pairs until one finds the lock taken.
  {
    std::atomic<bool> met{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        const std::uintptr_t base = 0x100000000ull * static_cast<std::uintptr_t>(t + 1);
        while (!sharded.publishers_met()) {
          AllocEvent a = ev(EventKind::alloc, PoolKind::small, base, 512, 512);
          sharded.on_events(std::span(&a, 1));
          AllocEvent f[2] = {ev(EventKind::free_requested, PoolKind::small, base, 512, 512),
                             ev(EventKind::free_completed, PoolKind::small, base, 512, 512)};
          sharded.on_events(f);
        }
        met = true;
      });
    for (auto& th : threads) th.join();
    REQUIRE(met);
  }
  sharded.reset_peak();
  sharded.reset_accumulated();
  const std::int64_t events_before = sharded.stats().num_events;
  REQUIRE(sharded.stats().allocation[kAll] == stat(0, 0, 0, 0));

  int reads = 0;
  auto publish = [&](std::initializer_list<AllocEvent> batch) {
    std::vector<AllocEvent> v(batch);
    sharded.on_events(v);  // into this thread's shard
    locked.on_events(v);   // never contended: applied under the lock
  };
  auto check_equal = [&] {
    ++reads;
    const DeviceStatsView g = sharded.stats(), w = locked.stats();
    CHECK(g.allocation == w.allocation);
    CHECK(g.allocated_bytes == w.allocated_bytes);
    CHECK(g.active == w.active);
    CHECK(g.active_bytes == w.active_bytes);
    CHECK(g.requested_bytes == w.requested_bytes);
    CHECK(g.oversize_allocations == w.oversize_allocations);
    CHECK(g.num_events - events_before == w.num_events);
  };
  const std::uintptr_t base = 0x900000000ull;
  // Small allocations only; large ones, one oversize; each kind of free alone, per pool.
  for (std::size_t i = 0; i < 5; ++i) publish({ev(EventKind::alloc, PoolKind::small, base + i * MiB, 512 * (i + 1), 500)});
  check_equal();
  publish({ev(EventKind::alloc, PoolKind::large, base + 16 * MiB, 2 * MiB, 2 * MiB)});
  publish({ev(EventKind::alloc, PoolKind::large, base + 32 * MiB, 16 * MiB, 15 * MiB)});  // oversize
  check_equal();
  publish({ev(EventKind::free_requested, PoolKind::small, base, 512, 500)});
  check_equal();
  publish({ev(EventKind::free_completed, PoolKind::small, base, 512, 500)});
  check_equal();
  publish({ev(EventKind::free_requested, PoolKind::large, base + 32 * MiB, 16 * MiB, 15 * MiB)});
  check_equal();
  publish({ev(EventKind::free_completed, PoolKind::large, base + 32 * MiB, 16 * MiB, 15 * MiB)});
  check_equal();
  // Then a random mix, read at random moments (some folds after one batch, some after many).
  std::mt19937_64 rng(11);
  struct Live {
    PoolKind pool;
    std::uintptr_t addr;
    std::size_t size;
    bool requested_free;
  };
  std::vector<Live> live;
  std::uintptr_t next = base + 64 * MiB;
  for (int step = 0; step < 4000; ++step) {
    const unsigned pick = static_cast<unsigned>(rng() % 3);
    if (pick == 0 || live.empty()) {
      const bool large = rng() % 2 == 0;
      const std::size_t size = large ? (1 + rng() % 12) * MiB : 512 * (1 + rng() % 16);
      const PoolKind pool = large ? PoolKind::large : PoolKind::small;
      publish({ev(EventKind::alloc, pool, next, size, size - 3)});
      live.push_back({pool, next, size, false});
      next += 16 * MiB;
    } else {
      const std::size_t k = rng() % live.size();
      Live& l = live[k];
      if (!l.requested_free) {
        publish({ev(EventKind::free_requested, l.pool, l.addr, l.size, l.size - 3)});
        l.requested_free = true;
      } else {
        publish({ev(EventKind::free_completed, l.pool, l.addr, l.size, l.size - 3)});
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    if (rng() % 7 == 0) check_equal();
  }
  check_equal();
  CHECK(reads > 500);
}

TEST_CASE("stats: threads publishing to several observers in turn, observers destroyed and remade, stay exact",
          "[stats][threads]") {
  // A thread finds its shard through a one-entry thread-local cache (observer id -> shard) before
  // its slots. Here every batch goes to another observer than the last, and each generation's
  // observers are destroyed while the threads (and their slots) live on, so slots are reused
  // (12 observers, 8 slots): no batch may land in another observer's shard.
  constexpr int kThreads = 4, kGenerations = 6, kRounds = 3000;
  constexpr std::size_t kSmallBytes = 512, kLargeBytes = 4 * MiB;
  std::vector<std::array<std::unique_ptr<StatsObserver>, 2>> gens(kGenerations);
  for (auto& g : gens) g = {std::make_unique<StatsObserver>(), std::make_unique<StatsObserver>()};
  std::barrier sync(kThreads + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const std::uintptr_t base = 0x100000000ull * static_cast<std::uintptr_t>(1 + t);
      for (int g = 0; g < kGenerations; ++g) {
        sync.arrive_and_wait();  // this generation's observers exist
        for (int i = 0; i < kRounds; ++i) {
          StatsObserver& obs = *gens[static_cast<std::size_t>(g)][static_cast<std::size_t>(i % 2)];
          const PoolKind pool = i % 2 ? PoolKind::large : PoolKind::small;
          const std::size_t size = i % 2 ? kLargeBytes : kSmallBytes;
          AllocEvent a = ev(EventKind::alloc, pool, base, size, size - 1);
          obs.on_events(std::span(&a, 1));
          AllocEvent f[2] = {ev(EventKind::free_requested, pool, base, size, size - 1),
                             ev(EventKind::free_completed, pool, base, size, size - 1)};
          obs.on_events(f);
        }
        sync.arrive_and_wait();  // done with them: the main thread checks and destroys them
        sync.arrive_and_wait();
      }
    });
  for (int g = 0; g < kGenerations; ++g) {
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    auto& pair = gens[static_cast<std::size_t>(g)];
    const DeviceStatsView small = pair[0]->stats(), large = pair[1]->stats();
    const std::int64_t n = kThreads * kRounds / 2;
    INFO("generation " << g);
    CHECK(small.num_events == 3 * n);
    CHECK(small.allocation[kSmall].allocated == n);
    CHECK(small.allocation[kLarge].allocated == 0);
    CHECK(small.allocated_bytes[kAll].allocated == n * static_cast<std::int64_t>(kSmallBytes));
    CHECK(small.requested_bytes[kAll].freed == n * static_cast<std::int64_t>(kSmallBytes - 1));
    CHECK(small.active[kAll].current == 0);
    CHECK(small.allocation[kAll].peak >= 1);
    CHECK(small.allocation[kAll].peak <= kThreads);
    CHECK(large.num_events == 3 * n);
    CHECK(large.allocation[kLarge].allocated == n);
    CHECK(large.allocation[kSmall].allocated == 0);
    CHECK(large.allocated_bytes[kAll].freed == n * static_cast<std::int64_t>(kLargeBytes));
    CHECK(large.active_bytes[kAll].current == 0);
    CHECK(large.allocated_bytes[kLarge].peak >= static_cast<std::int64_t>(kLargeBytes));
    CHECK(large.allocated_bytes[kLarge].peak <= kThreads * static_cast<std::int64_t>(kLargeBytes));
    pair[0].reset();
    pair[1].reset();
    sync.arrive_and_wait();
  }
  for (auto& th : threads) th.join();
}

// ---- the real PyTorch 2.11 traces ($GPUMEM_SHARED_DIR/traces; format: docs/forensics.md) ----

namespace {

std::string traces_dir() {
  // The shared traces, else the copy of resnet50.native kept in the repository.
  for (const char* var : {"GPUMEM_SHARED_DIR"}) {
    if (const char* d = std::getenv(var)) {
      std::string dir = std::string(d) + "/traces";
      if (std::ifstream(dir + "/README.md").good()) return dir;
    }
  }
  std::string root = __FILE__;
  root = root.substr(0, root.rfind("/tests/"));
  for (std::string dir : {root + "/../shared/traces", root + "/../../shared/traces"})
    if (std::ifstream(dir + "/README.md").good()) return dir;
  return "";
}

std::string repo_traces_dir() {
  if (const char* d = std::getenv("GPUMEM_SOURCE_DIR")) return std::string(d) + "/traces";
  std::string root = __FILE__;
  return root.substr(0, root.rfind("/tests/")) + "/traces";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Feeds a trace CSV to the observer. Sizes of alloc/free lines are the requests (the trace
// does not have the rounded block sizes), so only segment-level numbers are compared exactly.
bool replay_csv(const std::string& path, StatsObserver& obs) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return false;
  char line[4096];
  bool header = true;
  std::vector<AllocEvent> batch(1);
  while (gzgets(f, line, sizeof line)) {
    if (header) {
      header = false;
      continue;
    }
    std::string s(line);
    std::size_t c1 = s.find(','), c2 = s.find(',', c1 + 1), c3 = s.find(',', c2 + 1);
    std::string action = s.substr(0, c1);
    std::uintptr_t addr = std::stoull(s.substr(c1 + 1, c2 - c1 - 1));
    std::size_t size = std::stoull(s.substr(c2 + 1, c3 - c2 - 1));
    AllocEvent e;
    e.addr = addr;
    e.size_bytes = size;
    e.requested_bytes = size;
    bool segment = action.rfind("segment_", 0) == 0;
    // Pools: small segments and pieces are 2 MiB; small requests are <= 1 MiB.
    e.pool = (segment ? size == 2 * MiB : size <= MiB) ? PoolKind::small : PoolKind::large;
    if (action == "alloc") e.kind = EventKind::alloc;
    else if (action == "free_requested") e.kind = EventKind::free_requested;
    else if (action == "free_completed") e.kind = EventKind::free_completed;
    else if (action == "segment_alloc") e.kind = EventKind::segment_alloc;
    else if (action == "segment_free") e.kind = EventKind::segment_free;
    else if (action == "segment_map") e.kind = EventKind::segment_map;
    else if (action == "segment_unmap") e.kind = EventKind::segment_unmap;
    else if (action == "oom") e.kind = EventKind::oom;
    else if (action == "snapshot") e.kind = EventKind::snapshot;
    else FAIL("unknown action " << action);
    batch[0] = e;
    obs.on_events(batch);
  }
  gzclose(f);
  return true;
}

std::int64_t json_int(const std::string& json, const std::string& key) {
  std::smatch m;
  REQUIRE(std::regex_search(json, m, std::regex("\"" + key + "\": (-?[0-9]+)")));
  return std::stoll(m[1]);
}

// Sums total_size over segments_end, for segments whose segment_type is type ("" = all).
std::int64_t segments_end_bytes(const std::string& json, const std::string& type, int* count) {
  std::regex seg("\"total_size\": ([0-9]+),[^}]*\"segment_type\": \"([a-z]+)\"");
  std::int64_t sum = 0;
  *count = 0;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), seg); it != std::sregex_iterator(); ++it) {
    if (!type.empty() && (*it)[2] != type) continue;
    sum += std::stoll((*it)[1]);
    ++*count;
  }
  return sum;
}

void check_trace(const std::string& trace, const std::string& json_path, bool expandable) {
  INFO(trace);
  StatsObserver obs;
  REQUIRE(replay_csv(trace, obs));
  std::string json = read_text(json_path);
  DeviceStatsView v = obs.stats();
  // PyTorch's own end-of-run numbers.
  CHECK(v.reserved_bytes[kAll].peak == json_int(json, "peak_reserved"));
  CHECK(v.num_ooms == json_int(json, "num_ooms"));
  // The segments that existed at the end.
  int n_all = 0, n_small = 0, n_large = 0;
  CHECK(v.reserved_bytes[kAll].current == segments_end_bytes(json, "", &n_all));
  CHECK(v.reserved_bytes[kSmall].current == segments_end_bytes(json, "small", &n_small));
  CHECK(v.reserved_bytes[kLarge].current == segments_end_bytes(json, "large", &n_large));
  if (!expandable) {
    CHECK(v.segment[kAll].current == n_all);
    CHECK(v.segment[kSmall].current == n_small);
    CHECK(v.segment[kLarge].current == n_large);
    CHECK(v.num_device_alloc - v.num_device_free == n_all);
  } else {
    CHECK(v.segment[kAll].allocated == 0);
  }
  CHECK(v.num_inconsistent_events == 0);
  CHECK(v.allocation[kAll].current == v.active[kAll].current);  // nothing waits at the end
}

}  // namespace

TEST_CASE("stats: PyTorch 2.11 traces reproduce PyTorch's reserved numbers", "[stats][traces]") {
  std::string repo = repo_traces_dir();
  check_trace(repo + "/resnet50.native.trace.csv.gz", repo + "/resnet50.native.json", false);
  std::string dir = traces_dir();
  if (dir.empty()) GPUMEM_SKIP("no real traces in $GPUMEM_SHARED_DIR/traces; checked only the repository's copy");
  for (const char* name : {"resnet50", "bert_varlen", "vit"}) {
    check_trace(dir + "/native/" + name + ".trace.csv.gz", dir + "/native/" + name + ".json", false);
    check_trace(dir + "/expandable/" + name + ".trace.csv.gz", dir + "/expandable/" + name + ".json", true);
  }
  check_trace(dir + "/native/oom.trace.csv.gz", dir + "/native/oom.json", false);
}

// ---- Note [Stats in place]: an engine bound to its StatsObserver counts its hot events itself.

namespace {

// Awake, so that an engine it is attached to builds and publishes every event (no counting in
// place); counts what it sees.
class EventCounter final : public AllocObserver {
 public:
  EventCounter() : AllocObserver(kNeedsNothing) {}
  void on_events(std::span<const AllocEvent> events) override { seen += static_cast<std::int64_t>(events.size()); }
  std::atomic<std::int64_t> seen{0};
};

// A fixed mix of requests on one engine: sizes from 512 B to 48 MiB, a window of live blocks,
// an empty_cache and a reset of the peaks halfway, and everything freed at the end but `keep`.
void drive(CachingAllocator& engine, StatsObserver& obs, std::size_t keep) {
  std::vector<void*> live;
  std::uint64_t x = 12345;
  for (int i = 0; i < 3000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const std::size_t size = std::size_t{512} << ((x >> 33) % 17);  // 512 B .. 32 MiB
    if (live.size() < 40 || (x >> 20) % 3 != 0) {
      AllocResult r = engine.allocate(size + (x >> 40) % 500, 0);
      REQUIRE(r.ok());
      live.push_back(r.ptr);
    } else {
      const std::size_t slot = (x >> 24) % live.size();
      REQUIRE(engine.free(live[slot]) == FreeStatus::ok);
      live[slot] = live.back();
      live.pop_back();
    }
    if (i == 1500) {
      engine.empty_cache();
      obs.reset_peak();
    }
  }
  while (live.size() > keep) {
    REQUIRE(engine.free(live.back()) == FreeStatus::ok);
    live.pop_back();
  }
}

}  // namespace

TEST_CASE("stats: counted in place, every number is what the events give", "[stats][in_place]") {
  // Engine a: its observer alone, bound, counting in place. Engine b: the same requests with an
  // awake observer beside its StatsObserver, so every event is built and published.
  SimSource source_a, source_b;
  auto events_a = make_immediate_events(), events_b = make_immediate_events();
  Config config;
  config.max_split_size_bytes = 8 * MiB;  // some allocations are oversize
  CachingAllocator a(source_a, *events_a, config), b(source_b, *events_b, config);
  auto obs_a = std::make_shared<StatsObserver>(config), obs_b = std::make_shared<StatsObserver>(config);
  auto counter = std::make_shared<EventCounter>();
  a.attach_observer(obs_a);
  b.attach_observer(obs_b);
  b.attach_observer(counter);
  drive(a, *obs_a, 7);
  drive(b, *obs_b, 7);
  const DeviceStatsView va = obs_a->stats(), vb = obs_b->stats();
  CHECK(counter->seen.load() == vb.num_events);
  CHECK(va.allocation[kAll].current == 7);
  CHECK(va.allocated_bytes[kAll].current == static_cast<std::int64_t>(a.totals().allocated_bytes));
  CHECK(va.reserved_bytes[kAll].current == static_cast<std::int64_t>(a.totals().reserved_bytes));
  CHECK(va.oversize_allocations.allocated > 0);
  check_same(va, vb);
  obs_a->reset_accumulated();
  obs_b->reset_accumulated();
  check_same(obs_a->stats(), obs_b->stats());
}

TEST_CASE("stats: a bound observer detached, reattached, and outliving its engine stays exact", "[stats][in_place]") {
  SimSource source;
  auto events = make_immediate_events();
  auto obs = std::make_shared<StatsObserver>();
  void* kept = nullptr;
  {
    CachingAllocator engine(source, *events, Config{});
    engine.attach_observer(obs);
    kept = engine.allocate(3 * MiB, 0).ptr;
    REQUIRE(engine.free(engine.allocate(4096, 0).ptr) == FreeStatus::ok);
    engine.detach_observer(obs.get());
    // Unseen by the observer now.
    REQUIRE(engine.free(engine.allocate(4096, 0).ptr) == FreeStatus::ok);
    DeviceStatsView v = obs->stats();
    CHECK(v.allocation[kAll] == stat(1, 2, 2, 1));
    CHECK(v.allocated_bytes[kAll] == stat(3 * MiB, 3 * MiB + 4096, 3 * MiB + 4096, 4096));
    CHECK(v.num_events == 4 + v.num_segment_maps + v.num_segment_unmaps);  // 2 allocs, 1 free
    // Attached again: bound again, counting in place from where it stopped.
    engine.attach_observer(obs);
    REQUIRE(engine.free(kept) == FreeStatus::ok);
    v = obs->stats();
    CHECK(v.allocation[kAll] == stat(0, 2, 2, 2));
    CHECK(v.active_bytes[kAll] == stat(0, 3 * MiB + 4096, 3 * MiB + 4096, 3 * MiB + 4096));
    kept = engine.allocate(5000, 0).ptr;
  }  // the engine goes; the observer keeps its numbers, under its own lock again
  const DeviceStatsView v = obs->stats();
  CHECK(v.allocation[kAll] == stat(1, 2, 3, 2));
  CHECK(v.requested_bytes[kAll].current == 5000);
  obs->reset_peak();
  CHECK(obs->stats().allocation[kAll] == stat(1, 1, 3, 2));
  // Events fed by hand now go to its own counters.
  feed(*obs, {ev(EventKind::free_requested, PoolKind::small, reinterpret_cast<std::uintptr_t>(kept), 5120, 5000)});
  CHECK(obs->stats().allocation[kAll] == stat(0, 1, 3, 3));
}

TEST_CASE("stats: the bound observer alone counts in place; an observer attached beside it sees every event",
          "[stats][in_place]") {
  // The engine answers an engine call from the bound observer when it is the only one attached
  // (sink_alone) and walks the list otherwise: each attach and detach must move it between the two.
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, Config{});
  auto obs = std::make_shared<StatsObserver>();
  auto counter = std::make_shared<EventCounter>();
  // One 4 KiB pair on memory the engine holds already: alloc, free_requested, free_completed.
  auto pair = [&engine] { REQUIRE(engine.free(engine.allocate(4096, 0).ptr) == FreeStatus::ok); };
  engine.attach_observer(obs);
  pair();
  CHECK(obs->stats().allocation[kAll] == stat(0, 1, 1, 1));
  engine.attach_observer(counter);  // beside the bound observer: every event is built and published
  pair();
  CHECK(counter->seen.load() == 3);
  CHECK(obs->stats().allocation[kAll] == stat(0, 1, 2, 2));
  engine.detach_observer(counter.get());  // alone again
  pair();
  CHECK(counter->seen.load() == 3);
  CHECK(obs->stats().allocation[kAll] == stat(0, 1, 3, 3));
  CHECK(obs->stats().active_bytes[kAll] == stat(0, 4096, 3 * 4096, 3 * 4096));
  engine.detach_observer(obs.get());  // no StatsObserver: the counter alone gets events
  engine.attach_observer(counter);
  pair();
  CHECK(counter->seen.load() == 6);
  auto second = std::make_shared<StatsObserver>();
  engine.attach_observer(second);  // bound, but not alone
  pair();
  CHECK(counter->seen.load() == 9);
  CHECK(second->stats().allocation[kAll] == stat(0, 1, 1, 1));
  engine.detach_observer(counter.get());  // the second one alone: counted in place
  pair();
  CHECK(counter->seen.load() == 9);
  const DeviceStatsView v = second->stats();
  CHECK(v.allocation[kAll] == stat(0, 1, 2, 2));
  CHECK(v.requested_bytes[kAll] == stat(0, 4096, 2 * 4096, 2 * 4096));
  CHECK(v.num_events == 6);
  CHECK(obs->stats().allocation[kAll] == stat(0, 1, 3, 3));  // detached: saw none of the last three
}

TEST_CASE("stats: threads on a bound engine and a second engine sharing its observer stay exact",
          "[stats][in_place][threads]") {
  // Engine a binds the observer; engine b (a private pool's, say) publishes to it as events.
  // Four threads allocate and free on both, so the engines' thread caches and the observer's shards
  // take part; every total is exact once they are done.
  SimSource source_a, source_b;
  auto events_a = make_immediate_events(), events_b = make_immediate_events();
  CachingAllocator a(source_a, *events_a, Config{}), b(source_b, *events_b, Config{});
  auto obs = std::make_shared<StatsObserver>();
  a.attach_observer(obs);
  b.attach_observer(obs);
  constexpr int kThreads = 4, kPairs = 20000;
  std::barrier start(kThreads);
  std::atomic<int> failures{0};  // Catch's assertions are for the main thread
  std::array<std::int64_t, kThreads> own_peak{};  // the most blocks each thread held at once
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      std::vector<std::pair<CachingAllocator*, void*>> held;
      for (int i = 0; i < kPairs; ++i) {
        CachingAllocator& e = (i + t) % 5 == 0 ? b : a;
        const std::size_t size = std::size_t{512} << ((i * 7 + t) % 13);
        AllocResult r = e.allocate(size, 0);
        if (!r.ok()) {
          ++failures;
          continue;
        }
        own_peak[t] = std::max(own_peak[t], static_cast<std::int64_t>(held.size()) + 1);
        if (i % 16 == 0) {
          held.emplace_back(&e, r.ptr);
        } else if (e.free(r.ptr) != FreeStatus::ok) {
          ++failures;
        }
        if (held.size() > 8) {
          if (held.front().first->free(held.front().second) != FreeStatus::ok) ++failures;
          held.erase(held.begin());
        }
        if (t == 0 && i % 4000 == 0) (void)obs->stats();  // reads fold while the others publish
      }
      for (auto [e, p] : held)
        if (e->free(p) != FreeStatus::ok) ++failures;
    });
  for (auto& th : threads) th.join();
  REQUIRE(failures.load() == 0);
  const DeviceStatsView v = obs->stats();
  const std::int64_t allocs = std::int64_t{kThreads} * kPairs;
  CHECK(v.allocation[kAll].current == 0);
  CHECK(v.allocation[kAll].allocated == allocs);
  CHECK(v.allocation[kAll].freed == allocs);
  CHECK(v.active[kAll] == Stat{0, v.active[kAll].peak, allocs, allocs});
  CHECK(v.allocated_bytes[kAll].current == 0);
  CHECK(v.active_bytes[kAll].current == 0);
  CHECK(v.requested_bytes[kAll].current == 0);
  CHECK(v.allocated_bytes[kAll].allocated == v.allocated_bytes[kAll].freed);
  // Each thread holds at most 9 blocks at once (8 kept and the one just allocated, which it keeps
  // or frees), and reaches 9 once it has kept 8. Note [Stats shards]: a peak is exact for each
  // thread's own sequence, and what the counters hold of each thread at any moment is a prefix of
  // its sequence (its shard is folded before its next event counted in place). So the peak is at
  // least the highest count one thread reached, and at most the sum of what each reached (a fold
  // puts a thread's high point on top of what the others held at the fold, not at that moment).
  // When the threads happen to run one after another (several copies of this case on 2 cores),
  // the true peak is one thread's 9, and the lower bound is met exactly.
  const std::int64_t highest_own = *std::max_element(own_peak.begin(), own_peak.end());
  std::int64_t sum_own = 0;
  for (std::int64_t p : own_peak) sum_own += p;
  CHECK(highest_own == 9);
  CHECK(v.allocation[kAll].peak >= highest_own);
  CHECK(v.allocation[kAll].peak <= sum_own);
  CHECK(v.reserved_bytes[kAll].current ==
        static_cast<std::int64_t>(a.totals().reserved_bytes + b.totals().reserved_bytes));
  CHECK(v.num_inconsistent_events == 0);
}

namespace {

// Immediate markers, except that once armed, the next record() (which the engine calls under its
// lock, when a block used on other streams is freed) waits until released: a test can hold an
// engine's lock for as long as it needs.
class BlockingEvents final : public StreamEvents {
 public:
  EventToken record(StreamId stream) override {
    std::unique_lock lock(m_);
    if (armed_) {
      armed_ = false;
      blocked_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    return inner_->record(stream);
  }
  bool query(EventToken token) override { return inner_->query(token); }
  void synchronize(EventToken token) override { inner_->synchronize(token); }
  void release(EventToken token) override { inner_->release(token); }
  void synchronize_stream(StreamId stream) override { inner_->synchronize_stream(stream); }

  void arm() {
    std::lock_guard lock(m_);
    armed_ = true;
  }
  void wait_blocked() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return blocked_; });
  }
  void release_blocked() {
    std::lock_guard lock(m_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<StreamEvents> inner_ = make_immediate_events();
  std::mutex m_;
  std::condition_variable cv_;
  bool armed_ = false, blocked_ = false, released_ = false;
};

}  // namespace

TEST_CASE("stats: once publishers have met, a thread's own peak stays exact between counting in place and its shard",
          "[stats][in_place][threads]") {
  // Engine a binds the observer and counts its locked paths' events in place; engine b publishes
  // to it, so once publishers have met, b's events wait in the calling thread's shard. A thread that
  // allocates on a and on b, then frees on a, must not have its free counted before its
  // allocation on b: the counters would never hold both, and the peak would miss what it held.
  SimSource source_a, source_b;
  BlockingEvents events_a;
  auto events_b = make_immediate_events();
  CachingAllocator a(source_a, events_a, Config{}), b(source_b, *events_b, Config{});
  auto obs = std::make_shared<StatsObserver>();
  a.attach_observer(obs);
  b.attach_observer(obs);

  // Publishers meet, without relying on timing: a thread holds engine a's lock (blocked in
  // record()); the first of two threads publishing b's events takes the observer's lock and waits
  // there for engine a's (a bound observer applies uncontended batches under both), so the second
  // finds the observer's lock taken.
  void* used = a.allocate(4096, 0).ptr;
  REQUIRE(used != nullptr);
  REQUIRE(a.record_stream(used, 7) == FreeStatus::ok);
  events_a.arm();
  FreeStatus held_free = FreeStatus::null_pointer;  // Catch's assertions are for the main thread
  std::thread holder([&] { held_free = a.free(used); });
  events_a.wait_blocked();
  REQUIRE_FALSE(obs->publishers_met());
  std::array<void*, 2> published{};
  std::vector<std::thread> publishers;
  for (void*& p : published) publishers.emplace_back([&b, &p] { p = b.allocate(4096, 0).ptr; });
  while (!obs->publishers_met()) std::this_thread::yield();
  events_a.release_blocked();
  holder.join();
  for (auto& th : publishers) th.join();
  REQUIRE(held_free == FreeStatus::ok);
  for (void* p : published) REQUIRE(b.free(p) == FreeStatus::ok);

  obs->reset_peak();
  REQUIRE(obs->stats().allocation[kAll].current == 0);
  for (int round = 0; round < 200; ++round) {
    void* x = a.allocate(MiB, 0).ptr;  // counted in place
    void* y = b.allocate(MiB, 0).ptr;  // into this thread's shard
    REQUIRE(x != nullptr);
    REQUIRE(y != nullptr);
    REQUIRE(a.free(x) == FreeStatus::ok);  // counted in place, after the shard's allocation
    REQUIRE(b.free(y) == FreeStatus::ok);
  }
  const DeviceStatsView v = obs->stats();
  CHECK(v.allocation[kAll].current == 0);
  CHECK(v.allocation[kAll].peak == 2);  // 1 before the fix: the free on a was counted first
  CHECK(v.allocation[kAll].allocated == 400 + 3);
  CHECK(v.allocated_bytes[kAll].current == 0);
  CHECK(v.allocated_bytes[kAll].peak == static_cast<std::int64_t>(2 * MiB));
  CHECK(v.active_bytes[kAll].peak == static_cast<std::int64_t>(2 * MiB));
  CHECK(v.num_inconsistent_events == 0);
}

TEST_CASE("stats: a bound observer with another observer awake keeps exact peaks when two threads take turns",
          "[stats][in_place][threads]") {
  // A training loop allocates and autograd's device thread frees, one after the other, never at
  // the same time: the observer's lock is never contended, so every number must be exact. With
  // a trace ring (here: an awake counter) beside the bound StatsObserver, every event is
  // published; per-thread shards would fold each thread's partial view (only allocations, only
  // frees) into peaks that never happened.
  SimSource source;
  auto events = make_immediate_events();
  Config config;
  CachingAllocator engine(source, *events, config);
  auto obs = std::make_shared<StatsObserver>(config);
  auto counter = std::make_shared<EventCounter>();
  engine.attach_observer(obs);
  engine.attach_observer(counter);

  std::mutex m;
  std::condition_variable cv;
  int turn = 0;  // 0: the allocating thread, 1: the freeing thread, 2: done
  std::vector<void*> to_free;
  std::int64_t live_bytes = 0, peak_bytes = 0;
  std::thread freer([&] {
    for (;;) {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return turn != 0; });
      if (turn == 2) return;
      for (void* p : to_free) {
        const std::optional<BlockLookup> found = engine.lookup(p);
        REQUIRE(found.has_value());
        live_bytes -= static_cast<std::int64_t>(found->block_size_bytes);
        REQUIRE(engine.free(p) == FreeStatus::ok);
      }
      to_free.clear();
      turn = 0;
      cv.notify_all();
    }
  });
  for (int step = 0; step < 200; ++step) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return turn == 0; });
    for (int i = 0; i < 8; ++i) {
      AllocResult r = engine.allocate(std::size_t{1} << (20 + (step + i) % 4), 0);  // 1..8 MiB
      REQUIRE(r.ok());
      live_bytes += static_cast<std::int64_t>(engine.lookup(r.ptr)->block_size_bytes);
      peak_bytes = std::max(peak_bytes, live_bytes);
      to_free.push_back(r.ptr);
    }
    turn = 1;
    cv.notify_all();
  }
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return turn == 0; });
    turn = 2;
    cv.notify_all();
  }
  freer.join();
  const DeviceStatsView v = obs->stats();
  CHECK(counter->seen.load() > 0);
  CHECK(v.allocated_bytes[kAll].current == 0);
  CHECK(v.allocated_bytes[kAll].peak == peak_bytes);
  CHECK(v.allocated_bytes[kAll].peak <= v.reserved_bytes[kAll].peak);
  CHECK(v.reserved_bytes[kAll].current == static_cast<std::int64_t>(engine.totals().reserved_bytes));
}
