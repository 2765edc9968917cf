// Arenas (Config::arenas > 1; allocator/src/arenas.h): several engines behind one CachingAllocator.
// Threads move to arenas of their own when they fight over the lock (or, here, when a test moves
// them); a pointer goes back to the arena that allocated it from any thread; one cap and one event
// sequence hold for the device; a request one arena cannot serve is retried after the others
// release their cached memory.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "arenas.h"
#include "catch.h"
#include "engine.h"
#include "event_recorder.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/alloc/stats.h"

using namespace gpumem::alloc;
using gpumem::alloc::detail::Arenas;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

Config arena_config(unsigned n) {
  Config c;
  c.arenas = n;
  c.check_invariants = true;
  c.va_reserve_bytes = 1024 * MiB;
  return c;
}

// An engine with arenas on a simulated device.
struct ArenaEngine {
  explicit ArenaEngine(Config c) : engine(source, events, c), set(*Arenas::of(engine)) {}
  SimSource source;
  ManualStreamEvents events;
  CachingAllocator engine;
  Arenas& set;
};

// Live allocations, from a snapshot.
std::size_t live_count(CachingAllocator& engine) {
  std::size_t n = 0;
  for (const SegmentView& s : engine.snapshot().segments)
    for (const BlockView& b : s.blocks) n += b.state == BlockState::allocated;
  return n;
}

// Runs fn on a thread of its own and waits for it (a thread that starts in the first arena).
template <class Fn>
void on_other_thread(Fn&& fn) {
  std::thread t(std::forward<Fn>(fn));
  t.join();
}

// Allocates `bytes` from a thread of its own (one that stays in the first arena); the pointer.
void* allocate_on_other_thread(CachingAllocator& engine, std::size_t bytes) {
  void* p = nullptr;
  on_other_thread([&] {
    AllocResult r = engine.allocate(bytes, 0);
    REQUIRE(r.ok());
    p = r.ptr;
  });
  return p;
}

}  // namespace

TEST_CASE("arenas: one thread stays in the first arena and gets what one engine gives", "[arenas]") {
  SimSource plain_source, arena_source;
  ManualStreamEvents plain_events, arena_events;
  Config one = arena_config(1);
  CachingAllocator plain(plain_source, plain_events, one);
  CachingAllocator arenas(arena_source, arena_events, arena_config(4));
  REQUIRE(Arenas::of(plain) == nullptr);
  REQUIRE(Arenas::of(arenas) != nullptr);
  CHECK(arenas.config().arenas == 4);

  // The same sequence on both: sizes from 512 B to 48 MiB, a window of 16 live.
  std::vector<void*> live_plain, live_arenas;
  std::size_t size = 512;
  for (int i = 0; i < 400; ++i) {
    size = size * 7 % (48 * MiB) + 512;
    AllocResult a = plain.allocate(size, 0), b = arenas.allocate(size, 0);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a.size_bytes == b.size_bytes);
    live_plain.push_back(a.ptr);
    live_arenas.push_back(b.ptr);
    if (live_plain.size() > 16) {
      CHECK(plain.free(live_plain.front()) == FreeStatus::ok);
      CHECK(arenas.free(live_arenas.front()) == FreeStatus::ok);
      live_plain.erase(live_plain.begin());
      live_arenas.erase(live_arenas.begin());
    }
  }
  const EngineTotals tp = plain.totals(), ta = arenas.totals();
  CHECK(ta.arenas == 1);
  CHECK(tp.arenas == 1);
  CHECK(ta.allocated_bytes == tp.allocated_bytes);
  CHECK(ta.reserved_bytes == tp.reserved_bytes);
  CHECK(arena_source.peak_physical_bytes() == plain_source.peak_physical_bytes());
  CHECK(arena_source.counters().maps == plain_source.counters().maps);
  CHECK_FALSE(arenas.thread_caches_on());
  for (void* p : live_arenas) CHECK(arenas.free(p) == FreeStatus::ok);
  arenas.check_invariants();
}

TEST_CASE("arenas: a pointer goes back to the arena that allocated it, from any thread", "[arenas]") {
  ArenaEngine a(arena_config(2));
  auto& [source, events, engine, set] = a;

  // This thread moves to arena 1; another thread allocates in arena 0.
  REQUIRE(set.move_this_thread());
  CHECK(set.arena_of_this_thread() == 1);
  // Arena 0 has no thread now: a second move goes there rather than making a third (arenas:2
  // would not allow one anyway), and a third comes back.
  REQUIRE(set.move_this_thread());
  CHECK(set.arena_of_this_thread() == 0);
  REQUIRE(set.move_this_thread());
  CHECK(set.arena_of_this_thread() == 1);
  CHECK(set.count() == 2);
  AllocResult mine = engine.allocate(3 * MiB, 0);
  REQUIRE(mine.ok());
  AllocResult theirs;
  on_other_thread([&] {
    CHECK(set.arena_of_this_thread() == 0);
    theirs = engine.allocate(5 * MiB, 0);
  });
  REQUIRE(theirs.ok());
  CHECK(engine.totals().arenas == 2);
  CHECK(engine.totals().allocated_bytes == mine.size_bytes + theirs.size_bytes);

  // Lookup and record_stream find the other arena's block; errors name what is wrong.
  auto found = engine.lookup(theirs.ptr);
  REQUIRE(found.has_value());
  CHECK(found->block_size_bytes == theirs.size_bytes);
  CHECK(engine.record_stream(theirs.ptr, 0) == FreeStatus::ok);
  char* inside = static_cast<char*>(theirs.ptr) + 4096;
  CHECK(engine.free(inside) == FreeStatus::interior_pointer);
  int on_stack = 0;
  CHECK(engine.free(&on_stack) == FreeStatus::foreign_pointer);
  CHECK_FALSE(engine.lookup(&on_stack).has_value());
  CHECK(engine.free(nullptr) == FreeStatus::null_pointer);

  // This thread frees the other arena's block; the other thread frees this one's.
  CHECK(engine.free(theirs.ptr) == FreeStatus::ok);
  CHECK(engine.free(theirs.ptr) == FreeStatus::double_free);
  on_other_thread([&] { CHECK(engine.free(mine.ptr) == FreeStatus::ok); });
  CHECK(engine.totals().allocated_bytes == 0);
  engine.check_invariants();

  // A snapshot holds both arenas' segments, sorted by address, and totals that add up.
  const EngineSnapshot snap = engine.snapshot();
  CHECK(snap.totals.arenas == 2);
  CHECK(snap.settings.find("arenas:2") != std::string::npos);
  CHECK(snap.segments.size() >= 2);
  CHECK(std::is_sorted(snap.segments.begin(), snap.segments.end(),
                       [](const SegmentView& a, const SegmentView& b) { return a.base < b.base; }));
  std::size_t mapped = 0;
  for (const SegmentView& s : snap.segments) mapped += s.mapped_bytes;
  CHECK(mapped == snap.totals.reserved_bytes);
  CHECK(snap.totals.reserved_bytes == source.physical_bytes());

  engine.empty_cache();
  CHECK(engine.totals().reserved_bytes == 0);
  CHECK(source.physical_bytes() == 0);
}

// Pieces follow the device's footprint (the arenas' shared ledger), not the arena's own: a thread
// that moves to a new arena on a device holding gigabytes builds its first 64 MiB in the pieces of
// up to 8 MiB that one engine holding that memory would make, not in 2 MiB pieces (the footprint
// rule, footprint_pieces:512, on the new arena's nothing). Fewer pieces are fewer driver calls: each
// arena builds and recycles on its own, and on a GPU the calls cost 10-60 us and take turns.
TEST_CASE("arenas: a new arena's pieces follow the device's footprint", "[arenas]") {
  Config c = arena_config(2);
  c.va_reserve_bytes = 8192 * MiB;
  ArenaEngine a(c);
  std::vector<void*> held;
  for (int i = 0; i < 9; ++i) held.push_back(allocate_on_other_thread(a.engine, 512 * MiB));  // arena 0
  REQUIRE(a.set.move_this_thread());
  const std::uint64_t creates0 = a.source.counters().creates;
  AllocResult r = a.engine.allocate(64 * MiB, 0);
  REQUIRE(r.ok());
  const std::uint64_t arena_creates = a.source.counters().creates - creates0;

  // The same request on an engine of its own, with nothing else on its device: 2 MiB pieces.
  SimSource plain_source;
  ManualStreamEvents plain_events;
  CachingAllocator plain(plain_source, plain_events, arena_config(1));
  AllocResult q = plain.allocate(64 * MiB, 0);
  REQUIRE(q.ok());
  const std::uint64_t plain_creates = plain_source.counters().creates;
  CHECK(plain_creates == 32);
  CHECK(arena_creates <= 64 / 8 + 2);
  CHECK(a.engine.free(r.ptr) == FreeStatus::ok);
  CHECK(plain.free(q.ptr) == FreeStatus::ok);
  for (void* p : held) CHECK(a.engine.free(p) == FreeStatus::ok);
  a.engine.check_invariants();
}

TEST_CASE("arenas: one cap for the device, and an arena out of memory gets the others' cache", "[arenas]") {
  // On a virtual-memory source the arenas count the pieces they create; on one without, the
  // (backed) ranges they reserve: classic segments.
  SimSourceOptions o;
  o.virtual_memory = GENERATE(true, false);
  INFO("virtual memory: " << o.virtual_memory);
  SimSource source(o);
  ManualStreamEvents events;
  Config c = arena_config(2);
  c.memory_limit_bytes = 64 * MiB;
  c.expandable_segments = o.virtual_memory;
  CachingAllocator engine(source, events, c);
  Arenas& set = *Arenas::of(engine);
  CHECK(engine.totals().cap_bytes == 64 * MiB);

  // Arena 0 (another thread) holds 40 MiB, then frees it: cached there.
  void* first = allocate_on_other_thread(engine, 40 * MiB);
  REQUIRE(set.move_this_thread());
  // Arena 1 alone would be within the cap; the device is not: 40 + 40 > 64 while arena 0 holds its 40.
  AllocResult kept = engine.allocate(40 * MiB, 0);
  REQUIRE_FALSE(kept.ok());
  INFO(describe(*kept.oom));
  CHECK(kept.oom->detail.find("shared by its arenas") != std::string::npos);
  CHECK(kept.oom->detail.find("arena 1 of 2") != std::string::npos);
  CHECK(source.physical_bytes() <= 64 * MiB);

  // Once arena 0's block is free (cached), arena 1's request succeeds: arena 0 gives its cache back.
  on_other_thread([&] { CHECK(engine.free(first) == FreeStatus::ok); });
  AllocResult after = engine.allocate(40 * MiB, 0);
  REQUIRE(after.ok());
  CHECK(source.peak_physical_bytes() <= 64 * MiB);
  CHECK(engine.totals().reserved_bytes <= 64 * MiB);

  // A new limit reaches every arena and the shared cap.
  engine.set_memory_limit(32 * MiB);
  CHECK(engine.totals().cap_bytes == 32 * MiB);
  CHECK(engine.free(after.ptr) == FreeStatus::ok);
  engine.check_invariants();
}

// The provider itself out of memory (no cap set): the same retry after the other arenas release.
TEST_CASE("arenas: a device out of memory serves an arena from the others' cache", "[arenas]") {
  SimSourceOptions o;
  o.capacity_bytes = 64 * MiB;
  SimSource source(o);
  ManualStreamEvents events;
  CachingAllocator engine(source, events, arena_config(2));
  Arenas& set = *Arenas::of(engine);
  void* first = allocate_on_other_thread(engine, 48 * MiB);
  REQUIRE(set.move_this_thread());
  AllocResult refused = engine.allocate(48 * MiB, 0);
  REQUIRE_FALSE(refused.ok());
  INFO(describe(*refused.oom));
  CHECK_FALSE(refused.oom->cap_reached);
  CHECK(refused.oom->detail.find("arena 1 of 2") != std::string::npos);
  on_other_thread([&] { CHECK(engine.free(first) == FreeStatus::ok); });
  // Arena 0 still holds the 48 MiB it cached: the device has 16 MiB left. The retry gets them back.
  CHECK(engine.totals().reserved_bytes >= 48 * MiB);
  AllocResult served = engine.allocate(48 * MiB, 0);
  REQUIRE(served.ok());
  CHECK(source.peak_physical_bytes() <= 64 * MiB);
  CHECK(engine.free(served.ptr) == FreeStatus::ok);
  engine.check_invariants();
}

TEST_CASE("arenas: events of every arena carry one sequence; settings reach arenas made later", "[arenas]") {
  ArenaEngine a(arena_config(3));
  auto& [source, events, engine, set] = a;
  auto rec = std::make_shared<gpumem::alloc::test::EventRecorder>();
  engine.attach_observer(rec);
  engine.set_holding(true);

  std::vector<void*> ptrs;
  for (int i = 0; i < 5; ++i) ptrs.push_back(engine.allocate(MiB, 0).ptr);
  on_other_thread([&] {
    REQUIRE(set.move_this_thread());  // arena 1, made after the observer and holding were set
    CHECK(engine.holding());
    for (int i = 0; i < 5; ++i) ptrs.push_back(engine.allocate(2 * MiB, 0).ptr);
  });
  for (void* p : ptrs) CHECK(engine.free(p) == FreeStatus::ok);
  engine.empty_cache();  // holding: nothing goes back
  CHECK(engine.totals().reserved_bytes > 0);
  engine.set_holding(false);
  engine.empty_cache();
  CHECK(engine.totals().reserved_bytes == 0);

  std::lock_guard lock(rec->mutex);
  std::set<std::uint64_t> seqs;
  std::size_t allocs = 0;
  for (const AllocEvent& e : rec->events) {
    CHECK(e.seq != 0);
    seqs.insert(e.seq);
    allocs += e.kind == EventKind::alloc;
  }
  CHECK(allocs == 10);
  CHECK(seqs.size() == rec->events.size());  // no seq given twice
}

TEST_CASE("arenas: a thread that exits leaves its arena to the next thread that moves", "[arenas]") {
  ArenaEngine a(arena_config(3));
  auto& [source, events, engine, set] = a;
  AllocResult kept;
  on_other_thread([&] {
    REQUIRE(set.move_this_thread());
    CHECK(set.arena_of_this_thread() == 1);
    kept = engine.allocate(6 * MiB, 0);
  });
  REQUIRE(kept.ok());
  const std::size_t reserved = engine.totals().reserved_bytes;
  // That thread has exited: the next thread to move takes its arena (and the memory cached there),
  // not a third one.
  on_other_thread([&] {
    REQUIRE(set.move_this_thread());
    CHECK(set.arena_of_this_thread() == 1);
    CHECK(engine.free(kept.ptr) == FreeStatus::ok);
    AllocResult again = engine.allocate(6 * MiB, 0);  // from arena 1's cache: nothing new
    REQUIRE(again.ok());
    CHECK(again.ptr == kept.ptr);
    CHECK(engine.free(again.ptr) == FreeStatus::ok);
  });
  CHECK(set.count() == 2);
  CHECK(engine.totals().reserved_bytes == reserved);
  // With the other arenas in use and room for one more, a move makes it.
  on_other_thread([&] {
    REQUIRE(set.move_this_thread());  // arena 1 is free again: there
    CHECK(set.arena_of_this_thread() == 1);
    std::thread second([&] {
      REQUIRE(set.move_this_thread());  // from arena 0 (its own place), arena 1 in use: a new one
      CHECK(set.arena_of_this_thread() == 2);
      REQUIRE(set.move_this_thread());  // arena 0 has no thread now: there
      CHECK(set.arena_of_this_thread() == 0);
    });
    second.join();
  });
  CHECK(set.count() == 3);
  engine.check_invariants();
}

// What moves a thread: its own allocations' waits for its arena's lock, counted by note_wait (which
// the engine's contended path calls, with that lock held; here called directly, which it allows:
// it touches only the thread's place and the arenas' counters). Until a move is due, every call
// goes to the first arena inline (routing() off).
TEST_CASE("arenas: a thread's own waits make it due to move, and it moves at its next allocation", "[arenas]") {
  ArenaEngine a(arena_config(4));
  auto& [source, events, engine, set] = a;
  CHECK_FALSE(set.routing());
  void* first = engine.allocate(MiB, 0).ptr;  // inline, in the first arena; no place taken
  REQUIRE(first != nullptr);
  CHECK_FALSE(set.routing());
  CHECK(set.waits_counted() == 0);

  // A thread alone in its arena is not counted: its waits are not a fight.
  set.note_wait();
  CHECK(set.waits_counted() == 0);

  // Another thread with a place in the first arena (it waited once, and stays until told to exit).
  std::mutex m;
  std::condition_variable cv;
  bool placed = false, done = false;
  std::thread other([&] {
    set.note_wait();  // its place: two threads share the first arena now
    std::unique_lock lock(m);
    placed = true;
    cv.notify_all();
    cv.wait(lock, [&] { return done; });
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return placed; });
  }
  const std::uint64_t before = set.waits_counted();  // the other thread's wait: counted
  CHECK(before == 1);
  for (unsigned i = 1; i < Arenas::kMoveAfterContended; ++i) set.note_wait();
  CHECK(set.waits_counted() == before + Arenas::kMoveAfterContended - 1);
  CHECK_FALSE(set.routing());  // seven: not yet due
  set.note_wait();
  CHECK(set.routing());  // the eighth: due, but nothing has moved yet
  CHECK(set.count() == 1);
  CHECK(set.arena_of_this_thread() == 0);

  // The next allocation moves it, to a new arena, and is served there.
  AllocResult moved = engine.allocate(MiB, 0);
  REQUIRE(moved.ok());
  CHECK(set.count() == 2);
  CHECK(set.arena_of_this_thread() == 1);
  CHECK(set.routing());
  // Alone in its new arena, its waits are not counted.
  const std::uint64_t after_move = set.waits_counted();
  set.note_wait();
  CHECK(set.waits_counted() == after_move);
  // Frees go back to the arena that allocated, from any thread.
  CHECK(engine.free(first) == FreeStatus::ok);
  FreeStatus freed_elsewhere = FreeStatus::null_pointer;
  on_other_thread([&] { freed_elsewhere = engine.free(moved.ptr); });
  CHECK(freed_elsewhere == FreeStatus::ok);
  {
    std::lock_guard lock(m);
    done = true;
  }
  cv.notify_all();
  other.join();
  CHECK(engine.totals().allocated_bytes == 0);
  engine.check_invariants();
}

// A StatsObserver counts the first arena's events in place while it is alone (Note [Stats in
// place]); when a second arena is made it is unbound and takes every arena's events as events. Its
// numbers stay exact across the change.
TEST_CASE("arenas: the stats observer stays exact when a second arena is made", "[arenas]") {
  SimSource source;
  ManualStreamEvents events;
  const Config c = arena_config(2);
  CachingAllocator engine(source, events, c);
  Arenas& set = *Arenas::of(engine);
  auto stats = std::make_shared<StatsObserver>(c);
  engine.attach_observer(stats);
  auto check = [&] {
    const EngineTotals t = engine.totals();
    const DeviceStatsView v = stats->stats();
    CHECK(v.allocated_bytes[0].current == static_cast<std::int64_t>(t.allocated_bytes));
    CHECK(v.reserved_bytes[0].current == static_cast<std::int64_t>(t.reserved_bytes));
    CHECK(v.allocation[0].current == static_cast<std::int64_t>(live_count(engine)));
  };
  std::vector<void*> first;
  for (int i = 0; i < 6; ++i) first.push_back(engine.allocate((i + 1) * MiB, 0).ptr);
  CHECK(engine.free(first.back()) == FreeStatus::ok);
  first.pop_back();
  check();
  std::vector<void*> second;
  on_other_thread([&] {
    REQUIRE(set.move_this_thread());
    for (int i = 0; i < 6; ++i) second.push_back(engine.allocate((i + 3) * MiB, 0).ptr);
  });
  CHECK(set.count() == 2);
  check();
  const std::int64_t peak = stats->stats().allocated_bytes[0].peak;
  CHECK(peak == static_cast<std::int64_t>(engine.totals().allocated_bytes));
  for (void* p : first) CHECK(engine.free(p) == FreeStatus::ok);
  on_other_thread([&] {
    for (void* p : second) CHECK(engine.free(p) == FreeStatus::ok);
  });
  check();
  CHECK(stats->stats().allocated_bytes[0].current == 0);
  CHECK(stats->stats().allocated_bytes[0].peak == peak);
}

// The default, arenas:auto: arenas (up to kAutoArenas), caches off until a lock is contended, and
// the step planner (step_plan:True, the default) in front of them; step_plan:False the same arenas
// without it.
TEST_CASE("arenas: arenas:auto is arenas by default, the step planner in front of them", "[arenas]") {
  SimSource source;
  ManualStreamEvents events;
  CachingAllocator fresh(source, events, Config{});
  REQUIRE(Arenas::of(fresh) != nullptr);
  CHECK(fresh.config().arenas == kArenasAuto);
  CHECK(fresh.arenas() == 1);  // a thread moves only once it waits for the lock
  CHECK_FALSE(fresh.thread_caches_on());
  CHECK(fresh.step_plan_counters().has_value());
  // The planner is the arenas' one, not each arena's.
  CHECK_FALSE(Arenas::of(fresh)->first_arena().step_plan_counters().has_value());

  Config unplanned;
  unplanned.step_plan = false;
  CachingAllocator plain(source, events, unplanned);
  REQUIRE(Arenas::of(plain) != nullptr);
  CHECK(plain.config().arenas == kArenasAuto);
  CHECK(plain.arenas() == 1);
  CHECK_FALSE(plain.step_plan_counters().has_value());

  Config one;
  one.arenas = 1;
  CachingAllocator single(source, events, one);
  CHECK(Arenas::of(single) == nullptr);
  CHECK(single.step_plan_counters().has_value());  // one engine, the planner in front of it
  one.step_plan = false;
  CachingAllocator single_plain(source, events, one);
  CHECK_FALSE(single_plain.step_plan_counters().has_value());
}

// step_plan with arenas: while every thread allocates in the first arena, the planner lays the
// steps out there and places them with no source call, as with one engine; once a thread moves to
// an arena of its own, the planner stops at its next call, and every block stays where it was.
TEST_CASE("arenas: the step planner plans the first arena, and stops when a thread moves", "[arenas][step_plan]") {
  Config c = arena_config(4);
  c.step_plan = true;
  c.step_plan_layout_thread = false;
  c.thread_cache = false;
  ArenaEngine e(c);
  void* carried = nullptr;
  // One step (82 events; the first 81): layers kept and freed in reverse, a temporary per layer,
  // one block kept into the next step (freed at its start: the step's trough).
  auto step = [&] {
    std::vector<void*> addrs;
    auto alloc = [&](std::size_t bytes) {
      AllocResult r = e.engine.allocate(bytes, 0);
      REQUIRE(r.ok());
      addrs.push_back(r.ptr);
      return r.ptr;
    };
    if (carried != nullptr) REQUIRE(e.engine.free(carried) == FreeStatus::ok);
    std::vector<void*> kept;
    for (int layer = 0; layer < 20; ++layer) {
      kept.push_back(alloc(static_cast<std::size_t>(layer % 5 + 1) * 3 * MiB));
      REQUIRE(e.engine.free(alloc(static_cast<std::size_t>(layer % 3 + 1) * 700 * 1024)) == FreeStatus::ok);
    }
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) REQUIRE(e.engine.free(*it) == FreeStatus::ok);
    carried = alloc(3 * MiB);
    return addrs;
  };
  for (int s = 0; s < 6; ++s) step();
  auto c1 = e.engine.step_plan_counters();
  REQUIRE(c1);
  INFO(c1->last_fallback << " / " << c1->last_reason);
  CHECK(c1->plans == 1);
  CHECK(c1->served_allocations > 0);
  CHECK_FALSE(c1->stopped);
  const auto sim_calls = [&] {
    const SimSourceCounters k = e.source.counters();
    return k.reserves + k.creates + k.maps + k.unmaps + k.destroys + k.releases;
  };
  std::vector<void*> before = step();
  const auto calls_before = sim_calls();
  for (int s = 0; s < 3; ++s) {
    std::vector<void*> now = step();
    CHECK(now == before);
    before = now;
  }
  CHECK(sim_calls() == calls_before);
  CHECK(e.engine.step_plan_counters()->served_steps >= 3);
  CHECK(e.engine.arenas() == 1);

  // A thread moves to an arena of its own and allocates there.
  void* elsewhere = nullptr;
  on_other_thread([&] {
    REQUIRE(e.set.move_this_thread());
    AllocResult r = e.engine.allocate(5 * MiB, 0);
    REQUIRE(r.ok());
    elsewhere = r.ptr;
  });
  CHECK(e.engine.arenas() == 2);
  step();
  const auto c2 = e.engine.step_plan_counters();
  INFO(c2->last_reason);
  CHECK(c2->stopped);
  CHECK_THAT(c2->last_reason, Catch::Matchers::Contains("moved to an arena of its own"));
  // The engine serves on: the blocks of planned steps and of the other arena free from any thread.
  for (int s = 0; s < 3; ++s) step();
  CHECK(e.engine.free(elsewhere) == FreeStatus::ok);
  CHECK(e.engine.free(carried) == FreeStatus::ok);
  CHECK(e.engine.totals().allocated_bytes == 0);
  e.engine.check_invariants();
}

// Threads that share an arena share its thread caches (they come on when its lock is contended, as
// in one engine); a thread that moves hands its cache in the arena it left back at once.
TEST_CASE("arenas: an arena's thread caches; a thread that moves hands its cache back", "[arenas][thread_cache]") {
  ArenaEngine e(arena_config(4));
  CachingAllocator::Impl& first = e.set.first_engine();
  CHECK_FALSE(e.engine.thread_caches_on());
  first.thread_caches.active.store(true);  // what the first contended acquisition of its lock does
  CHECK(e.engine.thread_caches_on());
  std::vector<void*> kept;
  for (int i = 0; i < 64; ++i) {
    AllocResult r = e.engine.allocate(4096 + 512 * static_cast<std::size_t>(i % 5), 0);
    REQUIRE(r.ok());
    if (i % 8 == 0)
      kept.push_back(r.ptr);
    else
      CHECK(e.engine.free(r.ptr) == FreeStatus::ok);
  }
  REQUIRE(first.thread_caches.find_for_this_thread() != nullptr);
  const EngineTotals before = e.engine.totals();
  CHECK(before.thread_caches == 1);
  CHECK(before.thread_cached_bytes > 0);  // the lease's free rest

  REQUIRE(e.set.move_this_thread());
  CHECK(e.set.arena_of_this_thread() == 1);
  CHECK(first.thread_caches.find_for_this_thread() == nullptr);
  const EngineTotals moved = e.engine.totals();
  CHECK(moved.thread_caches == 0);
  CHECK(moved.thread_cached_bytes == 0);
  CHECK(moved.allocated_bytes == before.allocated_bytes);  // the blocks kept live stay allocated

  // The new arena's caches are off until its own lock is contended: this thread takes its lock.
  AllocResult r = e.engine.allocate(4096, 0);
  REQUIRE(r.ok());
  CHECK(e.engine.lookup(r.ptr).has_value());
  CHECK(e.engine.totals().thread_caches == 0);
  kept.push_back(r.ptr);
  for (void* p : kept) CHECK(e.engine.free(p) == FreeStatus::ok);  // from either arena
  e.engine.check_invariants();
  CHECK(e.engine.totals().allocated_bytes == 0);
  e.engine.empty_cache();
  CHECK(e.engine.totals().reserved_bytes == 0);
}

// Holds `m`'s engine lock on a thread of its own while fn() runs on the calling thread, so that
// fn's first call to that engine finds the lock taken: the holder takes the lock, the caller says
// it is about to call fn, and the holder lets go 200 ms later (fn goes straight to the lock and
// waits there). How often the lock was found taken.
template <class Fn>
std::uint64_t with_engine_lock_held(CachingAllocator::Impl& m, Fn&& fn) {
  const std::uint64_t before = m.lock_contended.load();
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, calling = false;
  std::thread holder([&] {
    std::lock_guard engine_lock(m.mutex);
    {
      std::unique_lock lock(mu);
      held = true;
      cv.notify_all();
      cv.wait(lock, [&] { return calling; });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return held; });
    calling = true;
  }
  cv.notify_all();
  fn();
  holder.join();
  return m.lock_contended.load() - before;
}

// Caches in an arena only where they help (docs/notes/thread-caches.md): an allocation that waits
// for its arena's lock turns that arena's thread caches on only while its thread shares the arena
// and no move is open to it. A thread alone in its arena (its waits are other threads' frees of
// memory they allocated before they moved), a thread that can still move, and any free that waits
// leave them off: a thread that ends alone in its arena allocates there as one thread does.
TEST_CASE("arenas: thread caches come on only for threads that share an arena with nowhere to move",
          "[arenas][thread_cache]") {
  ArenaEngine a(arena_config(2));
  auto& [source, events, engine, set] = a;
  CachingAllocator::Impl& first = set.first_engine();
  CHECK_FALSE(set.note_wait());  // alone in the first arena (placed there now)

  // A second thread placed in the first arena stays there until told to exit; so does a third,
  // later. Each runs `work` when asked.
  struct Helper {
    std::mutex m;
    std::condition_variable cv;
    std::function<void()> work;
    bool stop = false;
    std::thread t;
    void start() {
      t = std::thread([this] {
        std::unique_lock lock(m);
        for (;;) {
          cv.wait(lock, [&] { return stop || work != nullptr; });
          if (work) {
            work();
            work = nullptr;
            cv.notify_all();
          }
          if (stop) return;
        }
      });
    }
    void run(std::function<void()> fn) {
      std::unique_lock lock(m);
      work = std::move(fn);
      cv.notify_all();
      cv.wait(lock, [&] { return work == nullptr; });
    }
    ~Helper() {
      {
        std::lock_guard lock(m);
        stop = true;
      }
      cv.notify_all();
      if (t.joinable()) t.join();
    }
  };
  Helper second, third;
  second.start();
  third.start();
  bool caches_wanted = true;
  second.run([&] { caches_wanted = set.note_wait(); });
  CHECK_FALSE(caches_wanted);  // shares the first arena, but a second arena can still be made
  CHECK_FALSE(set.note_wait());  // the same for this thread
  CHECK_FALSE(first.use_caches());

  // A free that waits never turns caches on in an arena.
  AllocResult kept = engine.allocate(MiB, 0);
  REQUIRE(kept.ok());
  const std::uint64_t free_waits =
      with_engine_lock_held(first, [&] { CHECK(engine.free(kept.ptr) == FreeStatus::ok); });
  CHECK_FALSE(first.use_caches());

  // An allocation that waits while a move is open to its thread: no caches (it will move).
  const std::uint64_t alloc_waits = with_engine_lock_held(first, [&] {
    AllocResult r = engine.allocate(MiB, 0);
    REQUIRE(r.ok());
    CHECK(engine.free(r.ptr) == FreeStatus::ok);
  });
  CHECK_FALSE(first.use_caches());

  // This thread moves to the second (and last) arena; the second thread is alone in the first.
  REQUIRE(set.move_this_thread());
  REQUIRE(set.arena_of_this_thread() == 1);
  CachingAllocator::Impl& own = set.engine_for_allocation();
  REQUIRE(&own != &first);
  // Alone in its arena, its waits leave caches off.
  const std::uint64_t alone_waits = with_engine_lock_held(own, [&] {
    AllocResult r = engine.allocate(MiB, 0);
    REQUIRE(r.ok());
    CHECK(engine.free(r.ptr) == FreeStatus::ok);
  });
  CHECK_FALSE(own.use_caches());

  // A third thread joins the second in the first arena: both arenas made, neither unused, and a
  // move would not even the load (one thread there, two here). Its waits turn the caches on.
  third.run([&] { caches_wanted = set.note_wait(); });
  CHECK(caches_wanted);
  std::uint64_t shared_waits = 0;
  third.run([&] {
    shared_waits = with_engine_lock_held(first, [&] {
      AllocResult r = engine.allocate(MiB, 0);
      REQUIRE(r.ok());
      CHECK(engine.free(r.ptr) == FreeStatus::ok);
    });
  });
  INFO("contended acquisitions: free " << free_waits << ", allocation " << alloc_waits << ", alone " << alone_waits
                                        << ", shared " << shared_waits);
  REQUIRE(free_waits >= 1);
  REQUIRE(alloc_waits >= 1);
  REQUIRE(alone_waits >= 1);
  REQUIRE(shared_waits >= 1);
  CHECK(first.use_caches());
  CHECK_FALSE(own.use_caches());
  CHECK(engine.thread_caches_on());
  engine.check_invariants();
  CHECK(engine.totals().allocated_bytes == 0);
}

// Threads that allocate at once: with the lock fought over, threads move to arenas of their own;
// every pointer is freed by the thread that allocated it or by another, and nothing is lost. With
// arenas:4 and with the default, arenas:auto, which allows as many.
TEST_CASE("arenas: threads that fight over the lock get arenas of their own", "[arenas]") {
  SimSource source;
  ManualStreamEvents events;
  Config c = arena_config(GENERATE(4u, kArenasAuto));
  INFO("arenas " << c.arenas << " (0: auto)");
  c.check_invariants = false;  // checked at the end; every call would serialize the threads
  CachingAllocator engine(source, events, c);
  const Arenas& set = *Arenas::of(engine);
  constexpr int kThreads = 4;
  constexpr int kOps = 40000;
  // On a busy machine the threads may seldom run at once: they go on (up to 10 s) until one moved.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::vector<void*>> handoff(kThreads);
  std::barrier start(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      std::vector<void*> live;
      std::size_t size = 512 * static_cast<std::size_t>(t + 1);
      for (int i = 0; i < kOps || (set.count() == 1 && std::chrono::steady_clock::now() < deadline); ++i) {
        size = size * 13 % (4 * MiB) + 512;
        AllocResult r = engine.allocate(size, 0);
        REQUIRE(r.ok());
        live.push_back(r.ptr);
        if (live.size() > 64) {
          CHECK(engine.free(live.front()) == FreeStatus::ok);
          live.erase(live.begin());
        }
      }
      handoff[static_cast<std::size_t>(t)] = std::move(live);
    });
  for (auto& th : pool) th.join();
  // The blocks left live are freed by another thread than the one that allocated them.
  for (int t = 0; t < kThreads; ++t)
    on_other_thread([&] {
      for (void* p : handoff[static_cast<std::size_t>(t)]) CHECK(engine.free(p) == FreeStatus::ok);
    });
  engine.check_invariants();
  const EngineTotals totals = engine.totals();
  CHECK(totals.allocated_bytes == 0);
  CHECK(totals.reserved_bytes == source.physical_bytes());
  CHECK(totals.arenas <= 4);
  // A thread moves at the allocation after the 8th of its allocations that waited for the lock
  // while it shared its arena, and the threads go on allocating until one has moved. Once the
  // waits counted against the threads reach 4 x 7 + 1, one of them reached 8 (and then moved);
  // fewer (one core, or threads that never overlapped) owe no move.
  const std::uint64_t waits = set.waits_counted();
  INFO("waits counted: " << waits << ", contended acquisitions: " << engine.lock_counts().contended);
  if (waits < kThreads * (Arenas::kMoveAfterContended - 1) + 1 && totals.arenas == 1)
    GPUMEM_SKIP("the threads seldom met in the engine's lock on this machine: no arena was owed");
  CHECK(totals.arenas >= 2);
}
