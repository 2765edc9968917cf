// Seeded multi-threaded stress on real host memory: 4 threads run 1,000,000 random operations in
// all (GPUMEM_STRESS_OPS overrides) on one engine over HostVmmSource. Every live block carries a
// pattern unique to its allocation, written at allocation and checked before it is freed, so two
// live blocks that overlap, or memory that moved under a block, are caught. Some blocks are freed
// by another thread than the one that allocated them. Invariants are checked throughout.
//
// The slow-driver stress (GPUMEM_STRESS_SLOW_OPS overrides its 200,000 operations) widens the
// windows in which growth and release run without the engine's lock (Note [Engine locking]):
// driver calls and stream syncs sleep, a cap forces the OOM retry (and, on classic segments,
// garbage collection), another thread empties the cache, snapshots and checks invariants, and
// faults are injected into create/map/unmap/reserve. Nothing may overlap, move, leak or break.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/host_vmm_source.h"
#include "slow_source.h"

using namespace gpumem::alloc;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

struct Live {
  unsigned char* ptr = nullptr;
  std::size_t size = 0;
  std::uint64_t tag = 0;
};

// Writes the tag over the whole block when it is small, else over its first and last 4 KiB and
// one word in every 64 KiB (touching every page of large blocks would cost more than it checks).
void write_pattern(const Live& l) {
  auto fill = [&](std::size_t off, std::size_t n) {
    for (std::size_t i = off; i + 8 <= off + n; i += 8) {
      const std::uint64_t v = l.tag ^ i;
      std::memcpy(l.ptr + i, &v, 8);
    }
  };
  if (l.size <= 64 * KiB) return fill(0, l.size & ~std::size_t{7});
  fill(0, 4 * KiB);
  fill((l.size - 4 * KiB) & ~std::size_t{7}, 4 * KiB);
  for (std::size_t off = 64 * KiB; off + 8 <= l.size - 4 * KiB; off += 64 * KiB) fill(off, 8);
}

bool check_pattern(const Live& l) {
  auto ok = [&](std::size_t off, std::size_t n) {
    for (std::size_t i = off; i + 8 <= off + n; i += 8) {
      std::uint64_t v;
      std::memcpy(&v, l.ptr + i, 8);
      if (v != (l.tag ^ i)) return false;
    }
    return true;
  };
  if (l.size <= 64 * KiB) return ok(0, l.size & ~std::size_t{7});
  if (!ok(0, 4 * KiB) || !ok((l.size - 4 * KiB) & ~std::size_t{7}, 4 * KiB)) return false;
  for (std::size_t off = 64 * KiB; off + 8 <= l.size - 4 * KiB; off += 64 * KiB)
    if (!ok(off, 8)) return false;
  return true;
}

std::size_t random_size(std::mt19937_64& rng) {
  const unsigned r = rng() % 1000;
  if (r < 700) return 1 + rng() % (16 * KiB);              // small tensors
  if (r < 950) return 16 * KiB + rng() % (1 * MiB);        // small pool, up to 1 MiB
  if (r < 995) return 1 * MiB + rng() % (8 * MiB);         // large pool, inside one piece
  return 20 * MiB + rng() % (40 * MiB);                    // spans pieces
}

// One thread's live blocks, each carrying its pattern.
struct LiveSet {
  std::vector<Live> live;
  std::size_t bytes = 0;

  // Allocates n bytes on stream and writes a fresh pattern; false if the engine refused.
  bool allocate(CachingAllocator& engine, std::size_t n, StreamId stream, std::atomic<std::uint64_t>& next_tag) {
    auto res = engine.allocate(n, stream);
    if (!res.ok()) return false;
    Live l{static_cast<unsigned char*>(res.ptr), n, next_tag.fetch_add(1) * 0x9E3779B97F4A7C15ull};
    write_pattern(l);
    live.push_back(l);
    bytes += n;
    return true;
  }
  // Removes and returns the k-th block.
  Live take(std::size_t k) {
    Live l = live[k];
    live[k] = live.back();
    live.pop_back();
    bytes -= l.size;
    return l;
  }
};

// The number of operations: the environment variable env if set, else fallback.
std::size_t ops_from_env(const char* env, std::size_t fallback) {
  if (const char* v = std::getenv(env)) return std::strtoull(v, nullptr, 10);
  return fallback;
}

}  // namespace

TEST_CASE("4 threads, random operations on host memory: no overlap, no corruption, invariants hold",
          "[engine][stress]") {
  const std::size_t total_ops = ops_from_env("GPUMEM_STRESS_OPS", 1'000'000);
  constexpr int kThreads = 4;

  HostVmmSourceOptions options;
  options.capacity_bytes = std::size_t{3} << 30;
  HostVmmSource source(options);
  REQUIRE(source.init_status() == SourceStatus::ok);
  auto events = make_immediate_events();
  Config config;
  config.va_reserve_bytes = std::size_t{8} << 30;
  // The default (arenas:auto: threads that contend get engines of their own) and one engine that
  // every thread shares, with its thread caches.
  config.arenas = GENERATE(kArenasAuto, 1u);
  INFO("arenas " << config.arenas << " (0: auto)");
  CachingAllocator engine(source, *events, config);

  std::mutex handoff_mutex;
  std::deque<Live> handoff;  // blocks one thread allocated and another frees
  std::atomic<std::uint64_t> corrupt{0}, oom{0}, bad_free{0};
  std::atomic<std::uint64_t> next_tag{1};
  std::atomic<bool> failed{false};

  auto worker = [&](int t) {
    std::mt19937_64 rng(1234 + t);
    LiveSet mine;
    const std::size_t ops = total_ops / kThreads;
    auto release = [&](const Live& l) {
      if (!check_pattern(l)) corrupt.fetch_add(1);
      if (engine.free(l.ptr) != FreeStatus::ok) bad_free.fetch_add(1);
    };
    for (std::size_t i = 0; i < ops && !failed.load(std::memory_order_relaxed); ++i) {
      const unsigned r = rng() % 100;
      if (mine.live.empty() || (r < 50 && mine.bytes < 256 * MiB)) {
        if (!mine.allocate(engine, random_size(rng), 0, next_tag)) oom.fetch_add(1);
      } else if (r < 55) {
        // Hand a block to another thread, and free one handed to us.
        const Live give = mine.take(rng() % mine.live.size());
        Live take;
        {
          std::lock_guard lock(handoff_mutex);
          handoff.push_back(give);
          if (handoff.size() > 8) {
            take = handoff.front();
            handoff.pop_front();
          }
        }
        if (take.ptr) release(take);
      } else {
        release(mine.take(rng() % mine.live.size()));
      }
      if (t == 0 && i % 20000 == 0) engine.check_invariants();
      if (corrupt.load(std::memory_order_relaxed) || bad_free.load(std::memory_order_relaxed)) failed = true;
    }
    for (const Live& l : mine.live) release(l);
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  for (const Live& l : handoff) {
    CHECK(check_pattern(l));
    CHECK(engine.free(l.ptr) == FreeStatus::ok);
  }

  CHECK(corrupt.load() == 0);
  CHECK(bad_free.load() == 0);
  CHECK(oom.load() == 0);
  engine.check_invariants();
  const EngineTotals t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.requested_bytes == 0);
  engine.empty_cache();
  engine.check_invariants();
  CHECK(engine.totals().reserved_bytes == 0);
  CHECK(source.physical_bytes() == 0);
}

TEST_CASE("recycling on host memory moves pages and keeps data intact", "[engine][recycle]") {
  HostVmmSourceOptions options;
  options.capacity_bytes = std::size_t{1} << 30;
  HostVmmSource source(options);
  REQUIRE(source.init_status() == SourceStatus::ok);
  auto events = make_immediate_events();
  Config config;
  config.va_reserve_bytes = std::size_t{4} << 30;
  config.check_invariants = true;
  config.pieces = PieceSizing::fixed;  // one 20 MiB piece per block
  CachingAllocator engine(source, *events, config);
  // Five one-piece blocks; free every other one, keep the rest tagged.
  std::vector<Live> blocks;
  for (int i = 0; i < 5; ++i) {
    auto r = engine.allocate(20 * MiB, 0);
    REQUIRE(r.ok());
    blocks.push_back({static_cast<unsigned char*>(r.ptr), 20 * MiB, 1000u + static_cast<unsigned>(i)});
    write_pattern(blocks.back());
  }
  for (int i = 0; i < 5; i += 2) REQUIRE(engine.free(blocks[i].ptr) == FreeStatus::ok);
  // 60 MiB lands after the last piece and takes two recycled pieces; the data of the pinned
  // blocks is untouched and the new block is fully writable.
  auto big = engine.allocate(60 * MiB, 0);
  REQUIRE(big.ok());
  CHECK(source.counters().unmaps == 0);  // the moved pieces keep their old mappings
  CHECK(engine.totals().kept_mappings == 2);
  CHECK(source.counters().creates == 5);
  Live b{static_cast<unsigned char*>(big.ptr), 60 * MiB, 77};
  std::memset(b.ptr, 0x5a, b.size);
  write_pattern(b);
  CHECK(check_pattern(blocks[1]));
  CHECK(check_pattern(blocks[3]));
  CHECK(check_pattern(b));
  // The cost of kept mappings (docs/notes/physical-page-recycling.md): a stale pointer into a moved
  // piece's old place does not fault, it reads the piece's new block.
  const auto aliases_a_piece_of_big = [&](const unsigned char* old) {
    for (int k = 0; k < 3; ++k)
      if (std::memcmp(old, b.ptr + k * 20 * MiB, 20 * MiB) == 0) return true;
    return false;
  };
  CHECK(aliases_a_piece_of_big(blocks[0].ptr));
  CHECK(aliases_a_piece_of_big(blocks[2].ptr));
  REQUIRE(engine.free(big.ptr) == FreeStatus::ok);
  REQUIRE(engine.free(blocks[1].ptr) == FreeStatus::ok);
  REQUIRE(engine.free(blocks[3].ptr) == FreeStatus::ok);
  engine.empty_cache();
  CHECK(source.physical_bytes() == 0);
}

namespace {

void run_slow_driver_stress(bool expandable, std::uint64_t seed) {
  const std::size_t total_ops = ops_from_env("GPUMEM_STRESS_SLOW_OPS", 200'000);
  constexpr int kThreads = 4;

  HostVmmSourceOptions options;
  options.capacity_bytes = std::size_t{1} << 30;
  HostVmmSource host(options);
  REQUIRE(host.init_status() == SourceStatus::ok);
  test::SlowSource source(host, std::chrono::microseconds(200), seed);
  auto immediate = make_immediate_events();
  test::SlowEvents events(*immediate, std::chrono::microseconds(50));
  Config config;
  config.expandable_segments = expandable;
  config.va_reserve_bytes = std::size_t{2} << 30;
  if (!expandable) config.garbage_collection_threshold = 0.5;
  CachingAllocator engine(source, events, config);
  engine.set_memory_limit(256 * MiB);

  std::atomic<std::uint64_t> corrupt{0}, oom{0}, bad_free{0}, next_tag{1};
  std::atomic<int> running{kThreads};

  auto worker = [&](int t) {
    std::mt19937_64 rng(seed * 977 + static_cast<std::uint64_t>(t));
    LiveSet mine;
    auto release = [&](const Live& l) {
      if (!check_pattern(l)) corrupt.fetch_add(1);
      if (engine.free(l.ptr) != FreeStatus::ok) bad_free.fetch_add(1);
    };
    for (std::size_t i = 0; i < total_ops / kThreads; ++i) {
      const unsigned r = rng() % 100;
      // Mostly under 40 MiB live per thread; now and then a burst that only fits after the OOM
      // retry has released what other threads cached.
      const std::size_t budget = (i / 500) % 7 == 3 ? 120 * MiB : 40 * MiB;
      if (mine.live.empty() || (r < 50 && mine.bytes < budget)) {
        const std::size_t n = random_size(rng);
        const StreamId stream = rng() % 8 == 0 ? 1 : 0;
        if (!mine.allocate(engine, n, stream, next_tag)) oom.fetch_add(1);
      } else {
        release(mine.take(rng() % mine.live.size()));
      }
    }
    for (const Live& l : mine.live) release(l);
    running.fetch_sub(1);
  };

  // Empties the cache, snapshots, checks invariants and injects faults while the workers run.
  auto meddler = [&] {
    std::mt19937_64 rng(seed ^ 0xfeed);
    std::size_t rounds = 0;
    while (running.load() > 0) {
      switch (rng() % 4) {
        case 0: engine.empty_cache(); break;
        case 1: (void)engine.snapshot(); break;
        case 2: engine.check_invariants(); break;
        case 3:
          if (rng() % 4 == 0) source.fail_next(static_cast<test::SlowSource::Op>(rng() % 4));
          break;
      }
      ++rounds;
      std::this_thread::sleep_for(std::chrono::microseconds(200 + rng() % 500));
    }
    return rounds;
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  std::size_t rounds = 0;
  std::thread m([&] { rounds = meddler(); });
  for (auto& th : threads) th.join();
  m.join();

  CHECK(corrupt.load() == 0);
  CHECK(bad_free.load() == 0);
  CHECK(rounds > 0);
  INFO("out-of-memory results (expected under the cap and injected faults): " << oom.load());
  engine.check_invariants();
  const EngineTotals t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.active_bytes == 0);
  CHECK(host.physical_bytes() == t.reserved_bytes);  // nothing leaked while faults rolled back
  CHECK(source.total_calls() > total_ops / 400);  // the slow calls ran, often
  source.clear_faults();  // one the meddler injected may be pending still
  engine.empty_cache();
  engine.check_invariants();
  CHECK(engine.totals().reserved_bytes == 0);
  CHECK(host.physical_bytes() == 0);
  CHECK(engine.totals().va_reserved_bytes == 0);
}

}  // namespace

TEST_CASE("slow driver calls, expandable: growth, release, OOM retry and faults from 5 threads",
          "[engine][stress][locking]") {
  run_slow_driver_stress(true, 11);
}

TEST_CASE("slow driver calls, classic segments: growth, garbage collection, release and faults from 5 threads",
          "[engine][stress][locking]") {
  run_slow_driver_stress(false, 23);
}
