// The engine during a CUDA graph capture and as a graph's private pool (Note [Engine during graph
// capture], caching_allocator.h; docs/notes/graph-pools.md): while capturing it never queries,
// waits or synchronizes (pending frees stay pending, growth creates instead of recycling, nothing
// is released); while holding it never gives memory back or moves it; allocate_at re-creates an
// allocation at a recorded address.
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <thread>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/alloc/sim_source.h"
#include "slow_source.h"

using namespace gpumem::alloc;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

Config test_config() {
  Config c;
  c.check_invariants = true;
  c.va_reserve_bytes = 1024 * MiB;
  c.thread_cache = false;  // frees go to the engine at once: what each test looks at
  return c;
}

// ManualStreamEvents that counts every call, and counts a call that asks about or waits for a
// stream as a violation while `forbidden` is set (what CUDA refuses during a capture).
class WatchedEvents final : public StreamEvents {
 public:
  std::atomic<bool> forbidden{false};
  std::atomic<int> violations{0}, records{0}, queries{0}, syncs{0}, stream_syncs{0};
  ManualStreamEvents inner;

  EventToken record(StreamId stream) override {
    ++records;
    return inner.record(stream);
  }
  bool query(EventToken token) override {
    ++queries;
    note();
    return inner.query(token);
  }
  void synchronize(EventToken token) override {
    ++syncs;
    note();
    inner.synchronize(token);
  }
  void release(EventToken token) override { inner.release(token); }
  void synchronize_stream(StreamId stream) override {
    ++stream_syncs;
    note();
    inner.synchronize_stream(stream);
  }

 private:
  void note() {
    if (forbidden.load()) ++violations;
  }
};

struct Fixture {
  explicit Fixture(Config c = test_config(), SimSourceOptions o = {}) : source(o), engine(source, events, c) {}
  SimSource source;
  WatchedEvents events;
  CachingAllocator engine;

  void* alloc(std::size_t n, StreamId s = 0) {
    auto r = engine.allocate(n, s);
    REQUIRE(r.ok());
    return r.ptr;
  }
};

}  // namespace

TEST_CASE("capturing: a free that waits on another stream stays pending and nothing is queried",
          "[engine][capture]") {
  Fixture f;
  void* a = f.alloc(256 * KiB, 1);
  REQUIRE(f.engine.record_stream(a, 2) == FreeStatus::ok);
  f.engine.set_capturing(true);
  CHECK(f.engine.capturing());
  f.events.forbidden = true;
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  CHECK(f.engine.totals().active_bytes == 256 * KiB);  // pending_free
  f.events.inner.complete_all();                      // the other stream finished...
  void* b = f.alloc(256 * KiB, 1);                     // ...but nobody may ask during capture
  CHECK(b != a);
  CHECK(f.engine.totals().active_bytes == 512 * KiB);
  f.engine.empty_cache();  // does nothing while capturing (it would wait and synchronize)
  CHECK(f.events.violations == 0);
  CHECK(f.events.queries == 0);

  f.events.forbidden = false;
  f.engine.set_capturing(false);
  CHECK_FALSE(f.engine.capturing());
  REQUIRE(f.engine.free(b) == FreeStatus::ok);
  void* c = f.alloc(256 * KiB, 1);  // the next allocation completes the pending free first
  CHECK(f.events.queries >= 1);
  CHECK(c == a);
  CHECK(f.engine.totals().active_bytes == 256 * KiB);
  REQUIRE(f.engine.free(c) == FreeStatus::ok);
  f.engine.check_invariants();
}

TEST_CASE("capturing: growth creates pieces instead of recycling; the OOM retry releases nothing",
          "[engine][capture]") {
  SimSourceOptions small;
  small.capacity_bytes = 140 * MiB;
  Fixture f(test_config(), small);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(f.alloc(20 * MiB));
  for (int i = 0; i < 4; i += 2) REQUIRE(f.engine.free(blocks[static_cast<std::size_t>(i)]) == FreeStatus::ok);
  f.engine.set_capturing(true);
  f.events.forbidden = true;
  // 40 MiB lands after the last piece: new pieces, none recycled (recycling synchronizes). How
  // many pieces the growth policy creates for it is its business.
  const auto creates = f.source.counters().creates;
  void* big = f.alloc(40 * MiB);
  CHECK(f.source.counters().creates > creates);
  CHECK(f.source.counters().unmaps == 0);
  // Another 40 MiB would need 160 MiB of the 140 MiB there is: growth fails, and the retry may
  // neither release nor recycle the two wholly free pieces, so the request fails, nothing moves.
  const auto reserved = f.engine.totals().reserved_bytes;
  auto refused = f.engine.allocate(40 * MiB, 0);
  CHECK_FALSE(refused.ok());
  CHECK(f.engine.totals().reserved_bytes == reserved);
  CHECK(f.events.violations == 0);
  CHECK(f.events.stream_syncs == 0);

  // After the capture the same request succeeds: the free pieces move where it lands (on their
  // own stream, keeping their old mappings: nothing is unmapped, so nothing is synchronized).
  f.events.forbidden = false;
  f.engine.set_capturing(false);
  auto later = f.engine.allocate(40 * MiB, 0);
  CHECK(later.ok());
  CHECK(f.engine.totals().kept_mappings > 0);
  CHECK(f.events.stream_syncs == 0);
  for (void* p : {big, later.ptr, blocks[1], blocks[3]})
    if (p) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.check_invariants();
}

TEST_CASE("holding: nothing is released or recycled, but pending frees still complete", "[engine][capture]") {
  Fixture f;
  f.engine.set_holding(true);
  CHECK(f.engine.holding());
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(f.alloc(20 * MiB));
  REQUIRE(f.engine.record_stream(blocks[0], 7) == FreeStatus::ok);
  for (void* p : blocks) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  CHECK(f.engine.totals().active_bytes == 20 * MiB);  // blocks[0] waits for stream 7
  f.engine.empty_cache();  // waits for the pending free (ManualStreamEvents completes it) ...
  CHECK(f.engine.totals().active_bytes == 0);
  CHECK(f.engine.totals().reserved_bytes == 60 * MiB);  // ... but gives nothing back
  CHECK(f.source.counters().unmaps == 0);
  // A request on another stream: a new region, new pieces; the free ones stay where they are.
  void* other = f.alloc(40 * MiB, 3);
  CHECK(f.source.counters().unmaps == 0);
  CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
  REQUIRE(f.engine.free(other) == FreeStatus::ok);

  f.engine.set_holding(false);
  f.engine.empty_cache();
  CHECK(f.engine.totals().reserved_bytes == 0);
  f.engine.check_invariants();
}

TEST_CASE("set_capturing waits for a growth in progress", "[engine][capture]") {
  SimSource sim;
  test::SlowSource slow(sim, std::chrono::microseconds(0));
  WatchedEvents events;
  CachingAllocator engine(slow, events, test_config());
  slow.gate(test::SlowSource::Op::map).close();
  std::thread grower([&] {
    auto r = engine.allocate(4 * MiB, 0);
    CHECK(r.ok());
    CHECK(engine.free(r.ptr) == FreeStatus::ok);
  });
  REQUIRE(slow.gate(test::SlowSource::Op::map).wait_for_waiters(1));
  std::atomic<bool> set{false};
  std::thread capturer([&] {
    engine.set_capturing(true);
    set = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(set.load());  // still waiting: the growth is between its driver calls
  slow.gate(test::SlowSource::Op::map).open();
  grower.join();
  capturer.join();
  CHECK(set.load());
  CHECK(engine.capturing());
  engine.set_capturing(false);
}

TEST_CASE("allocate_at re-creates an allocation at a recorded address", "[engine][restore]") {
  Fixture f;
  void* a = f.alloc(3 * MiB);
  void* b = f.alloc(5 * MiB);
  void* c = f.alloc(700 * KiB);  // small pool
  const auto a_addr = reinterpret_cast<std::uintptr_t>(a);
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  REQUIRE(f.engine.free(b) == FreeStatus::ok);
  REQUIRE(f.engine.free(c) == FreeStatus::ok);
  const auto reserved = f.engine.totals().reserved_bytes;

  // b's old place, then a's: exact addresses, no growth, the rest stays free.
  REQUIRE(f.engine.allocate_at(b, 5 * MiB, 5 * MiB - 100) == FreeStatus::ok);
  REQUIRE(f.engine.allocate_at(a, 3 * MiB, 3 * MiB) == FreeStatus::ok);
  REQUIRE(f.engine.allocate_at(c, 700 * KiB, 700 * KiB) == FreeStatus::ok);
  CHECK(f.engine.totals().reserved_bytes == reserved);
  CHECK(f.engine.totals().allocated_bytes == 8 * MiB + 700 * KiB);
  CHECK(f.engine.totals().requested_bytes == 8 * MiB + 700 * KiB - 100);
  auto found = f.engine.lookup(b);
  REQUIRE(found.has_value());
  CHECK(found->block_size_bytes == 5 * MiB);
  CHECK(found->requested_bytes == 5 * MiB - 100);

  // Taken, unmapped, misaligned and foreign ranges are refused and change nothing.
  CHECK(f.engine.allocate_at(a, 512, 512) == FreeStatus::foreign_pointer);  // allocated now
  CHECK(f.engine.allocate_at(reinterpret_cast<void*>(a_addr + 8 * MiB), 30 * MiB, 1) ==
        FreeStatus::foreign_pointer);                                      // runs past mapped memory
  CHECK(f.engine.allocate_at(reinterpret_cast<void*>(a_addr + 8 * MiB + 100), 512, 1) ==
        FreeStatus::foreign_pointer);                                      // misaligned
  CHECK(f.engine.allocate_at(reinterpret_cast<void*>(0x1000), 512, 1) == FreeStatus::foreign_pointer);
  CHECK(f.engine.allocate_at(nullptr, 512, 1) == FreeStatus::null_pointer);
  CHECK(f.engine.totals().allocated_bytes == 8 * MiB + 700 * KiB);

  // They are ordinary allocations: freed and merged as usual.
  for (void* p : {a, b, c}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  CHECK(f.engine.totals().allocated_bytes == 0);
  f.engine.check_invariants();
}

TEST_CASE("allocate_at finds memory a thread cache holds", "[engine][restore]") {
  Config c;
  c.arenas = 1;  // one engine whose threads share its caches (arenas:auto could move them apart)
  c.va_reserve_bytes = 1024 * MiB;
  Fixture f(c);
  // Thread caches turn on once the engine's lock is contended (bounded tries).
  for (int round = 0; round < 50 && f.engine.totals().thread_caches == 0; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < 20000; ++i) f.engine.free(f.engine.allocate(4 * KiB + 512 * (i % 7), 0).ptr);
      });
    for (auto& th : threads) th.join();
  }
  if (f.engine.totals().thread_caches == 0) GPUMEM_SKIP("the engine's lock was never contended on this machine");
  void* p = f.alloc(24 * KiB);
  REQUIRE(f.engine.free(p) == FreeStatus::ok);
  REQUIRE(f.engine.totals().thread_cached_bytes >= 24 * KiB);  // the block waits in this thread's cache
  REQUIRE(f.engine.allocate_at(p, 24 * KiB, 24 * KiB) == FreeStatus::ok);
  CHECK(f.engine.totals().allocated_bytes == 24 * KiB);
  REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.check_invariants();
}

namespace {

Config fixed_pieces(RecycleWait wait = RecycleWait::fence) {
  Config c = test_config();
  c.pieces = PieceSizing::fixed;  // 20 MiB pieces
  c.recycle_wait = wait;
  return c;
}

// A (60 MiB, pieces at slots 0-2) freed behind a live block; X (80 MiB) fits no free block, grows
// at the region's end and moves A's three pieces, which stay mapped where they were.
struct KeptThree {
  void* a = nullptr;
  void* live = nullptr;
  void* x = nullptr;
};

KeptThree kept_three(Fixture& f) {
  KeptThree k;
  k.a = f.alloc(60 * MiB);
  k.live = f.alloc(20 * MiB);
  REQUIRE(f.engine.free(k.a) == FreeStatus::ok);
  k.x = f.alloc(80 * MiB);
  REQUIRE(f.engine.totals().kept_mappings == 3);
  return k;
}

// Frees the blocks, empties the cache: nothing stays mapped.
void give_back(Fixture& f, std::initializer_list<void*> blocks) {
  for (void* p : blocks) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.empty_cache();
  CHECK(f.source.mapped_bytes() == 0);
  f.engine.check_invariants();
}

}  // namespace

TEST_CASE("kept mappings: a move on its own stream synchronizes nothing; unmapping and changing stream do",
          "[engine][recycle][kept_mappings]") {
  const bool fence = GENERATE(true, false);
  Fixture f(fixed_pieces(fence ? RecycleWait::fence : RecycleWait::sync));
  // X's moves kept their old mappings: nothing to wait for on their stream.
  const KeptThree k = kept_three(f);
  void* const a = k.a;
  CHECK(f.source.counters().unmaps == 0);
  CHECK(f.events.stream_syncs == 0);
  CHECK(f.events.syncs == 0);
  // 60 MiB more lands where A was: its kept mappings are unmapped first, after the work before
  // their marker (recycle_wait:fence: a wait for that marker) or the stream's work (sync).
  void* y = f.alloc(60 * MiB);
  CHECK(y == a);
  CHECK(f.source.counters().unmaps == 3);
  CHECK(f.events.stream_syncs == (fence ? 0 : 1));
  CHECK(f.events.syncs == (fence ? 1 : 0));
  // A request on stream 1 takes stream 0's free pieces: their last uses must be done first (with
  // fences: no fence shows them idle, and creating instead would pass the most memory ever in use,
  // so growth falls back to the synchronization).
  REQUIRE(f.engine.free(y) == FreeStatus::ok);
  const int syncs = f.events.stream_syncs.load();
  void* z = f.alloc(60 * MiB, 1);
  CHECK(f.engine.totals().kept_mappings > 0);  // some of them moved (and kept their mappings)
  CHECK(f.events.stream_syncs == syncs + 1);
  give_back(f, {k.x, z, k.live});
}

TEST_CASE("capturing: growth lands where no kept mapping is in the way (unmapping one would wait)",
          "[engine][capture][kept_mappings]") {
  Fixture f(fixed_pieces());
  const KeptThree k = kept_three(f);
  f.engine.set_capturing(true);
  f.events.forbidden = true;
  const int syncs = f.events.stream_syncs.load();
  // Outside a capture 60 MiB would land where A was, over its kept mappings (the case above).
  void* y = f.alloc(60 * MiB);
  CHECK(y != k.a);
  CHECK(f.events.violations == 0);
  CHECK(f.events.stream_syncs == syncs);
  CHECK(f.engine.totals().kept_mappings == 3);
  f.events.forbidden = false;
  f.engine.set_capturing(false);
  give_back(f, {k.x, y, k.live});
}

TEST_CASE("kept mappings: unmapping one waits for its stream only while its marker is outstanding",
          "[engine][recycle][kept_mappings]") {
  const bool fence = GENERATE(true, false);
  Fixture f(fixed_pieces(fence ? RecycleWait::fence : RecycleWait::sync));
  auto waits = [&] { return f.events.stream_syncs.load() + f.events.syncs.load(); };
  // Rounds of ever longer blocks, each followed by a live block and then freed: growth moves the
  // freed pieces, keeps their old mappings, lands on kept mappings and passes the footprint.
  std::vector<void*> pins;
  auto round = [&](int k) {
    void* b = f.alloc((40 + 20 * static_cast<std::size_t>(k % 6)) * MiB);
    pins.push_back(f.alloc(20 * MiB));
    REQUIRE(f.engine.free(b) == FreeStatus::ok);
    const EngineTotals t = f.engine.totals();
    CHECK(t.kept_mapping_bytes <= t.reserved_bytes);
    CHECK(f.source.mapped_bytes() == f.source.physical_bytes() + t.kept_mapping_bytes);
  };
  // Markers outstanding (ManualStreamEvents): every kept mapping unmapped waits for the stream
  // (recycle_wait:sync) or for its marker (fence).
  for (int k = 0; k < 6; ++k) round(k);
  CHECK(f.source.counters().unmaps > 0);
  CHECK(waits() > 0);
  if (fence) CHECK(f.events.syncs > 0);
  // Every marker complete before each growth: kept mappings go without any wait.
  const auto unmaps = f.source.counters().unmaps;
  const int syncs = waits();
  for (int k = 6; k < 14; ++k) {
    f.events.inner.complete_all();
    round(k);
  }
  CHECK(f.source.counters().unmaps > unmaps);
  CHECK(waits() == syncs);
  for (void* p : pins) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  give_back(f, {});
  CHECK(f.events.inner.outstanding() == 0);  // every marker released
}
