// recycle_wait:fence: StreamFences (stream_fences.h) alone, and the engine on SimSource with
// ManualStreamEvents deciding when the GPU is done: a piece whose memory fences do not show idle is
// not moved and nothing waits; once its fence completes it moves, still without a wait; past the cap
// (or the memory fence_may_create allows) growth falls back to synchronizing the stream. Kept
// mappings in the way wait for their own marker, not their stream.
#include <memory>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/alloc/stats.h"
#include "recycle_budget_policy.h"
#include "stream_fences.h"

using namespace gpumem::alloc;

namespace {

constexpr std::size_t MiB = 1024 * 1024;

// 20 MiB pieces (pieces:fixed), moves that unmap (recycle_keep_mappings:False: every move needs
// the piece idle), no thread cache (frees go straight to the engine), invariants checked.
Config fence_config(RecycleWait wait = RecycleWait::fence) {
  Config c;
  c.pieces = PieceSizing::fixed;
  c.recycle_keep_mappings = false;
  c.recycle_wait = wait;
  c.thread_cache = false;
  c.check_invariants = true;
  c.va_reserve_bytes = 1024 * MiB;
  return c;
}

struct Engine {
  explicit Engine(Config c) : engine(source, events, c) { engine.attach_observer(stats); }
  SimSource source;
  ManualStreamEvents events;
  CachingAllocator engine;
  std::shared_ptr<StatsObserver> stats = std::make_shared<StatsObserver>();

  void* alloc(std::size_t n) {
    auto r = engine.allocate(n, 0);
    REQUIRE(r.ok());
    return r.ptr;
  }
  void free(void* p) { REQUIRE(engine.free(p) == FreeStatus::ok); }
  // Raises the most memory ever in use to `bytes` and gives the memory back, so that growth may
  // create instead of waiting (policy::fence_may_create) up to that footprint.
  void raise_high_water(std::size_t bytes) {
    void* p = alloc(bytes);
    free(p);
    engine.empty_cache();
    REQUIRE(engine.totals().reserved_bytes == 0);
  }
};

}  // namespace

TEST_CASE("stream fences: a fence tells, once complete, that what was freed before it is idle", "[fences]") {
  ManualStreamEvents events;
  detail::StreamFences f;
  CHECK_FALSE(f.idle(7, 1));  // nothing known of a stream never fenced
  CHECK(f.cover(events, 7, /*free_tick=*/3, /*now=*/5));
  CHECK_FALSE(f.cover(events, 7, 4, 6));  // the outstanding fence (tick 5) covers tick 4
  CHECK(f.outstanding() == 1);
  f.poll(events);
  CHECK_FALSE(f.idle(7, 3));  // recorded, not complete
  CHECK(f.cover(events, 7, 6, 8));
  events.complete_stream(7);
  f.poll(events);
  CHECK(f.outstanding() == 0);
  CHECK(events.outstanding() == 0);  // every completed fence released once
  CHECK(f.idle(7, 8));
  CHECK_FALSE(f.idle(7, 9));
  CHECK_FALSE(f.idle(8, 1));  // streams are apart
  CHECK(events.synchronize_calls() == 0);
}

TEST_CASE("stream fences: at most kMaxOutstanding per stream; a synchronization makes everything before it idle",
          "[fences]") {
  ManualStreamEvents events;
  detail::StreamFences f;
  for (std::uint64_t t = 1; t <= detail::StreamFences::kMaxOutstanding; ++t) CHECK(f.cover(events, 1, t, t));
  CHECK_FALSE(f.cover(events, 1, 100, 100));
  CHECK(f.outstanding() == detail::StreamFences::kMaxOutstanding);
  f.synchronized(1, 50);
  CHECK(f.idle(1, 50));
  CHECK_FALSE(f.idle(1, 51));
  CHECK_FALSE(f.cover(events, 1, 40, 60));  // known idle already: nothing to record
  f.release_all(events);
  CHECK(events.outstanding() == 0);
}

TEST_CASE("fence_may_create: growth creates instead of waiting only within the most memory ever in use",
          "[fences][policy]") {
  CHECK(policy::fence_may_create(100 * MiB, 0, 10 * MiB));  // creating nothing always may
  CHECK(policy::fence_may_create(40 * MiB, 40 * MiB, 80 * MiB));
  CHECK_FALSE(policy::fence_may_create(40 * MiB, 41 * MiB, 80 * MiB));
}

TEST_CASE("recycle_wait:fence: a piece not known idle is not moved and nothing waits", "[engine][fences]") {
  Engine e(fence_config());
  e.raise_high_water(200 * MiB);
  const std::uint64_t syncs = e.events.synchronize_calls();  // empty_cache's
  void* a = e.alloc(20 * MiB);  // piece P0
  void* live = e.alloc(20 * MiB);  // P1
  e.free(a);  // P0 wholly free; its last uses may still be queued
  const SimSourceCounters before = e.source.counters();
  void* x = e.alloc(40 * MiB);  // no free block fits: growth
  // P0 is not moved (its stream has no completed fence after its free): two pieces are created.
  CHECK(e.source.counters().creates == before.creates + 2);
  CHECK(e.source.counters().unmaps == before.unmaps);
  CHECK(e.events.synchronize_calls() == syncs);
  CHECK(e.engine.totals().reserved_bytes == 80 * MiB);
  const DeviceStatsView s = e.stats->stats();
  CHECK(s.num_recycle_syncs == 0);
  CHECK(s.num_recycle_fence_skips == 1);
  CHECK(e.events.outstanding() == 1);  // the fence that covers P0's free

  SECTION("once its fence completes, it moves, still without a wait") {
    e.events.complete_all();
    const SimSourceCounters mid = e.source.counters();
    void* y = e.alloc(40 * MiB);  // P0 moves to the region's end, one piece is created
    CHECK(e.source.counters().unmaps == mid.unmaps + 1);
    CHECK(e.source.counters().creates == mid.creates + 1);
    CHECK(e.events.synchronize_calls() == syncs);
    CHECK(e.engine.totals().reserved_bytes == 100 * MiB);
    CHECK(e.stats->stats().num_recycle_syncs == 0);
    CHECK(e.events.outstanding() == 0);  // the completed fence was released
    e.free(y);
  }
  SECTION("recycle_wait:sync moves it at once, synchronizing its stream") {
    Engine s(fence_config(RecycleWait::sync));
    s.raise_high_water(200 * MiB);
    const std::uint64_t s_syncs = s.events.synchronize_calls();
    void* sa = s.alloc(20 * MiB);
    void* slive = s.alloc(20 * MiB);
    s.free(sa);
    void* sx = s.alloc(40 * MiB);
    CHECK(s.events.synchronize_calls() == s_syncs + 1);
    CHECK(s.engine.totals().reserved_bytes == 60 * MiB);
    CHECK(s.stats->stats().num_recycle_syncs == 1);
    CHECK(s.stats->stats().num_recycle_fence_skips == 0);
    s.free(sx);
    s.free(slive);
  }
  e.free(x);
  e.free(live);
  e.engine.check_invariants();
}

TEST_CASE("recycle_wait:fence: past the cap, growth falls back to the stream synchronization", "[engine][fences]") {
  Engine e(fence_config());
  e.raise_high_water(200 * MiB);
  const std::uint64_t syncs = e.events.synchronize_calls();
  e.engine.set_memory_limit(60 * MiB);
  void* a = e.alloc(20 * MiB);
  void* live = e.alloc(20 * MiB);
  e.free(a);
  // Creating two pieces would reserve 80 MiB: over the cap. The growth waits for P0's stream and
  // moves it (60 MiB).
  void* x = e.alloc(40 * MiB);
  CHECK(e.events.synchronize_calls() == syncs + 1);
  CHECK(e.engine.totals().reserved_bytes == 60 * MiB);
  CHECK(e.stats->stats().num_recycle_syncs == 1);
  e.free(x);
  e.free(live);
  e.engine.check_invariants();
}

TEST_CASE("recycle_wait:fence: beyond the most memory ever in use, growth waits instead of creating",
          "[engine][fences]") {
  Engine e(fence_config());  // no high water raised: creating would reserve more than ever in use
  void* a = e.alloc(20 * MiB);
  void* live = e.alloc(20 * MiB);
  e.free(a);
  void* x = e.alloc(40 * MiB);
  CHECK(e.events.synchronize_calls() == 1);
  CHECK(e.engine.totals().reserved_bytes == 60 * MiB);  // as recycle_wait:sync
  e.free(x);
  e.free(live);
  e.engine.check_invariants();
}

TEST_CASE("recycle_wait:fence: a kept mapping in the way waits for its own marker, not its stream",
          "[engine][fences][kept_mappings]") {
  Config c = fence_config();
  c.recycle_keep_mappings = true;
  Engine e(c);
  void* a = e.alloc(60 * MiB);  // P0 P1 P2 at slots 0-2
  void* live = e.alloc(20 * MiB);
  e.free(a);
  void* x = e.alloc(80 * MiB);  // P0 P1 P2 move to 4-6 (same stream: no wait), kept at 0-2
  CHECK(e.engine.totals().kept_mappings == 3);
  CHECK(e.events.synchronize_calls() == 0);
  // 60 MiB more with nothing free lands where A was: the kept mappings there are unmapped first,
  // after their marker (recorded when the pieces moved away) completes: one marker wait.
  void* y = e.alloc(60 * MiB);
  CHECK(y == a);
  CHECK(e.events.synchronize_calls() == 1);
  const DeviceStatsView s = e.stats->stats();
  CHECK(s.num_recycle_syncs == 0);
  CHECK(s.num_recycle_marker_waits == 1);
  CHECK(e.engine.totals().kept_mappings == 0);
  for (void* p : {x, y, live}) e.free(p);
  e.engine.empty_cache();
  CHECK(e.source.physical_bytes() == 0);
  e.engine.check_invariants();
}

TEST_CASE("recycle_wait:fence keeps the engine consistent under random requests", "[engine][fences]") {
  for (bool keep : {true, false}) {
    Config c = fence_config();
    c.recycle_keep_mappings = keep;
    c.pieces = PieceSizing::adaptive;
    Engine e(c);
    std::vector<void*> live;
    std::uint64_t state = 12345;
    auto next = [&] {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return state >> 33;
    };
    for (int i = 0; i < 2000; ++i) {
      if (live.empty() || next() % 3 != 0) {
        live.push_back(e.alloc((next() % 48 + 1) * MiB / 2));
      } else {
        const std::size_t k = next() % live.size();
        e.free(live[k]);
        live[k] = live.back();
        live.pop_back();
      }
      if (next() % 50 == 0) e.events.complete_all();  // the GPU catches up now and then
    }
    for (void* p : live) e.free(p);
    e.engine.empty_cache();
    CHECK(e.source.physical_bytes() == 0);
    e.engine.check_invariants();
  }
}
