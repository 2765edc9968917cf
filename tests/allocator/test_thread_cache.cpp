// Thread caches (Note [Thread caches]): off until the engine's lock is contended; then a thread
// allocates mixed sizes inside leases of free memory without the lock, other threads' frees go
// back to the lease, double frees are still caught, totals and snapshots stay exact, leased memory
// is used before the engine grows, a thread's one large lease serves large requests by best fit,
// blocks of no lease a thread frees go back at its next engine lock, and caches go back to the
// engine when their thread exits.
#include <algorithm>
#include <atomic>
#include <thread>
#include <variant>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/sim_source.h"
#include "thread_cache.h"

using namespace gpumem::alloc;
using gpumem::alloc::detail::ThreadCache;

namespace {

// The thread caches of one engine that every thread shares: arenas:1 (the default, arenas:auto,
// would move contending threads to engines of their own; test_arenas covers caches there).
Config one_engine() {
  Config c;
  c.arenas = 1;
  return c;
}

constexpr std::size_t KiB = 1024;

// Hammers the engine from 4 threads until it has seen contention (bounded). Returns whether the
// thread caches came on: the count of caches is read while the threads still hold theirs (they
// wait for each other before exiting, and an exiting thread's cache goes back to the engine, so
// reading it after join() would always see 0).
bool contend(CachingAllocator& engine) {
  constexpr int kThreads = 4;
  std::atomic<std::size_t> most_caches{0};
  for (int round = 0; round < 50 && most_caches.load() == 0; ++round) {
    std::atomic<int> done{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < 20000; ++i) engine.free(engine.allocate(4 * KiB + 512 * (i % 7), 0).ptr);
        ++done;
        while (done.load() < kThreads) std::this_thread::yield();
        const std::size_t caches = engine.totals().thread_caches;
        std::size_t seen = most_caches.load();
        while (caches > seen && !most_caches.compare_exchange_weak(seen, caches)) {
        }
        ++done;  // past the read: now the threads may exit
        while (done.load() < 2 * kThreads) std::this_thread::yield();
      });
    for (auto& th : threads) th.join();
  }
  return most_caches.load() > 0;
}

// contend(), then one allocation on this thread, which makes its own cache (caches stay on once
// contended). Returns whether this thread has a cache.
bool contend_and_lease(CachingAllocator& engine) {
  contend(engine);
  REQUIRE(engine.free(engine.allocate(4 * KiB, 0).ptr) == FreeStatus::ok);
  return engine.totals().thread_caches != 0;
}

// This thread allocates and frees a block of no lease, which stays in its cache (a returning
// lease), then another thread allocates and frees `there` and exits (so its cache goes back): what
// this thread had cached before the request and what was reserved before and after it.
struct LeaseThenRequest {
  std::size_t freed, cached_before, reserved_before, reserved_after;
};
LeaseThenRequest free_here_then_request_there(CachingAllocator& engine, std::size_t here, std::size_t there) {
  auto r = engine.allocate(here, 0);
  REQUIRE(r.ok());
  REQUIRE(engine.free(r.ptr) == FreeStatus::ok);
  const EngineTotals t = engine.totals();
  LeaseThenRequest a{r.size_bytes, t.thread_cached_bytes, t.reserved_bytes, 0};
  std::thread([&engine, there] {
    auto x = engine.allocate(there, 0);
    REQUIRE(x.ok());
    CHECK(engine.free(x.ptr) == FreeStatus::ok);
  }).join();
  engine.check_invariants();
  a.reserved_after = engine.totals().reserved_bytes;
  return a;
}

}  // namespace

TEST_CASE("thread caches stay off without contention", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  for (int i = 0; i < 1000; ++i) REQUIRE(engine.free(engine.allocate(8 * KiB, 0).ptr) == FreeStatus::ok);
  CHECK(engine.totals().thread_caches == 0);
  CHECK_FALSE(engine.totals().thread_caches_on);
  CHECK_FALSE(engine.thread_caches_on());
  // Every allocate and free took the engine's lock, and never found it taken.
  const EngineLockCounts locks = engine.lock_counts();
  CHECK(locks.acquisitions == 2000);
  CHECK(locks.contended == 0);
}

TEST_CASE("totals say that thread caches came on, after their threads are gone too", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  const EngineTotals t = engine.totals();  // contend()'s threads have exited: their caches went back
  CHECK(t.thread_caches_on);
  CHECK(engine.thread_caches_on());
  CHECK(t.thread_cached_bytes == 0);
  // Caches came on at a contended acquisition of the engine's lock, which was counted.
  const EngineLockCounts locks = engine.lock_counts();
  CHECK(locks.contended >= 1);
  CHECK(locks.contended <= locks.acquisitions);
  // With them on, this thread's calls are served by its cache once it holds a lease: 2,000 calls
  // take the engine's lock a few times (the first lease), not 2,000.
  for (int i = 0; i < 1000; ++i) REQUIRE(engine.free(engine.allocate(8 * KiB, 0).ptr) == FreeStatus::ok);
  const EngineLockCounts after = engine.lock_counts();
  CHECK(after.acquisitions - locks.acquisitions < 10);
  CHECK(after.contended == locks.contended);  // nobody else is allocating
}

TEST_CASE("thread caches serve repeats and keep every number exact", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  const bool caches_on = contend(engine);
  engine.check_invariants();
  if (!caches_on) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  CHECK(engine.totals().thread_caches == 0);  // the hammering threads' caches went back at exit

  auto a = engine.allocate(24 * KiB, 0);
  REQUIRE(a.ok());
  REQUIRE(engine.free(a.ptr) == FreeStatus::ok);
  // The block went back to the lease it came from, in this thread's cache: free memory (the
  // lease's, at least the block's), not allocated.
  EngineTotals t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.thread_cached_bytes >= 24 * KiB);
  CHECK(engine.free(a.ptr) == FreeStatus::double_free);
  CHECK(engine.record_stream(a.ptr, 5) == FreeStatus::double_free);
  CHECK_FALSE(engine.lookup(a.ptr).has_value());
  // The same size comes straight back.
  auto b = engine.allocate(24 * KiB, 0);
  REQUIRE(b.ok());
  CHECK(b.ptr == a.ptr);
  CHECK(engine.totals().allocated_bytes == 24 * KiB);
  CHECK(engine.totals().requested_bytes == 24 * KiB);
  REQUIRE(engine.free(b.ptr) == FreeStatus::ok);
  // A snapshot hands cached blocks back first: they show as free memory.
  auto snap = engine.snapshot();
  for (const auto& seg : snap.segments)
    for (const auto& blk : seg.blocks) CHECK(blk.state != BlockState::cached);
  CHECK(engine.totals().thread_cached_bytes == 0);
  engine.check_invariants();
  engine.empty_cache();
  CHECK(source.physical_bytes() == 0);
}

TEST_CASE("a thread's cache goes back to the engine when the thread exits", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  std::thread worker([&] {
    for (int i = 0; i < 4; ++i) engine.free(engine.allocate(64 * KiB, 0).ptr);
  });
  worker.join();
  const EngineTotals t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.thread_cached_bytes == 0);  // the exited threads' caches were drained
  engine.check_invariants();
}

namespace {
// A thread-local whose destructor allocates and frees through an engine. Touched before the
// thread's cache slots exist, it is destroyed after them (thread-locals die in reverse order).
struct LateUser {
  CachingAllocator* engine = nullptr;
  ~LateUser() {
    if (engine)
      for (int i = 0; i < 4; ++i) engine->free(engine->allocate(8 * KiB, 0).ptr);
  }
};
thread_local LateUser t_late_user;
}  // namespace

TEST_CASE("a thread-local destructor that runs after the thread's caches are gone makes no cache", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  std::thread worker([&] {
    t_late_user.engine = &engine;  // constructed first, destroyed last
    for (int i = 0; i < 4; ++i) engine.free(engine.allocate(64 * KiB, 0).ptr);  // this thread's cache
  });
  worker.join();
  const EngineTotals t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.thread_caches == 0);         // the late allocations took the locked path: no cache left behind
  CHECK(t.thread_cached_bytes == 0);
  engine.check_invariants();
}

TEST_CASE("leases serve mixed sizes, take frees from other threads and are used before growing", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend_and_lease(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  engine.check_invariants();

  // Mixed small sizes: all served, distinct, counted exactly.
  std::vector<AllocResult> blocks;
  std::size_t requested = 0;
  for (std::size_t i = 0; i < 64; ++i) {
    const std::size_t size = 512 * (1 + (i * 37) % 200);
    blocks.push_back(engine.allocate(size, 0));
    REQUIRE(blocks.back().ok());
    requested += size;
  }
  engine.check_invariants();
  EngineTotals t = engine.totals();
  CHECK(t.requested_bytes == requested);
  for (const auto& b : blocks) {
    const auto l = engine.lookup(b.ptr);
    REQUIRE(l.has_value());
    CHECK(l->block_size_bytes == b.size_bytes);
  }
  // Another thread frees them: each goes back to this thread's lease.
  std::thread other([&] {
    for (const auto& b : blocks) CHECK(engine.free(b.ptr) == FreeStatus::ok);
  });
  other.join();
  engine.check_invariants();
  t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.requested_bytes == 0);
  // Freeing them again is refused (a block merged into a free neighbour reads as a pointer inside
  // free memory, as without caches).
  for (const auto& b : blocks) CHECK(engine.free(b.ptr) != FreeStatus::ok);

  // record_stream on a leased block: the block becomes the engine's and its free waits.
  auto r = engine.allocate(40 * KiB, 0);
  REQUIRE(r.ok());
  CHECK(engine.record_stream(r.ptr, 7) == FreeStatus::ok);
  engine.check_invariants();
  CHECK(engine.free(r.ptr) == FreeStatus::ok);
  engine.check_invariants();

  // Memory held in leases is used before the engine fails or releases anything: with the cap at
  // what is reserved now, another thread (no lease of its own) gets a block the size of this
  // thread's leased free memory. (Less than ThreadCache::kGrowPastLeasedBytes is leased, so the
  // engine tries to grow first; the growth fails at the cap, and the leases go back then.)
  auto s = engine.allocate(24 * KiB, 0);  // this thread leases again
  REQUIRE(s.ok());
  REQUIRE(engine.free(s.ptr) == FreeStatus::ok);
  t = engine.totals();
  REQUIRE(t.thread_cached_bytes > 0);
  const std::size_t want = std::min<std::size_t>(t.thread_cached_bytes, 1024 * KiB);  // the small pool
  engine.set_memory_limit(t.reserved_bytes);
  std::thread third([&] {
    auto big = engine.allocate(want, 0);
    CHECK(big.ok());
    if (big.ok()) CHECK(engine.free(big.ptr) == FreeStatus::ok);
  });
  third.join();
  CHECK(engine.totals().reserved_bytes == t.reserved_bytes);  // nothing was released either
  engine.check_invariants();
}

TEST_CASE("leases come from free memory: a thread's large lease serves large requests by best fit", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend_and_lease(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  const std::size_t leased = engine.totals().thread_cached_bytes;
  REQUIRE(leased > 0);
  constexpr std::size_t MiB = std::size_t{1} << 20;

  // No large-pool memory is free: a large request grows the engine (a lease is never grown for),
  // and its growth drains no small-pool lease.
  const std::size_t reserved_before = engine.totals().reserved_bytes;
  auto whole = engine.allocate(256 * MiB, 0);
  REQUIRE(whole.ok());
  EngineTotals t = engine.totals();
  CHECK(t.reserved_bytes > reserved_before);
  CHECK(t.thread_cached_bytes == leased);
  CHECK(t.allocated_bytes == whole.size_bytes);
  engine.check_invariants();
  // Freed by a thread that then exits: the memory is the engine's free memory.
  std::thread([&] { CHECK(engine.free(whole.ptr) == FreeStatus::ok); }).join();
  t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.thread_cached_bytes == leased);
  const std::size_t reserved = t.reserved_bytes;

  // A large request: this thread leases kLeaseLargeBytes (64 MiB) of that free memory (best fit,
  // lowest address) and is served from it; the next large requests that fit come from the lease.
  auto a = engine.allocate(8 * MiB, 0);
  REQUIRE(a.ok());
  CHECK(a.ptr == whole.ptr);
  CHECK(engine.totals().thread_cached_bytes == leased + 56 * MiB);
  auto b = engine.allocate(16 * MiB, 0);
  REQUIRE(b.ok());
  CHECK(reinterpret_cast<std::uintptr_t>(b.ptr) == reinterpret_cast<std::uintptr_t>(whole.ptr) + 8 * MiB);
  t = engine.totals();
  CHECK(t.thread_cached_bytes == leased + 40 * MiB);
  CHECK(t.allocated_bytes == a.size_bytes + b.size_bytes);
  CHECK(t.reserved_bytes == reserved);
  engine.check_invariants();
  // Another thread's free goes back to the lease and merges there.
  std::thread([&] { CHECK(engine.free(a.ptr) == FreeStatus::ok); }).join();
  CHECK(engine.totals().thread_cached_bytes == leased + 48 * MiB);
  engine.check_invariants();

  // A request the lease cannot serve: the lease goes back to the engine (its allocated block
  // becomes the engine's), and a new one is taken for the request from free memory; no growth.
  auto c = engine.allocate(128 * MiB, 0);
  REQUIRE(c.ok());
  t = engine.totals();
  CHECK(t.reserved_bytes == reserved);
  CHECK(t.allocated_bytes == b.size_bytes + c.size_bytes);
  CHECK(t.thread_cached_bytes == leased);  // the new lease is the request's size: all allocated
  engine.check_invariants();
  // b is a block of no lease now: its free makes it a returning lease of this thread's cache; c's
  // goes back to the large lease.
  REQUIRE(engine.free(b.ptr) == FreeStatus::ok);
  REQUIRE(engine.free(c.ptr) == FreeStatus::ok);
  t = engine.totals();
  CHECK(t.allocated_bytes == 0);
  CHECK(t.thread_cached_bytes == leased + b.size_bytes + c.size_bytes);
  engine.check_invariants();

  // A request larger than everything free: the leases of the large pool go back before the engine
  // grows, so the growth uses their memory (reserved grows by at most the request).
  auto huge = engine.allocate(512 * MiB, 0);
  REQUIRE(huge.ok());
  t = engine.totals();
  CHECK(t.thread_cached_bytes == leased);
  CHECK(t.reserved_bytes <= reserved + huge.size_bytes);
  engine.check_invariants();
  REQUIRE(engine.free(huge.ptr) == FreeStatus::ok);
  engine.check_invariants();
  // Double frees of blocks that went through leases are still caught (classifying a bad pointer
  // hands every lease back first).
  CHECK(engine.free(huge.ptr) == FreeStatus::double_free);
  const FreeStatus again = engine.free(b.ptr);
  CHECK((again == FreeStatus::double_free || again == FreeStatus::foreign_pointer));
  CHECK(engine.totals().thread_cached_bytes == 0);
  engine.check_invariants();
}

TEST_CASE("large leases are not taken when max_split_size_mb limits splitting", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  auto parsed = parse_config("max_split_size_mb:64,arenas:1");
  REQUIRE(std::holds_alternative<Config>(parsed));
  CachingAllocator engine(source, *events, std::get<Config>(parsed));
  if (!contend_and_lease(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  const std::size_t leased = engine.totals().thread_cached_bytes;
  constexpr std::size_t MiB = std::size_t{1} << 20;
  auto whole = engine.allocate(256 * MiB, 0);
  REQUIRE(whole.ok());
  std::thread([&] { CHECK(engine.free(whole.ptr) == FreeStatus::ok); }).join();
  // The engine serves the request under its rules; nothing of the large pool is leased.
  auto a = engine.allocate(8 * MiB, 0);
  REQUIRE(a.ok());
  CHECK(engine.totals().thread_cached_bytes == leased);
  engine.check_invariants();
  REQUIRE(engine.free(a.ptr) == FreeStatus::ok);
  engine.check_invariants();
}

TEST_CASE("blocks of no lease a thread frees go back to the engine at its next engine lock", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend_and_lease(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  const std::size_t leased = engine.totals().thread_cached_bytes;
  constexpr std::size_t kMaxReturning = 4;  // ThreadCache::kMaxReturning
  constexpr std::size_t kMiB = std::size_t{1} << 20;

  // Large blocks of distinct sizes, all allocated before any is freed (no lease serves them).
  std::vector<AllocResult> blocks;
  for (std::size_t i = 0; i < kMaxReturning + 2; ++i) {
    blocks.push_back(engine.allocate((4 + 2 * i) * kMiB, 0));
    REQUIRE(blocks.back().ok());
  }
  engine.check_invariants();
  // The first kMaxReturning frees make returning leases: no engine lock, the memory counted as
  // freed and as cached by this thread.
  std::size_t cached = leased;
  for (std::size_t i = 0; i < kMaxReturning; ++i) {
    REQUIRE(engine.free(blocks[i].ptr) == FreeStatus::ok);
    cached += blocks[i].size_bytes;
    const EngineTotals t = engine.totals();
    CHECK(t.thread_cached_bytes == cached);
    engine.check_invariants();
  }
  // A returning lease serves this thread's requests by best fit: a request of exactly one's size
  // gets that block back; a double free of it is still caught.
  auto again = engine.allocate(blocks[3].size_bytes, 0);
  REQUIRE(again.ok());
  CHECK(again.ptr == blocks[3].ptr);
  CHECK(engine.totals().thread_cached_bytes == cached - blocks[3].size_bytes);
  engine.check_invariants();
  REQUIRE(engine.free(again.ptr) == FreeStatus::ok);
  CHECK(engine.totals().thread_cached_bytes == cached);
  engine.check_invariants();

  // The cache is full: the next free takes the engine's lock, which gives the returning leases
  // back; the one after becomes a returning lease again.
  REQUIRE(engine.free(blocks[kMaxReturning].ptr) == FreeStatus::ok);
  EngineTotals t = engine.totals();
  CHECK(t.thread_cached_bytes == leased);
  engine.check_invariants();
  REQUIRE(engine.free(blocks[kMaxReturning + 1].ptr) == FreeStatus::ok);
  t = engine.totals();
  CHECK(t.thread_cached_bytes == leased + blocks[kMaxReturning + 1].size_bytes);
  CHECK(t.allocated_bytes == 0);
  engine.check_invariants();
  // Every block went back as free memory: a second free of any is refused (double_free where the
  // pointer still starts a free block, foreign_pointer where that block merged into a neighbour).
  for (const auto& b : blocks) {
    const FreeStatus st = engine.free(b.ptr);
    CHECK((st == FreeStatus::double_free || st == FreeStatus::foreign_pointer));
  }
  CHECK(engine.totals().allocated_bytes == 0);
  engine.check_invariants();
}

TEST_CASE("a growth takes other threads' leased memory back first only when there is enough of it", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend_and_lease(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  constexpr std::size_t kGrowPastLeased = 64 * kMiB;  // ThreadCache::kGrowPastLeasedBytes
  const std::size_t leased = engine.totals().thread_cached_bytes;  // this thread's small leases

  // 16 MiB in this thread's cache: less than kGrowPastLeased is leased in the large pool, so
  // another thread's 8 MiB request makes the engine grow and leaves this thread's lease alone.
  const LeaseThenRequest a = free_here_then_request_there(engine, 16 * kMiB, 8 * kMiB);
  REQUIRE(a.cached_before == leased + a.freed);
  CHECK(a.reserved_after > a.reserved_before);
  CHECK(engine.totals().thread_cached_bytes == leased + a.freed);

  // 128 MiB in this thread's cache (its allocation took the engine lock, which took the 16 MiB
  // lease back): now the large pool's leased memory is at least kGrowPastLeased and at least the
  // 96 MiB request, so it goes back before any growth, and the request is served from it.
  static_assert(96 * kMiB >= kGrowPastLeased);
  const LeaseThenRequest c = free_here_then_request_there(engine, 128 * kMiB, 96 * kMiB);
  REQUIRE(c.cached_before == leased + c.freed);
  CHECK(c.reserved_after == c.reserved_before);
  CHECK(engine.totals().thread_cached_bytes == leased);
}

TEST_CASE("garbage collection sees the segments in threads' leases", "[engine][thread_cache]") {
  // Classic segments, a cap, and a collection threshold: a growth above the threshold first
  // releases whole free segments, least recently freed first. A segment freed by a thread is a
  // returning lease of its cache, less than ThreadCache::kGrowPastLeasedBytes here, so the growth
  // rule alone would leave it leased; the collector must still see it.
  SimSource source;
  auto events = make_immediate_events();
  Config config = one_engine();
  config.expandable_segments = false;
  config.garbage_collection_threshold = 0.4;
  CachingAllocator engine(source, *events, config);
  if (!contend_and_lease(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const std::size_t reserved0 = engine.totals().reserved_bytes;  // the small pool's segments
  const std::size_t leased = engine.totals().thread_cached_bytes;
  REQUIRE(reserved0 < 64 * kMiB);  // so that releasing the 48 MiB segment ends the collection

  // This thread's 48 MiB segment, freed here: a returning lease of its cache.
  auto seg = engine.allocate(48 * kMiB, 0);
  REQUIRE(seg.ok());
  REQUIRE(engine.free(seg.ptr) == FreeStatus::ok);
  REQUIRE(engine.totals().thread_cached_bytes == leased + 48 * kMiB);
  REQUIRE(engine.totals().reserved_bytes == reserved0 + 48 * kMiB);

  // The cap leaves room for a 56 MiB segment beside it, and the threshold (0.4 of the cap) is
  // passed: another thread's 56 MiB request releases the free 48 MiB segment and grows by 56.
  engine.set_memory_limit(reserved0 + 104 * kMiB);
  std::thread([&] {
    auto r = engine.allocate(56 * kMiB, 0);
    REQUIRE(r.ok());
    CHECK(engine.totals().reserved_bytes == reserved0 + 56 * kMiB);
    CHECK(engine.free(r.ptr) == FreeStatus::ok);
  }).join();
  CHECK(source.physical_bytes() == reserved0 + 56 * kMiB);
  CHECK(engine.totals().thread_cached_bytes <= leased);
  engine.check_invariants();
}

TEST_CASE("the allowance of leased memory a growth passes is 64 MiB per cache within 0.5% of reserved", "[engine][thread_cache]") {
  constexpr std::size_t kMiB = std::size_t{1} << 20, kGiB = kMiB << 10;
  constexpr auto allowance = ThreadCache::grow_past_leased_allowance;
  // Never below 64 MiB, whatever is reserved or however few caches there are.
  CHECK(allowance(0, 0) == 64 * kMiB);
  CHECK(allowance(1, 100 * kGiB) == 64 * kMiB);
  CHECK(allowance(8, kGiB) == 64 * kMiB);
  // 64 MiB per cache while that is within 0.5% of reserved; then 0.5% of reserved.
  CHECK(allowance(2, 100 * kGiB) == 128 * kMiB);
  CHECK(allowance(8, 100 * kGiB) == 512 * kMiB);
  CHECK(allowance(8, 20 * kGiB) == 20 * kGiB / 200);
  CHECK(allowance(16, 200 * kGiB) == kGiB);
}

TEST_CASE("with a large footprint growth passes more leased memory before taking it back", "[engine][thread_cache]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, one_engine());
  if (!contend_and_lease(engine)) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  constexpr std::size_t kMiB = std::size_t{1} << 20, kGiB = kMiB << 10;
  const std::size_t leased = engine.totals().thread_cached_bytes;  // this thread's small leases
  // 16 GiB in use: with two caches (this thread's and the requesting thread's) the allowance is
  // min(2 x 64 MiB, 0.5% of ~16.1 GiB) = ~82 MiB.
  auto big = engine.allocate(16 * kGiB, 0);
  REQUIRE(big.ok());

  // 72 MiB in this thread's cache is more than 64 MiB but less than the allowance: another
  // thread's 8 MiB request makes the engine grow and leaves the lease alone.
  const LeaseThenRequest a = free_here_then_request_there(engine, 72 * kMiB, 8 * kMiB);
  REQUIRE(a.cached_before == leased + a.freed);
  REQUIRE(ThreadCache::grow_past_leased_allowance(2, a.reserved_before) > 72 * kMiB);
  CHECK(a.reserved_after > a.reserved_before);
  CHECK(engine.totals().thread_cached_bytes == leased + a.freed);

  // 96 MiB is more than the allowance: it goes back before the 88 MiB request (more than any free
  // block the engine holds: the 72 and 8 MiB above) would grow, and serves it.
  const LeaseThenRequest b = free_here_then_request_there(engine, 96 * kMiB, 88 * kMiB);
  REQUIRE(b.cached_before == leased + b.freed);
  REQUIRE(ThreadCache::grow_past_leased_allowance(2, b.reserved_before) <= 96 * kMiB);
  CHECK(b.reserved_after == b.reserved_before);
  CHECK(engine.totals().thread_cached_bytes == leased);
  REQUIRE(engine.free(big.ptr) == FreeStatus::ok);
  engine.check_invariants();
}
