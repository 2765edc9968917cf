// The engine's step planner (Config::step_plan; allocator/src/step_planning.h): a training loop on
// SimSource whose steps repeat is found, laid out in the engine's memory and placed there with no
// source call; planned blocks are the engine's (stats, lookup, invariants); a step that differs,
// a block whose reuse waits on another stream, and steps on two streams are left to the engine.
#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <memory>
#include <span>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/alloc/sim_source.h"

using namespace gpumem::alloc;
using Catch::Matchers::Contains;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

Config plan_config() {
  Config c;
  c.step_plan = true;
  c.step_plan_layout_thread = false;  // each plan at the event its step is found (one test below: the thread)
  c.check_invariants = true;
  c.thread_cache = false;
  c.va_reserve_bytes = 4096 * MiB;
  return c;
}

// An engine whose planner rests: 70,000 pairs whose sizes never repeat in order (140,000 calls,
// past the 131,072 that detection stays awake for), no invariant check after every call.
struct RestingEngine {
  SimSource source;
  ManualStreamEvents events;
  CachingAllocator engine{source, events, [] {
    Config c = plan_config();
    c.check_invariants = false;
    return c;
  }()};
  explicit RestingEngine(unsigned seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 70000; ++i) {
      void* p = engine.allocate(512 * (1 + rng() % 4096), 0).ptr;
      REQUIRE(engine.free(p) == FreeStatus::ok);
    }
    REQUIRE(engine.step_plan_counters()->dormant);
  }
};

std::uint64_t calls(const SimSource& s) {
  const SimSourceCounters c = s.counters();
  return c.reserves + c.releases + c.creates + c.destroys + c.maps + c.unmaps;
}

// The engine most cases use: step_plan on SimSource, invariants checked after every call.
struct PlanEngine {
  SimSource source;
  ManualStreamEvents events;
  CachingAllocator engine{source, events, plan_config()};
};

// One training step: activations kept for a "backward" and freed in reverse, temporaries freed at
// once, one block (the "gradient") kept into the next step and freed at its start. 121 events.
struct Loop {
  CachingAllocator& engine;
  StreamId stream = 0;
  void* carried = nullptr;
  std::vector<void*> addrs = {};  // this step's allocations, by index

  void step(std::size_t extra_bytes = 0) {
    addrs.clear();
    auto alloc = [&](std::size_t bytes) {
      const AllocResult r = engine.allocate(bytes, stream);
      REQUIRE(r.ptr != nullptr);
      addrs.push_back(r.ptr);
      return r.ptr;
    };
    // The gradient kept from the step before goes first (zero_grad), so at the step's start
    // nothing of the step is live: the plan's trough, where the arena is taken.
    if (carried != nullptr) REQUIRE(engine.free(carried) == FreeStatus::ok);
    std::vector<void*> kept;
    for (int layer = 0; layer < 20; ++layer) {
      kept.push_back(alloc((layer % 5 + 1) * 3 * MiB + (layer == 7 ? extra_bytes : 0)));
      void* tmp = alloc((layer % 3 + 1) * 700 * KiB);
      REQUIRE(engine.free(tmp) == FreeStatus::ok);
    }
    for (int layer = 19; layer >= 0; --layer) {
      void* grad = alloc((layer % 5 + 1) * 3 * MiB);
      REQUIRE(engine.free(kept[static_cast<std::size_t>(layer)]) == FreeStatus::ok);
      if (layer == 0) {
        carried = grad;
      } else {
        REQUIRE(engine.free(grad) == FreeStatus::ok);
      }
    }
  }
  // n steps, each after a mark_step().
  void marked_steps(int n) {
    for (int s = 0; s < n; ++s) {
      engine.mark_step();
      step();
    }
  }
};

}  // namespace

TEST_CASE_METHOD(PlanEngine, "engine step plan: repeating steps are placed in the engine's memory with no source call",
          "[step_plan][engine]") {
  Loop loop{engine};
  for (int s = 0; s < 6; ++s) loop.step();
  const auto c = engine.step_plan_counters();
  REQUIRE(c);
  INFO(c->last_fallback << " / " << c->last_reason << " / arena " << c->last_plan_arena_bytes << " for "
                        << c->last_plan_peak_live_bytes);
  CHECK(c->detected_steps == 1);
  CHECK(c->plans == 1);
  CHECK(c->fallbacks == 0);
  CHECK(c->served_allocations > 0);
  // Three more steps: every allocation at the address its index had the step before, none of
  // them a call to the source.
  std::vector<void*> before = loop.addrs;
  const std::uint64_t calls_before = calls(source);
  const std::size_t reserved_before = source.physical_bytes();
  for (int s = 0; s < 3; ++s) {
    loop.step();
    CHECK(loop.addrs == before);
    before = loop.addrs;
  }
  CHECK(calls(source) == calls_before);
  CHECK(source.physical_bytes() == reserved_before);
  CHECK(engine.step_plan_counters()->served_steps >= 3);
  // Planned blocks are ordinary blocks of the engine.
  const EngineTotals t = engine.totals();
  CHECK(t.allocated_bytes == 3 * MiB);  // the carried gradient of layer 0 (1 x 3 MiB)
  const auto found = engine.lookup(loop.carried);
  REQUIRE(found);
  engine.check_invariants();
}

namespace {

// The program's view from the events: allocations seen, bytes requested live and their peak.
struct Requests {
  std::uint64_t allocs = 0;
  std::size_t largest = 0;
  std::size_t live = 0, peak = 0;
};
struct RequestLedger final : AllocObserver, Requests {
  void on_events(std::span<const AllocEvent> events) override {
    for (const AllocEvent& e : events) {
      if (e.kind == EventKind::alloc) {
        ++allocs;
        largest = std::max(largest, e.requested_bytes);
        live += e.requested_bytes;
        peak = std::max(peak, live);
      } else if (e.kind == EventKind::free_completed) {
        live -= e.requested_bytes;
      }
    }
  }
};

}  // namespace

TEST_CASE("engine step plan: the arena is no allocation: events, counts and peaks are the program's",
          "[step_plan][engine]") {
  // The arena is taken as a free range of the engine's memory. Served as an allocation, it showed
  // in the event stream (a trace, a snapshot's history) and in PyTorch's requested and allocated
  // peaks as one request of the arena's size that the program never made.
  auto run = [](bool plan, Requests& seen) {
    SimSource source;
    ManualStreamEvents events;
    Config config = plan_config();
    config.step_plan = plan;
    CachingAllocator engine(source, events, config);
    auto observer = std::make_shared<RequestLedger>();
    engine.attach_observer(observer);
    Loop loop{engine};
    for (int s = 0; s < 10; ++s) loop.step();
    engine.detach_observer(observer.get());
    if (plan) {
      REQUIRE(engine.step_plan_counters()->arenas_mapped == 1);
      REQUIRE(engine.step_plan_counters()->served_steps >= 3);
    }
    seen = static_cast<const Requests&>(*observer);
  };
  Requests planned, unplanned;
  run(true, planned);
  run(false, unplanned);
  CHECK(planned.allocs == unplanned.allocs);
  CHECK(planned.largest == unplanned.largest);  // 15 MiB: no 100-odd MiB arena among them
  CHECK(planned.peak == unplanned.peak);
  CHECK(planned.live == unplanned.live);
}

TEST_CASE_METHOD(PlanEngine, "engine step plan: a step that differs goes to the engine, and the plan comes back", "[step_plan][engine]") {
  Loop loop{engine};
  for (int s = 0; s < 6; ++s) loop.step();
  REQUIRE(engine.step_plan_counters()->plans == 1);
  loop.step(512 * KiB);  // layer 7's activation is larger this once
  auto c = engine.step_plan_counters();
  CHECK(c->fallbacks == 1);
  CHECK_THAT(c->last_fallback, Contains("where the plan has"));
  engine.check_invariants();
  for (int s = 0; s < 6; ++s) loop.step();
  c = engine.step_plan_counters();
  CHECK(c->plans == 2);
  CHECK(c->fallbacks == 1);
  CHECK(c->served_steps >= 3);
}

TEST_CASE_METHOD(PlanEngine, "engine step plan: a planned block still in use on another stream is not reused early",
          "[step_plan][engine]") {
  Loop loop{engine};
  for (int s = 0; s < 6; ++s) loop.step();
  REQUIRE(engine.step_plan_counters()->served_steps >= 1);
  // The carried gradient is also used on stream 7: when the next step frees it (as planned), its
  // memory waits for stream 7, so the plan cannot place the blocks it gives that memory to. The
  // engine serves them elsewhere; no block shares bytes with the waiting one.
  const void* waiting = loop.carried;
  REQUIRE(engine.record_stream(loop.carried, 7) == FreeStatus::ok);
  loop.step();
  auto c = engine.step_plan_counters();
  CHECK(c->fallbacks == 1);
  CHECK_THAT(c->last_fallback, Contains("could not place the block at its planned address"));
  for (void* p : loop.addrs) CHECK(p != waiting);
  engine.check_invariants();
  events.complete_all();
  for (int s = 0; s < 6; ++s) loop.step();
  c = engine.step_plan_counters();
  CHECK(c->plans == 2);
  CHECK(c->fallbacks == 1);
}

TEST_CASE("engine step plan: marks replace detection; two streams and no step_plan are not planned",
          "[step_plan][engine]") {
  SimSource source;
  ManualStreamEvents events;
  {
    CachingAllocator engine(source, events, plan_config());
    Loop loop{engine};
    loop.marked_steps(5);
    const auto c = engine.step_plan_counters();
    CHECK(c->marks == 5);
    CHECK(c->detected_steps == 0);
    CHECK(c->plans == 1);
    CHECK(c->served_allocations > 0);
  }
  {
    CachingAllocator engine(source, events, plan_config());
    Loop main{engine, 0}, side{engine, 3};
    for (int s = 0; s < 6; ++s) {
      main.step();
      side.step();
    }
    const auto c = engine.step_plan_counters();
    CHECK(c->served_allocations == 0);
    CHECK_THAT(c->last_reason, Contains("more than one stream"));
  }
  Config off = plan_config();
  off.step_plan = false;
  CachingAllocator plain(source, events, off);
  CHECK_FALSE(plain.step_plan_counters());
  plain.mark_step();  // does nothing
}

TEST_CASE("engine step plan: random repeating programs keep the engine's invariants and never share bytes",
          "[step_plan][engine][property]") {
  std::uint64_t served = 0, plans = 0, fallbacks = 0;
  for (std::uint32_t seed = 1; seed <= 12; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    SimSource source;
    ManualStreamEvents events;
    CachingAllocator engine(source, events, plan_config());
    // The program's step: n allocations of random sizes, each freed some events later (or kept to
    // the next step's start).
    const int n = 40 + static_cast<int>(rng() % 40);
    std::vector<std::size_t> sizes(static_cast<std::size_t>(n));
    for (auto& s : sizes) s = (1 + rng() % 4096) * 2 * KiB;
    std::vector<int> lifetime(static_cast<std::size_t>(n));
    for (auto& l : lifetime) l = 1 + static_cast<int>(rng() % 12);
    std::map<std::uintptr_t, std::size_t> live;  // address -> size, every block the program holds
    auto check_no_overlap = [&] {
      std::uintptr_t end = 0;
      for (const auto& [a, s] : live) {
        REQUIRE(a >= end);
        end = a + s;
      }
    };
    std::vector<std::pair<void*, int>> pending;  // block, allocations left before its free
    for (int step = 0; step < 24; ++step) {
      const bool perturbed = rng() % 10 == 0;
      for (int j = 0; j < n; ++j) {
        std::size_t bytes = sizes[static_cast<std::size_t>(j)];
        if (perturbed && j == n / 2) bytes += 64 * KiB;
        const AllocResult r = engine.allocate(bytes, 0);
        REQUIRE(r.ptr != nullptr);
        const auto a = reinterpret_cast<std::uintptr_t>(r.ptr);
        REQUIRE(live.emplace(a, r.size_bytes).second);
        check_no_overlap();
        if (rng() % 50 == 0) REQUIRE(engine.record_stream(r.ptr, 5) == FreeStatus::ok);
        pending.emplace_back(r.ptr, lifetime[static_cast<std::size_t>(j)]);
        for (auto it = pending.begin(); it != pending.end();) {
          if (--it->second > 0) {
            ++it;
            continue;
          }
          live.erase(reinterpret_cast<std::uintptr_t>(it->first));
          REQUIRE(engine.free(it->first) == FreeStatus::ok);
          it = pending.erase(it);
        }
      }
      if (rng() % 4 == 0) events.complete_all();
    }
    for (auto& [p, left] : pending) REQUIRE(engine.free(p) == FreeStatus::ok);
    events.complete_all();
    engine.check_invariants();
    CHECK(engine.totals().allocated_bytes == 0);
    const auto c = engine.step_plan_counters();
    served += c->served_allocations;
    plans += c->plans;
    fallbacks += c->fallbacks;
  }
  // The programs repeat: plans were made, served, and some fell back at the perturbed steps.
  CHECK(plans > 0);
  CHECK(served > 0);
  CHECK(fallbacks > 0);
}

namespace {

// Observes OOM events: a plan must never make one for a request the program did not make.
struct OomCounter final : AllocObserver {
  int ooms = 0;
  void on_events(std::span<const AllocEvent> events) override {
    for (const AllocEvent& e : events) ooms += e.kind == EventKind::oom ? 1 : 0;
  }
};

}  // namespace

TEST_CASE_METHOD(PlanEngine, "engine step plan: a plan survives record_stream'd blocks whose stream work completed",
          "[step_plan][engine]") {
  // A tensor handed to a communication stream every step (DDP, FSDP): its free waits for the
  // stream's work, which completes before the next step. The plan places its memory again then.
  for (int s = 0; s < 16; ++s) {
    std::vector<void*> kept;
    for (int l = 0; l < 40; ++l) kept.push_back(engine.allocate(static_cast<std::size_t>(l % 5 + 1) * 3 * MiB, 0).ptr);
    REQUIRE(engine.record_stream(kept[0], 7) == FreeStatus::ok);
    for (void* p : kept) REQUIRE(engine.free(p) == FreeStatus::ok);
    events.complete_all();
  }
  const auto c = engine.step_plan_counters();
  INFO(c->last_fallback);
  CHECK(c->plans == 1);
  CHECK(c->fallbacks == 0);
  CHECK(c->served_steps >= 10);
  engine.check_invariants();
}

TEST_CASE_METHOD(PlanEngine, "engine step plan: planned blocks freed during a graph capture leave the plan", "[step_plan][engine]") {
  auto step = [&](bool free_them) {
    std::vector<void*> kept;
    for (int l = 0; l < 40; ++l) kept.push_back(engine.allocate(static_cast<std::size_t>(l % 5 + 1) * 3 * MiB, 0).ptr);
    if (free_them)
      for (auto it = kept.rbegin(); it != kept.rend(); ++it) REQUIRE(engine.free(*it) == FreeStatus::ok);
    return kept;
  };
  for (int s = 0; s < 6; ++s) step(true);
  REQUIRE(engine.step_plan_counters()->served_allocations > 0);
  // A step's planned blocks are freed while a capture is under way: allocations bypass the planner
  // then, frees do not, so the planner sees them go and goes on serving (it did not before:
  // it waited for them forever).
  std::vector<void*> live = step(false);
  engine.set_capturing(true);
  for (auto it = live.rbegin(); it != live.rend(); ++it) REQUIRE(engine.free(*it) == FreeStatus::ok);
  engine.set_capturing(false);
  const std::uint64_t served_before = engine.step_plan_counters()->served_steps;
  for (int s = 0; s < 10; ++s) step(true);
  const auto c = engine.step_plan_counters();
  CHECK(c->fallbacks == 0);
  CHECK(c->served_steps >= served_before + 9);
  engine.check_invariants();
}

TEST_CASE("engine step plan: no arena that needs memory the device does not have (no OOM for it)", "[step_plan][engine]") {
  // A full device whose free memory is scattered in 4 MiB holes: an 80 MiB arena would need new
  // memory the device does not have. The plan is refused; no OOM event, every request served.
  SimSourceOptions o;
  o.capacity_bytes = 920 * MiB;
  SimSource source(o);
  ManualStreamEvents events;
  Config config = plan_config();
  config.va_reserve_bytes = 0;
  config.expandable_segments = false;
  CachingAllocator engine(source, events, config);
  auto oom = std::make_shared<OomCounter>();
  engine.attach_observer(oom);
  std::vector<void*> fill;
  for (int i = 0; i < 225; ++i) fill.push_back(engine.allocate(4 * MiB, 1).ptr);
  for (std::size_t i = 0; i < fill.size(); i += 2) REQUIRE(engine.free(fill[i]) == FreeStatus::ok);
  for (int s = 0; s < 6; ++s) {
    engine.mark_step();
    std::vector<void*> kept;
    for (int l = 0; l < 40; ++l) {
      const AllocResult r = engine.allocate(2 * MiB, 1);
      REQUIRE(r.ptr != nullptr);
      kept.push_back(r.ptr);
    }
    for (void* p : kept) REQUIRE(engine.free(p) == FreeStatus::ok);
  }
  const auto c = engine.step_plan_counters();
  CHECK(c->plans >= 1);
  CHECK(c->arenas_mapped == 0);
  CHECK_THAT(c->last_fallback, Contains("did not provide the arena"));
  CHECK(oom->ooms == 0);
}

// One call of a thread that allocates and frees at random: up to 32 blocks of 512 B-32 KiB live.
static void random_call(CachingAllocator& engine, std::mt19937& rng, std::vector<void*>& live) {
  if (live.size() < 32 && (live.empty() || rng() % 2 == 0)) {
    const AllocResult r = engine.allocate(512 * (1 + rng() % 64), 0);
    CHECK(r.ptr != nullptr);
    if (r.ptr != nullptr) live.push_back(r.ptr);
  } else {
    std::swap(live[rng() % live.size()], live.back());
    CHECK(engine.free(live.back()) == FreeStatus::ok);
    live.pop_back();
  }
}

TEST_CASE_METHOD(PlanEngine, "engine step plan: threads that take turns call by call stop the planner",
                 "[step_plan][engine][threads]") {
  // Two threads whose calls alternate one by one (an atomic turn): the order of their events is a
  // matter of timing in a real program, so no step can repeat. The planner's lock is not held
  // across the engine's call, so they seldom find it held; what stops the planner is that most calls
  // come from another thread than the call before (StepPlanning::kSwitchStop in a window).
  std::atomic<int> turn{0};
  constexpr int kCalls = 3000;  // each: 6,000 calls, past the 2,048 switches of the first window
  auto worker = [&](int self, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<void*> live;
    for (int i = 0; i < kCalls; ++i) {
      while (turn.load(std::memory_order_acquire) % 2 != self) std::this_thread::yield();
      random_call(engine, rng, live);
      turn.fetch_add(1, std::memory_order_release);
    }
    for (void* p : live) CHECK(engine.free(p) == FreeStatus::ok);
  };
  std::thread a(worker, 0, 1u);
  std::thread b(worker, 1, 2u);
  a.join();
  b.join();
  const auto c = engine.step_plan_counters();
  REQUIRE(c);
  INFO(c->last_reason);
  CHECK(c->stopped);
  CHECK_THAT(c->last_reason, Contains("came from another thread than the call before"));
  CHECK_THAT(c->last_reason, Contains("allocate at the same time"));
  CHECK(engine.totals().allocated_bytes == 0);
  engine.check_invariants();
}

TEST_CASE_METHOD(PlanEngine, "engine step plan: threads that allocate at the same time get blocks of their own",
                 "[step_plan][engine][threads]") {
  // Four threads allocating at once, free-running: whether the planner stops depends on how they
  // meet (a slow observer makes them meet in the engine's lock even on one core), but every block
  // is a thread's own (each free is of a live block of the engine) and the engine ends consistent.
  struct Slow final : AllocObserver {
    void on_events(std::span<const AllocEvent>) override { std::this_thread::sleep_for(std::chrono::microseconds(20)); }
  };
  auto slow = std::make_shared<Slow>();
  engine.attach_observer(slow);
  std::atomic<int> ready{0};
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<void*> live;
    ready.fetch_add(1);
    while (ready.load() < 4) std::this_thread::yield();
    for (int i = 0; i < 3000; ++i) random_call(engine, rng, live);
    for (void* p : live) CHECK(engine.free(p) == FreeStatus::ok);
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) threads.emplace_back(worker, t + 1);
  for (std::thread& t : threads) t.join();
  engine.detach_observer(slow.get());
  const auto c = engine.step_plan_counters();
  REQUIRE(c);
  INFO(c->last_reason);
  if (c->stopped) CHECK_THAT(c->last_reason, Contains("allocate at the same time"));
  CHECK(engine.totals().allocated_bytes == 0);
  engine.check_invariants();
}

TEST_CASE_METHOD(PlanEngine, "engine step plan: steps whose calls come from two threads in turn are still planned",
                 "[step_plan][engine][threads]") {
  // As autograd runs the backward pass on a thread of its own: the steps alternate between two
  // threads, one after the other, a few switches a step. That is not threads at the same time.
  Loop loop{engine};
  for (int s = 0; s < 40; ++s) {
    std::thread t([&] { loop.step(); });
    t.join();
    loop.step();
  }
  const auto c = engine.step_plan_counters();
  REQUIRE(c);
  INFO(c->last_reason);
  CHECK_FALSE(c->stopped);
  CHECK(c->served_steps >= 60);
  engine.check_invariants();
}

TEST_CASE_METHOD(PlanEngine, "engine step plan: one thread never stops the planner", "[step_plan][engine]") {
  Loop loop{engine};
  for (int s = 0; s < 40; ++s) loop.step();
  CHECK_FALSE(engine.step_plan_counters()->stopped);
  CHECK(engine.step_plan_counters()->served_steps >= 30);
}

TEST_CASE("engine step plan: detection rests where nothing repeats; the engine serves those calls alone, then "
          "the planner wakes and finds the loop",
          "[step_plan][engine]") {
  SimSource source;
  ManualStreamEvents events;
  Config config = plan_config();
  config.check_invariants = false;  // a million calls
  CachingAllocator engine(source, events, config);
  // 160,000 events whose sizes never repeat in order: past the planner's 131,072 awake events.
  std::mt19937 rng(7);
  std::vector<void*> live;
  for (int i = 0; i < 160000; ++i) {
    if (live.size() < 64 && (live.empty() || rng() % 2 == 0)) {
      live.push_back(engine.allocate(512 * (1 + rng() % 4096), 0).ptr);
    } else {
      std::swap(live[rng() % live.size()], live.back());
      REQUIRE(engine.free(live.back()) == FreeStatus::ok);
      live.pop_back();
    }
  }
  for (void* p : live) REQUIRE(engine.free(p) == FreeStatus::ok);
  auto c = engine.step_plan_counters();
  REQUIRE(c);
  CHECK(c->dormant);
  CHECK(c->dormant_periods == 1);
  CHECK(c->plans == 0);
  // A loop starts. The planner rests for 917,504 calls (each allocation and free one), which go
  // straight to the engine; then it wakes, finds the step and serves it.
  Loop loop{engine};
  int steps = 0;
  for (; steps < 9000 && engine.step_plan_counters()->served_steps < 3; ++steps) loop.step();
  c = engine.step_plan_counters();
  INFO(steps << " steps; " << c->last_reason);
  CHECK(steps > 7000);  // 917,504 / 121 events a step: asleep for about 7,580 steps
  CHECK_FALSE(c->dormant);
  CHECK(c->plans == 1);
  CHECK(c->served_steps >= 3);
  CHECK(c->dormant_periods == 1);
  engine.check_invariants();
}

TEST_CASE("engine step plan: laid out on a thread of its own, the loop is served from a step after it is found",
          "[step_plan][engine][layout_thread]") {
  SimSource source;
  ManualStreamEvents events;
  Config config = plan_config();
  config.step_plan_layout_thread = true;  // the default
  CachingAllocator engine(source, events, config);
  Loop loop{engine};
  int steps = 0;
  // The allocating thread never waits for the layout: the steps go on, and the plan serves from the
  // first trough after it is done (the next step's start, on a machine that is not loaded).
  for (; steps < 200 && engine.step_plan_counters()->served_steps < 3; ++steps) loop.step();
  const auto c = engine.step_plan_counters();
  INFO(steps << " steps; " << c->last_reason);
  CHECK(c->detected_steps == 1);
  CHECK(c->plans == 1);
  CHECK(c->layouts == 1);
  CHECK_FALSE(c->laying_out);
  CHECK(c->served_steps >= 3);
  CHECK(c->fallbacks == 0);
  engine.check_invariants();
}

TEST_CASE("engine step plan: after a mark the planner sees every call, none goes by on calls claimed while it rested",
          "[step_plan][engine]") {
  RestingEngine resting(11);
  CachingAllocator& engine = resting.engine;
  // Asleep: this thread has taken a chunk of the calls the planner rests for and spent part of it.
  // Marked steps: the first has no gradient from a step before to free, the next two are equal,
  // and the mark after them plans, if the planner saw every call of the second and third steps.
  Loop loop{engine};
  loop.marked_steps(3);
  engine.mark_step();
  const auto c = engine.step_plan_counters();
  INFO(c->last_reason);
  CHECK(c->marks == 4);
  CHECK(c->plans == 1);
}

TEST_CASE("engine step plan: threads that allocate while the planner rests go by it, then stop it when it wakes",
          "[step_plan][engine][threads]") {
  RestingEngine resting(5);
  CachingAllocator& engine = resting.engine;
  // Four threads make 1.2 million calls together: past the 917,504 the planner rests for, so it
  // wakes while they run, finds them at once in its lock and stops.
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&engine, &failures, t] {
      std::mt19937 r(static_cast<unsigned>(100 + t));
      for (int i = 0; i < 150000; ++i) {
        void* p = engine.allocate(512 * (1 + r() % 64), 0).ptr;
        if (p == nullptr || engine.free(p) != FreeStatus::ok) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  const auto c = engine.step_plan_counters();
  INFO(c->last_reason);
  CHECK(c->dormant_periods >= 1);
  CHECK(c->plans == 0);
  engine.check_invariants();
}

TEST_CASE("engine step plan: a mark wakes a dormant planner at once", "[step_plan][engine]") {
  RestingEngine resting(11);
  CachingAllocator& engine = resting.engine;
  Loop loop{engine};
  loop.marked_steps(6);
  const auto c = engine.step_plan_counters();
  INFO(c->last_reason);
  CHECK_FALSE(c->dormant);
  CHECK(c->plans == 1);
  CHECK(c->served_allocations > 0);
}
