// Note [Engine locking]: growth, empty_cache and the OOM retry call the driver and synchronize
// streams without the engine's lock. Each test holds one thread inside a slow call (a gate in the
// source or the stream events) and checks that another thread allocates, frees, reads totals and
// snapshots and checks invariants meanwhile (a bounded wait: the engine that held its lock there
// fails the check instead of hanging), and that what the first thread had claimed was not touched.
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/host_vmm_source.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/alloc/sim_source.h"
#include "event_recorder.h"
#include "slow_source.h"

using namespace gpumem::alloc;
using gpumem::alloc::test::SlowEvents;
using gpumem::alloc::test::SlowSource;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr auto kOverlapWait = 5s;  // far longer than any engine call here takes

Config locking_config() {
  Config c;
  c.check_invariants = true;   // every engine call checks, also while another has claims
  c.thread_cache = false;      // every call goes through the engine's lock
  c.arenas = 1;                // one engine, whatever the threads do (arenas:auto would move them)
  c.va_reserve_bytes = 1024 * MiB;
  c.pieces = PieceSizing::fixed;  // the cases count PyTorch's 20 MiB pages
  return c;
}

struct Recorder final : gpumem::alloc::test::EventRecorder {
  // Reserved bytes as an observer can follow them: pieces created minus pieces destroyed.
  std::size_t reserved_bytes(std::size_t piece_bytes) {
    std::lock_guard lock(mutex);
    std::size_t r = 0;
    for (const auto& e : events) {
      if (e.kind == EventKind::segment_map) r += e.pieces_created_or_destroyed * piece_bytes;
      if (e.kind == EventKind::segment_unmap) r -= e.pieces_created_or_destroyed * piece_bytes;
    }
    return r;
  }
};

// Runs fn on another thread; true if it finished within kOverlapWait. release() opens what the
// blocked thread waits at (called in every case, so nothing hangs), then the result is collected.
template <class Fn, class Release>
bool runs_meanwhile(Fn fn, Release release) {
  auto f = std::async(std::launch::async, fn);
  const bool in_time = f.wait_for(kOverlapWait) == std::future_status::ready;
  release();
  CHECK(f.get());
  return in_time;
}

// What another thread does while the engine's lock should be free.
bool busy_elsewhere(CachingAllocator& engine, std::size_t size, StreamId stream) {
  auto r = engine.allocate(size, stream);
  if (!r.ok()) return false;
  engine.check_invariants();
  (void)engine.totals();
  const EngineSnapshot snap = engine.snapshot();
  for (const auto& seg : snap.segments)
    for (const auto& b : seg.blocks)
      if (b.state == BlockState::claimed || b.state == BlockState::cached) return false;  // views never show them
  return engine.free(r.ptr) == FreeStatus::ok;
}

}  // namespace

// A grower waits in the source's create (the driver, on a GPU) while another thread allocates and
// frees: the other thread must not wait for the grower.
static void another_thread_runs_while_a_grower_waits(const Config& c) {
  SimSource sim;
  SlowSource slow(sim, 0us);
  auto events = make_immediate_events();
  CachingAllocator engine(slow, *events, c);
  engine.free(engine.allocate(MiB, 0).ptr);  // a small-pool piece with free memory in it
  if (c.step_plan) {
    REQUIRE(engine.step_plan_counters().has_value());
    REQUIRE_FALSE(engine.step_plan_counters()->stopped);
    REQUIRE_FALSE(engine.step_plan_counters()->dormant);  // awake: every call goes through its lock
  }

  slow.gate(SlowSource::Op::create).close();
  auto grower = std::async(std::launch::async, [&] { return engine.allocate(100 * MiB, 0); });
  REQUIRE(slow.gate(SlowSource::Op::create).wait_for_waiters(1));
  CHECK(runs_meanwhile([&] { return busy_elsewhere(engine, 512 * KiB, 0); },
                       [&] { slow.gate(SlowSource::Op::create).open(); }));
  const AllocResult r = grower.get();
  REQUIRE(r.ok());
  REQUIRE(engine.free(r.ptr) == FreeStatus::ok);
  engine.check_invariants();
  engine.empty_cache();
  CHECK(sim.physical_bytes() == 0);
}

TEST_CASE("locking: another thread allocates and frees while a grower waits in the source's create",
          "[engine][locking]") {
  Config c = locking_config();
  c.step_plan = false;  // the engine alone
  another_thread_runs_while_a_grower_waits(c);
}

TEST_CASE("locking: with the step planner awake, another thread allocates while a grower waits in the driver",
          "[engine][locking][step_plan]") {
  // The planner (on by default) holds its lock only around its own work, not across the engine's
  // call: a request the plan does not place goes to the engine, whose growth calls the driver.
  Config c = locking_config();
  c.step_plan = true;
  c.step_plan_layout_thread = false;
  another_thread_runs_while_a_grower_waits(c);
}

TEST_CASE("locking: empty_cache synchronizes streams without the engine lock", "[engine][locking]") {
  SimSource sim;
  auto immediate = make_immediate_events();
  SlowEvents events(*immediate, 0us);
  CachingAllocator engine(sim, events, locking_config());
  void* a = engine.allocate(512 * KiB, 0).ptr;
  void* b = engine.allocate(512 * KiB, 0).ptr;  // same 2 MiB piece as a
  REQUIRE(engine.free(b) == FreeStatus::ok);     // free memory that is not a whole piece
  void* big = engine.allocate(40 * MiB, 0).ptr;
  REQUIRE(engine.free(big) == FreeStatus::ok);   // two whole free pieces: empty_cache takes them
  REQUIRE(engine.totals().reserved_bytes == 42 * MiB);

  events.sync_gate().close();
  auto emptier = std::async(std::launch::async, [&] { engine.empty_cache(); });
  REQUIRE(events.sync_gate().wait_for_waiters(1));
  CHECK(runs_meanwhile([&] { return busy_elsewhere(engine, 512 * KiB, 0); }, [&] { events.sync_gate().open(); }));
  emptier.get();
  CHECK(engine.totals().reserved_bytes == 2 * MiB);
  CHECK(sim.physical_bytes() == 2 * MiB);
  REQUIRE(engine.free(a) == FreeStatus::ok);
  engine.empty_cache();
  CHECK(sim.physical_bytes() == 0);
  CHECK(engine.totals().va_reserved_bytes == 0);
}

TEST_CASE("locking: the OOM retry releases cached memory without the engine lock", "[engine][locking][oom]") {
  SimSource sim;
  auto immediate = make_immediate_events();
  SlowEvents events(*immediate, 0us);
  Config c = locking_config();
  c.recycle = false;  // the cap, not recycling, decides: growth fails, the retry releases
  CachingAllocator engine(sim, events, c);
  engine.set_memory_limit(100 * MiB);
  void* keep = engine.allocate(512 * KiB, 0).ptr;
  void* other_stream = engine.allocate(40 * MiB, 1).ptr;
  REQUIRE(engine.free(other_stream) == FreeStatus::ok);  // 40 MiB cached on stream 1

  events.sync_gate().close();
  // 80 MiB on stream 0: 42 + 80 > 100, so growth fails, release_cached frees stream 1's pieces
  // (synchronizing stream 1 at the gate), and the second growth fits.
  auto grower = std::async(std::launch::async, [&] { return engine.allocate(80 * MiB, 0); });
  REQUIRE(events.sync_gate().wait_for_waiters(1));
  CHECK(runs_meanwhile([&] { return busy_elsewhere(engine, 256 * KiB, 0); }, [&] { events.sync_gate().open(); }));
  const AllocResult r = grower.get();
  REQUIRE(r.ok());
  CHECK(engine.totals().reserved_bytes == 82 * MiB);
  REQUIRE(engine.free(r.ptr) == FreeStatus::ok);
  REQUIRE(engine.free(keep) == FreeStatus::ok);
  engine.empty_cache();
  CHECK(sim.physical_bytes() == 0);
}

TEST_CASE("locking: a second grower waits, then uses what the first one grew", "[engine][locking]") {
  SimSource sim;
  SlowSource slow(sim, 0us);
  auto events = make_immediate_events();
  CachingAllocator engine(slow, *events, locking_config());
  slow.gate(SlowSource::Op::create).close();
  auto first = std::async(std::launch::async, [&] { return engine.allocate(30 * MiB, 0); });  // 2 pieces
  REQUIRE(slow.gate(SlowSource::Op::create).wait_for_waiters(1));
  auto second = std::async(std::launch::async, [&] { return engine.allocate(5 * MiB, 0); });
  CHECK(second.wait_for(100ms) == std::future_status::timeout);  // it waits for the first
  slow.gate(SlowSource::Op::create).open();
  const AllocResult a = first.get(), b = second.get();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(sim.counters().creates == 2);  // the second took the first one's 10 MiB rest
  CHECK(reinterpret_cast<std::uintptr_t>(b.ptr) == reinterpret_cast<std::uintptr_t>(a.ptr) + 30 * MiB);
  REQUIRE(engine.free(a.ptr) == FreeStatus::ok);
  REQUIRE(engine.free(b.ptr) == FreeStatus::ok);
}

TEST_CASE("locking: frees and allocations next to a growth's claim leave it alone", "[engine][locking]") {
  HostVmmSourceOptions options;
  options.capacity_bytes = 512 * MiB;
  HostVmmSource host(options);
  REQUIRE(host.init_status() == SourceStatus::ok);
  SlowSource slow(host, 0us);
  auto events = make_immediate_events();
  CachingAllocator engine(slow, *events, locking_config());
  auto* a = static_cast<unsigned char*>(engine.allocate(10 * MiB, 0).ptr);
  auto* b = static_cast<unsigned char*>(engine.allocate(10 * MiB, 0).ptr);  // a and b fill piece 0
  REQUIRE(b == a + 10 * MiB);
  std::memset(a, 0xa1, 10 * MiB);
  REQUIRE(engine.free(b) == FreeStatus::ok);  // the hole starts at b: free 10 MiB, then unmapped

  // 30 MiB lands at b's address: it claims b's free 10 MiB and the next (unmapped) piece, and
  // creates one piece (held at the gate).
  slow.gate(SlowSource::Op::create).close();
  auto grower = std::async(std::launch::async, [&] { return engine.allocate(30 * MiB, 0); });
  REQUIRE(slow.gate(SlowSource::Op::create).wait_for_waiters(1));
  unsigned char* again = nullptr;
  CHECK(runs_meanwhile(
      [&] {
        // Freeing a, the claimed neighbour must not merge; allocating 10 MiB must get a's
        // memory back, not the claimed range.
        if (engine.free(a) != FreeStatus::ok) return false;
        auto r = engine.allocate(10 * MiB, 0);
        again = static_cast<unsigned char*>(r.ptr);
        if (!r.ok()) return false;
        std::memset(again, 0xb2, 10 * MiB);
        engine.check_invariants();
        return true;
      },
      [&] { slow.gate(SlowSource::Op::create).open(); }));
  const AllocResult g = grower.get();
  REQUIRE(g.ok());
  CHECK(again == a);
  CHECK(g.ptr == b);
  std::memset(g.ptr, 0xc3, 30 * MiB);
  CHECK(again[0] == 0xb2);
  CHECK(again[10 * MiB - 1] == 0xb2);
  REQUIRE(engine.free(g.ptr) == FreeStatus::ok);
  REQUIRE(engine.free(again) == FreeStatus::ok);
  engine.empty_cache();
  CHECK(host.physical_bytes() == 0);
}

TEST_CASE("locking: a growth that fails after moving pieces rolls back, leaks nothing, and says so in events",
          "[engine][locking][faults]") {
  SimSource sim;
  SlowSource slow(sim, 0us);
  auto events = make_immediate_events();
  Config c = locking_config();
  CachingAllocator engine(slow, *events, c);
  auto rec = std::make_shared<Recorder>();
  engine.attach_observer(rec);
  void* x = engine.allocate(40 * MiB, 1).ptr;
  REQUIRE(engine.free(x) == FreeStatus::ok);  // 2 whole pieces on stream 1: recyclable

  // 60 MiB on stream 0: 3 pieces, 2 recycled from stream 1 and 1 created. The first map fails.
  slow.gate(SlowSource::Op::map).close();
  slow.fail_next(SlowSource::Op::map);
  auto grower = std::async(std::launch::async, [&] { return engine.allocate(60 * MiB, 0); });
  REQUIRE(slow.gate(SlowSource::Op::map).wait_for_waiters(1));
  CHECK(runs_meanwhile(
      [&] {
        // Mid-growth: the recycled pieces are claimed (unmapped at the source already).
        engine.check_invariants();
        const EngineTotals t = engine.totals();
        return t.reserved_bytes == 40 * MiB && t.cached_free_bytes == 0;
      },
      [&] { slow.gate(SlowSource::Op::map).open(); }));
  // The failed growth destroyed all three pieces; the retry releases and grows again.
  const AllocResult r = grower.get();
  REQUIRE(r.ok());
  engine.check_invariants();
  const EngineTotals t = engine.totals();
  CHECK(t.reserved_bytes == 60 * MiB);
  CHECK(sim.physical_bytes() == t.reserved_bytes);
  CHECK(rec->reserved_bytes(20 * MiB) == t.reserved_bytes);
  REQUIRE(engine.free(r.ptr) == FreeStatus::ok);
  engine.empty_cache();
  CHECK(sim.physical_bytes() == 0);
  CHECK(rec->reserved_bytes(20 * MiB) == 0);
}

TEST_CASE("locking: empty_cache waits for pending frees without the lock, and completes each once",
          "[engine][locking][streams]") {
  SimSource sim;
  ManualStreamEvents manual;
  SlowEvents events(manual, 0us);
  CachingAllocator engine(sim, events, locking_config());
  void* p = engine.allocate(4 * MiB, 0).ptr;
  REQUIRE(engine.record_stream(p, 7) == FreeStatus::ok);
  REQUIRE(engine.free(p) == FreeStatus::ok);  // pending: stream 7's marker has not completed
  REQUIRE(manual.outstanding() == 1);

  events.sync_gate().close();
  auto emptier = std::async(std::launch::async, [&] { engine.empty_cache(); });
  REQUIRE(events.sync_gate().wait_for_waiters(1));
  CHECK(runs_meanwhile(
      [&] {
        // The pending free is the waiter's now: a second free of it is still a double free, and
        // allocations (which complete pending frees whose markers are done) leave it alone.
        if (engine.free(p) != FreeStatus::double_free) return false;
        return busy_elsewhere(engine, 2 * MiB, 0);
      },
      [&] { events.sync_gate().open(); }));
  emptier.get();
  CHECK(manual.outstanding() == 0);  // released exactly once (a second query would abort)
  CHECK(engine.totals().active_bytes == 0);
  CHECK(sim.physical_bytes() == 0);
}
