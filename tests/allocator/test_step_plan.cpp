// step_plan.h: plan_step's layout of a recorded step; StepPlanner's recording, serving from the arena, falling back.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "catch.h"
#include "gpumem/alloc/step_plan.h"

using namespace gpumem::alloc;
using Catch::Matchers::Contains;

namespace {

constexpr std::uintptr_t kArenaBase = 0x7000'0000'0000;

// An allocation of `size_bytes` on `stream`; a free of allocation `index` of this step (or of the step before).
StepEvent A(std::uint64_t size_bytes, StreamId stream = 0) { return StepEvent{false, 0, 0, size_bytes, stream}; }
StepEvent F(std::uint32_t index, std::uint8_t steps_back = 0) { return StepEvent{true, steps_back, index, 0, 0}; }

std::uint64_t round_up(std::uint64_t v, std::uint64_t r) { return (v + r - 1) / r * r; }

// A block's lifetime, computed here from the events: the positions p after whose event it is live,
// as half-open spans [alloc, free); a block freed in the next step lives [alloc, n) and [0, free).
// No span: a block that cannot be planned (never freed, or freed after its own next instance).
struct Life {
  std::uint64_t bytes = 0;
  StreamId stream = 0;
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  bool live_after(std::size_t p) const {
    return std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return s.first <= p && p < s.second; });
  }
};

std::vector<Life> lifetimes(const std::vector<StepEvent>& step, std::size_t round) {
  std::vector<Life> lives;
  std::vector<std::size_t> at;
  for (std::size_t p = 0; p < step.size(); ++p) {
    if (step[p].is_free) continue;
    lives.push_back(Life{round_up(step[p].size_bytes, round), step[p].stream, {}});
    at.push_back(p);
  }
  for (std::size_t p = 0; p < step.size(); ++p) {
    const StepEvent& e = step[p];
    if (!e.is_free) continue;
    if (e.steps_back == 0) lives[e.index].spans = {{at[e.index], p}};
    else if (p < at[e.index]) lives[e.index].spans = {{at[e.index], step.size()}, {0, p}};
  }
  return lives;
}

bool conflict(const Life& a, const Life& b) {
  if (a.stream != b.stream) return true;
  for (const auto& [alo, ahi] : a.spans)
    for (const auto& [blo, bhi] : b.spans)
      if (alo < bhi && blo < ahi) return true;
  return false;
}

struct LayoutCheck {
  std::size_t conflicting_pairs = 0;  // pairs of planned blocks that may not share bytes
  std::size_t violations = 0;         // of those, pairs that do
  std::size_t with_neighbour = 0;     // planned blocks with a neighbour live where they are allocated
};

// Checks `plan` against lifetimes computed from the events: every planned block lies in the arena,
// aligned; conflicting blocks share no bytes; peak and trough are those of the lifetimes.
LayoutCheck check_layout(const std::vector<StepEvent>& step, const StepPlan& plan, std::size_t round) {
  const std::vector<Life> lives = lifetimes(step, round);
  LayoutCheck r;
  REQUIRE(plan.offsets.size() == lives.size());
  std::size_t unplanned = 0;
  for (std::size_t j = 0; j < lives.size(); ++j) {
    const bool planned = plan.offsets[j] != StepPlan::kNotPlanned;
    CHECK(planned == !lives[j].spans.empty());
    if (!planned && ++unplanned) continue;
    CHECK(plan.offsets[j] % round == 0);
    CHECK(plan.offsets[j] + lives[j].bytes <= plan.arena_bytes);
    for (std::size_t k = 0; k < j; ++k) {
      if (plan.offsets[k] == StepPlan::kNotPlanned || !conflict(lives[j], lives[k])) continue;
      ++r.conflicting_pairs;
      if (plan.offsets[j] < plan.offsets[k] + lives[k].bytes && plan.offsets[k] < plan.offsets[j] + lives[j].bytes)
        ++r.violations;
    }
  }
  CHECK(plan.unplanned_blocks == unplanned);
  const std::size_t n = step.size();
  std::vector<std::size_t> live_after(n, 0);
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t j = 0; j < lives.size(); ++j)
      if (plan.offsets[j] != StepPlan::kNotPlanned && lives[j].live_after(p)) live_after[p] += lives[j].bytes;
  CHECK(plan.peak_live_bytes == *std::max_element(live_after.begin(), live_after.end()));
  CHECK(plan.arena_bytes >= plan.peak_live_bytes);
  // Live before event p = live after event p - 1 (of the step before, for p = 0).
  auto live_before = [&](std::size_t p) { return live_after[(p + n - 1) % n]; };
  std::size_t least = live_before(0);
  for (std::size_t p = 1; p < n; ++p) least = std::min(least, live_before(p));
  CHECK(plan.trough_live_bytes == least);
  REQUIRE(plan.trough < n);
  CHECK(live_before(plan.trough) == least);
  // Each planned block's neighbour: of the planned blocks live before its allocation, the one with
  // the highest offset below its own, else the one with the lowest above.
  REQUIRE(plan.neighbours.size() == lives.size());
  std::size_t j = 0;
  for (std::size_t p = 0; p < n; ++p) {
    if (step[p].is_free) continue;
    const std::size_t self = j++;
    if (plan.offsets[self] == StepPlan::kNotPlanned) continue;
    std::uint32_t below = StepPlan::kNoNeighbour, above = StepPlan::kNoNeighbour;
    for (std::size_t k = 0; k < lives.size(); ++k) {
      if (k == self || plan.offsets[k] == StepPlan::kNotPlanned || !lives[k].live_after((p + n - 1) % n)) continue;
      if (plan.offsets[k] < plan.offsets[self]) {
        if (below == StepPlan::kNoNeighbour || plan.offsets[k] > plan.offsets[below]) below = static_cast<std::uint32_t>(k);
      } else if (above == StepPlan::kNoNeighbour || plan.offsets[k] < plan.offsets[above]) {
        above = static_cast<std::uint32_t>(k);
      }
    }
    INFO("allocation " << self << " at event " << p);
    CHECK(plan.neighbours[self] == (below != StepPlan::kNoNeighbour ? below : above));
    if (plan.neighbours[self] != StepPlan::kNoNeighbour) ++r.with_neighbour;
  }
  return r;
}

}  // namespace

TEST_CASE("plan_step: blocks live at the same time never share bytes, blocks live apart may", "[step_plan]") {
  // X [0,2), Y [1,4), Z [3,5): X-Y and Y-Z overlap; X and Z may share.
  const std::vector<StepEvent> step = {A(1000), A(512), F(0), A(2048), F(1), F(2)};
  const auto plan = plan_step(step, 512, nullptr);
  REQUIRE(plan);
  const LayoutCheck c = check_layout(step, *plan, 512);
  CHECK(c.conflicting_pairs == 2);
  CHECK(c.violations == 0);
  CHECK(plan->peak_live_bytes == 512 + 2048);  // after Z's allocation: Y and Z
  CHECK(plan->arena_bytes == 512 + 2048);      // X shares bytes with Z: 1024 + 512 + 2048 would be more
  CHECK(plan->unplanned_blocks == 0);
}

TEST_CASE("plan_step: one block after another on the same stream share bytes, on two streams they do not",
          "[step_plan]") {
  const auto same = plan_step({A(4096), F(0), A(4096), F(1)}, 512, nullptr);
  REQUIRE(same);
  CHECK(same->arena_bytes == 4096);
  CHECK(same->offsets == std::vector<std::uint64_t>{0, 0});
  CHECK(same->peak_live_bytes == 4096);

  const std::vector<StepEvent> two = {A(4096, 0), F(0), A(4096, 1), F(1)};
  const auto apart = plan_step(two, 512, nullptr);
  REQUIRE(apart);
  CHECK(apart->arena_bytes == 8192);
  CHECK(apart->peak_live_bytes == 4096);
  const LayoutCheck c = check_layout(two, *apart, 512);
  CHECK(c.conflicting_pairs == 1);
  CHECK(c.violations == 0);
}

TEST_CASE("plan_step: sizes are rounded up to the rounding", "[step_plan]") {
  CHECK(plan_step({A(1), F(0)}, 512, nullptr).value().arena_bytes == 512);
  CHECK(plan_step({A(1), F(0)}, 4096, nullptr).value().arena_bytes == 4096);
  const std::vector<StepEvent> step = {A(5000), A(100), F(0), F(1)};  // 8192 and 4096, live together
  const auto plan = plan_step(step, 4096, nullptr);
  REQUIRE(plan);
  CHECK(plan->arena_bytes == 12288);
  CHECK(plan->peak_live_bytes == 12288);
  CHECK(check_layout(step, *plan, 4096).violations == 0);  // offsets are multiples of 4096, too
}

TEST_CASE("plan_step: a block freed in the next step wraps around to the step's start", "[step_plan]") {
  // X [0,2), Y [3,5); W is allocated at 4 and freed at 1 of the next step: [4,6) and [0,1), so it is
  // live with X at the step's start and with Y after its allocation.
  const std::vector<StepEvent> step = {A(1024), F(2, 1), F(0), A(512), A(2048), F(1)};
  const auto plan = plan_step(step, 512, nullptr);
  REQUIRE(plan);
  const LayoutCheck c = check_layout(step, *plan, 512);
  CHECK(c.conflicting_pairs == 2);  // W-X, W-Y
  CHECK(c.violations == 0);
  const auto& off = plan->offsets;
  CHECK((off[2] + 2048 <= off[0] || off[0] + 1024 <= off[2]));  // W and X share no bytes
  // Live before each event: W 2048 | X+W 3072 | X 1024 | 0 | Y 512 | Y+W 2560.
  CHECK(plan->trough == 3);
  CHECK(plan->trough_live_bytes == 0);
  CHECK(plan->peak_live_bytes == 3072);
  CHECK(plan->arena_bytes == 3072);
  // The same blocks with W freed in the step: W no longer meets X, and the two share bytes.
  const auto unwrapped = plan_step({A(1024), F(0), A(512), A(2048), F(1), F(2)}, 512, nullptr);
  REQUIRE(unwrapped);
  CHECK(unwrapped->arena_bytes == 2560);
}

TEST_CASE("plan_step: blocks that outlive a step, or are never freed, are left unplanned", "[step_plan]") {
  // 0 frees in the next step after its own next instance; 1 is freed in the step; 2 is never freed.
  const std::vector<StepEvent> step = {A(512), F(0, 1), A(512), F(1), A(512)};
  const auto plan = plan_step(step, 512, nullptr);
  REQUIRE(plan);
  CHECK(plan->offsets == std::vector<std::uint64_t>{StepPlan::kNotPlanned, 0, StepPlan::kNotPlanned});
  CHECK(plan->unplanned_blocks == 2);
  CHECK(plan->arena_bytes == 512);
  CHECK(plan->peak_live_bytes == 512);
  check_layout(step, *plan, 512);
}

TEST_CASE("plan_step: a step it cannot plan gives nullopt and says why", "[step_plan]") {
  const struct {
    std::vector<StepEvent> step;
    std::size_t round;
    const char* why;
  } cases[] = {
      {{A(512), F(0, 2)}, 512, "2 steps before"},
      {{A(512), F(0), F(0)}, 512, "allocation 0 of the step, which is not live"},          // freed twice
      {{F(1), A(512), A(512), F(0)}, 512, "allocation 1 of the step, which is not live"},  // before its allocation
      {{F(3, 1), A(512), F(0)}, 512, "does not repeat"},  // the step has no allocation 3
      {{}, 512, "allocates nothing"},
      {{A(512)}, 512, "no block"},  // nothing freed: nothing to plan
      {{A(512), F(0)}, 0, "not a power of two"},
      {{A(512), F(0)}, 768, "not a power of two"},
      {{A(512), F(0)}, 513, "not a power of two"},
  };
  for (const auto& c : cases) {
    std::string why;
    CHECK_FALSE(plan_step(c.step, c.round, &why));
    CHECK_THAT(why, Contains(c.why));
  }
  CHECK_FALSE(plan_step({}, 512, nullptr));  // no `why`: still nullopt
}

TEST_CASE("plan_step: random steps are laid out with no overlap between conflicting blocks", "[step_plan][property]") {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
      return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
    };
    const std::size_t round = seed % 2 ? 512 : 2048;
    const StreamId streams = uniform(1, 3);
    const auto allocs = uniform(100, 200);
    std::vector<StepEvent> step;
    std::vector<std::size_t> at;  // where each allocation is
    std::vector<std::uint32_t> live;
    while (at.size() < allocs) {
      if (!live.empty() && uniform(0, 99) < 45) {
        std::swap(live[uniform(0, live.size() - 1)], live.back());
        step.push_back(F(live.back()));
        live.pop_back();
      } else {
        live.push_back(static_cast<std::uint32_t>(at.size()));
        at.push_back(step.size());
        const std::uint64_t size = uniform(1, std::uint64_t{1} << uniform(0, 22));
        const StreamId stream = uniform(0, streams - 1);
        step.push_back(A(size, stream));
      }
    }
    // What is still live is freed at the end, or wraps: freed in the next step before its allocation.
    std::vector<std::pair<std::size_t, StepEvent>> keyed;  // 2p + 1: event p; 2q: before event q
    for (std::size_t p = 0; p < step.size(); ++p) keyed.emplace_back(2 * p + 1, step[p]);
    std::size_t wrapped = 0;
    for (std::uint32_t j : live) {
      const bool wraps = uniform(0, 1);
      keyed.emplace_back(wraps ? 2 * uniform(0, at[j]) : 2 * step.size() + 1, F(j, wraps));
      wrapped += wraps;
    }
    std::stable_sort(keyed.begin(), keyed.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    step.clear();
    for (const auto& [key, e] : keyed) step.push_back(e);
    INFO(step.size() << " events, " << allocs << " blocks, " << wrapped << " wrapped, " << streams << " streams");

    std::string why;
    const auto plan = plan_step(step, round, &why);
    INFO(why);
    REQUIRE(plan);
    CHECK(plan->unplanned_blocks == 0);
    const LayoutCheck c = check_layout(step, *plan, round);  // also: arena_bytes >= peak_live_bytes
    CHECK(c.conflicting_pairs > 0);
    CHECK(c.violations == 0);
    CHECK(c.with_neighbour > 0);
  }
}

namespace {

// The owner's memory for the arena: one range at a fixed base (or none, when told to refuse).
struct FakeHost final : StepArenaHost {
  bool refuse = false;
  std::vector<std::size_t> maps;
  std::vector<std::pair<std::uintptr_t, std::size_t>> unmaps;
  std::optional<std::uintptr_t> map_arena(std::size_t size_bytes, StreamId) override {
    maps.push_back(size_bytes);
    if (refuse) return std::nullopt;
    return kArenaBase;
  }
  void unmap_arena(std::uintptr_t base, std::size_t size_bytes) override { unmaps.emplace_back(base, size_bytes); }
};

// Plays the planner's owner: runs a step's events through the planner, serves what allocate()
// leaves to it from addresses of its own, and checks what the planner says of every block.
struct Owner {
  struct Block { std::uintptr_t addr = 0; std::uint64_t bytes = 0; bool arena = false; };
  StepPlanner& planner;
  std::uintptr_t next_own = 0x1000'0000'0000;
  std::vector<Block> previous, current;  // the allocations of the step before and of this one, by index
  std::map<std::uintptr_t, std::uint64_t> live_arena;
  std::size_t served = 0;        // allocations of this step served from the arena
  std::size_t same_address = 0;  // served at the address their index had in the step before

  explicit Owner(StepPlanner& p) : planner(p) {}
  // A block the owner allocated before the planner existed.
  void allocate_unseen(std::uint32_t index, std::uint64_t bytes) {
    current.resize(index + 1);
    current[index] = Block{next_own, bytes, false};
    next_own += std::uintptr_t{1} << 30;
  }
  // A step the program does not mark: the planner has to find it.
  void unmarked_step(const std::vector<StepEvent>& events) {
    previous = std::move(current);
    current.clear();
    served = 0;
    run(events);
  }
  void step(const std::vector<StepEvent>& events) {
    planner.mark_step();
    previous = std::move(current);
    current.clear();
    served = 0;
    run(events);
  }
  void run(const std::vector<StepEvent>& events) {
    for (const StepEvent& e : events) e.is_free ? release(e) : allocate(e);
  }
  void allocate(const StepEvent& e) {
    Block b{0, round_up(e.size_bytes, 512), false};
    if (e.size_bytes == 0) {  // the engine gives no block (null): nothing to note, nothing to free
      CHECK_FALSE(planner.allocate(0, e.stream));
      current.push_back(b);
      return;
    }
    if (const auto addr = planner.allocate(e.size_bytes, e.stream)) {
      planner.note_allocated(*addr);
      b = Block{*addr, b.bytes, true};
      ++served;
      CHECK(planner.in_arena(*addr));
      CHECK(*addr >= kArenaBase);
      CHECK(*addr + b.bytes <= kArenaBase + planner.counters().arena_bytes);
      CHECK(live_arena.count(*addr) == 0);  // no two live blocks at one address
      for (const auto& [other, bytes] : live_arena) CHECK((*addr + b.bytes <= other || other + bytes <= *addr));
      live_arena.emplace(*addr, b.bytes);
      const std::size_t j = current.size();
      if (j < previous.size() && previous[j].arena) {
        CHECK(previous[j].addr == *addr);
        ++same_address;
      }
    } else {
      b.addr = next_own;
      next_own += std::uintptr_t{1} << 30;
      planner.note_allocated(b.addr);
    }
    current.push_back(b);
  }
  void release(const StepEvent& e) {
    const std::vector<Block>& from = e.steps_back ? previous : current;
    REQUIRE(e.index < from.size());
    const Block b = from[e.index];
    if (b.addr == 0) return;  // free(nullptr)
    CHECK(planner.free(b.addr) == b.arena);
    if (b.arena) live_arena.erase(b.addr);
  }
};

// The fake host, a planner and its owner, which holds kStep's W (index 3) unseen before step 1.
struct Rig {
  FakeHost host;
  StepPlanner planner;
  Owner owner{planner};
  explicit Rig(StepPlanOptions options = {}, bool with_w = true) : planner(host, options) {
    if (with_w) owner.allocate_unseen(3, 2048);
  }
};

// 0 A | 1 free W of the step before | 2 B | 3 free A | 4 C on stream 1 | 5 free B | 6 W | 7 free C | 8 T, never freed.
// Live before each event: W 2048 | A+W 3072 | A 1024 (the trough) | A+B 4096 | B 3072 | B+C 4608 | C | C+W | W.
const std::vector<StepEvent> kStep = {A(1000), F(3, 1), A(3000), F(0), A(1500, 1), F(1), A(2048), F(2), A(100)};

}  // namespace

TEST_CASE("step planner: plans after two identical whole steps and serves each allocation at its offset",
          "[step_plan][planner]") {
  const auto plan = plan_step(kStep, 512, nullptr);
  REQUIRE(plan);
  REQUIRE(plan->trough == 2);
  REQUIRE(plan->unplanned_blocks == 1);
  Rig rig;  // step 1 frees W, which the planner never saw: the step is not whole
  auto& [host, planner, owner] = rig;
  owner.step(kStep);
  owner.step(kStep);
  CHECK(planner.counters().plans == 0);
  CHECK_THAT(planner.counters().last_reason, Contains("before the step before"));
  owner.step(kStep);  // step 2 was whole, but there is nothing to compare it with
  CHECK(planner.counters().plans == 0);
  CHECK(owner.served == 0);
  CHECK_FALSE(planner.serving());
  owner.step(kStep);  // steps 2 and 3 are the same: planned; serving starts at the trough
  CHECK(planner.counters().plans == 1);
  CHECK(planner.counters().last_reason.empty());
  CHECK(owner.served == 3);  // B, C, W: A comes before the trough, T is not planned
  CHECK(host.maps == std::vector<std::size_t>{plan->arena_bytes});
  for (int s = 0; s < 3; ++s) {  // steps 4 to 6
    for (std::size_t j = 0; j < owner.current.size(); ++j) {
      INFO("allocation " << j);
      CHECK(owner.current[j].arena == (plan->offsets[j] != StepPlan::kNotPlanned && (s > 0 || j > 0)));
      if (owner.current[j].arena) CHECK(owner.current[j].addr == kArenaBase + plan->offsets[j]);
    }
    if (s < 2) owner.step(kStep);
  }
  CHECK(owner.served == 4);
  CHECK(owner.same_address == 3 + 4);
  planner.mark_step();
  const StepPlanCounters& c = planner.counters();
  CHECK(c.marks == 7);
  CHECK(c.plans == 1);
  CHECK(c.arenas_mapped == 1);
  CHECK(c.served_allocations == 3 + 4 + 4);
  CHECK(c.served_steps == 3);
  CHECK(c.fallbacks == 0);
  CHECK(c.arena_bytes == plan->arena_bytes);
  CHECK(c.last_plan_arena_bytes == plan->arena_bytes);
  CHECK(c.last_plan_peak_live_bytes == plan->peak_live_bytes);
  CHECK(host.maps.size() == 1);
  CHECK(host.unmaps.empty());
  CHECK(planner.serving());
}

TEST_CASE("step planner: an event that differs ends serving; the arena is given back once empty, then it plans again",
          "[step_plan][planner]") {
  const auto plan = plan_step(kStep, 512, nullptr);
  REQUIRE(plan);
  Rig rig;
  auto& [host, planner, owner] = rig;
  for (int s = 1; s <= 5; ++s) owner.step(kStep);  // served from step 4
  REQUIRE(planner.serving());
  REQUIRE(owner.served == 4);
  std::size_t unmaps_in_step = 0;  // in step 6
  bool short_step = false;
  SECTION("a request of another size") {
    std::vector<StepEvent> other = kStep;
    other[8] = A(9000);
    owner.step(other);
    CHECK(owner.served == 4);
    CHECK(planner.counters().fallbacks == 1);
    CHECK_THAT(planner.counters().last_fallback, Contains("event 8"));
    CHECK(owner.live_arena.size() == 1);  // W, freed in the next step
  }
  SECTION("frees in another order") {
    std::vector<StepEvent> other = kStep;
    std::swap(other[3], other[5]);
    owner.step(other);
    CHECK(owner.served == 2);  // A and B: the free of B at 3 differs
    CHECK(planner.counters().fallbacks == 1);
    CHECK_THAT(planner.counters().last_fallback, Contains("event 3"));
    unmaps_in_step = 1;  // A, the arena's last block, is freed at 5
  }
  SECTION("a step that ends early") {
    owner.step(std::vector<StepEvent>(kStep.begin(), kStep.end() - 1));
    CHECK(owner.served == 4);
    CHECK(planner.counters().fallbacks == 0);  // until the next mark
    short_step = true;
  }
  CHECK(host.unmaps.size() == unmaps_in_step);
  owner.step(kStep);  // step 7: frees the arena's last block (W), unless gone already
  CHECK(planner.counters().fallbacks == 1);
  if (short_step) CHECK_THAT(planner.counters().last_fallback, Contains("a step ended after 8 events"));
  CHECK_FALSE(planner.serving());
  CHECK(owner.served == 0);
  CHECK(owner.live_arena.empty());
  REQUIRE(host.unmaps.size() == 1);
  CHECK(host.unmaps[0] == std::make_pair(kArenaBase, plan->arena_bytes));
  owner.step(kStep);  // step 8: the same as 7, but 7 differed from 6
  CHECK(owner.served == 0);
  CHECK(planner.counters().plans == 1);
  CHECK_THAT(planner.counters().last_reason, Contains("the last two steps differ"));
  CHECK(planner.counters().arena_bytes == 0);
  owner.step(kStep);  // step 9: planned again
  CHECK(owner.served == 3);
  const StepPlanCounters& c = planner.counters();
  CHECK(c.plans == 2);
  CHECK(c.fallbacks == 1);
  CHECK(c.arenas_mapped == 2);
  CHECK(host.maps == std::vector<std::size_t>{plan->arena_bytes, plan->arena_bytes});
  CHECK(host.unmaps.size() == 1);
  CHECK(planner.serving());
}

TEST_CASE("step planner: each early fallback asks for one more repeat; after max_fallbacks it stops planning",
          "[step_plan][planner]") {
  StepPlanOptions options;
  options.max_fallbacks = 2;
  Rig rig(options);
  auto& [host, planner, owner] = rig;
  std::vector<StepEvent> other = kStep;
  other[8] = A(9000);
  for (int s = 1; s <= 4; ++s) owner.step(kStep);
  REQUIRE(owner.served == 3);
  owner.step(other);  // step 5: fallback 1, after the plan served one whole step (4): an early one
  CHECK(planner.counters().fallbacks == 1);
  for (int s = 6; s <= 8; ++s) owner.step(kStep);  // 6 differs from 5; 6, 7 and 8 are the same
  CHECK(planner.counters().plans == 1);
  CHECK_THAT(planner.counters().last_reason, Contains("repeated 2 times in a row"));
  CHECK_THAT(planner.counters().last_reason, Contains("3 are needed"));
  owner.step(kStep);  // step 9: three in a row were needed, and there are: planned again
  CHECK(planner.counters().plans == 2);
  CHECK(owner.served == 3);
  owner.step(other);  // step 10: fallback 2, early again: the planner stops
  CHECK(planner.counters().fallbacks == 2);
  for (int s = 11; s <= 17; ++s) owner.step(kStep);  // 11 frees the arena's last block
  CHECK(planner.counters().served_allocations == 3 + 4 + 3 + 4 + 0);  // steps 4, 5, 9, 10, then none
  CHECK_FALSE(planner.serving());
  CHECK(planner.counters().plans == 2);
  CHECK(planner.counters().fallbacks == 2);
  CHECK(host.maps.size() == 2);
  CHECK(host.unmaps.size() == 2);
  CHECK(owner.live_arena.empty());
}

TEST_CASE("step planner: an arena the host cannot map is a fallback, and nothing is served", "[step_plan][planner]") {
  const auto plan = plan_step(kStep, 512, nullptr);
  REQUIRE(plan);
  Rig rig;
  auto& [host, planner, owner] = rig;
  host.refuse = true;
  for (int s = 1; s <= 4; ++s) owner.step(kStep);  // planned at step 4's mark
  CHECK(owner.served == 0);
  CHECK_FALSE(planner.serving());
  const StepPlanCounters& c = planner.counters();
  CHECK(c.plans == 1);
  CHECK(c.fallbacks == 1);
  CHECK(c.arenas_mapped == 0);
  CHECK(c.served_allocations == 0);
  CHECK(c.arena_bytes == 0);
  CHECK_THAT(c.last_fallback, Contains("did not provide the arena"));
  CHECK(host.maps == std::vector<std::size_t>{plan->arena_bytes});
  CHECK(host.unmaps.empty());
  // The refusal was an early fallback: the next plan needs three equal steps counted from it
  // (4, 5 and 6), so it comes at step 7's mark; this time the host maps it.
  host.refuse = false;
  owner.step(kStep);
  owner.step(kStep);
  CHECK(c.plans == 1);
  CHECK_THAT(c.last_reason, Contains("3 are needed"));
  owner.step(kStep);
  CHECK(c.plans == 2);
  CHECK(owner.served == 3);
  CHECK(c.arenas_mapped == 1);
  CHECK(c.fallbacks == 1);
}

TEST_CASE("step planner: a step longer than max_step_events is not planned", "[step_plan][planner]") {
  for (const std::size_t limit : {kStep.size() - 1, kStep.size()}) {
    INFO("max_step_events " << limit);
    StepPlanOptions options;
    options.max_step_events = limit;
    Rig rig(options);
    auto& [host, planner, owner] = rig;
    for (int s = 1; s <= 6; ++s) owner.step(kStep);
    const bool over = limit < kStep.size();
    CHECK(planner.counters().plans == (over ? 0 : 1));
    CHECK(owner.served == (over ? 0 : 4));
    CHECK(host.maps.size() == (over ? 0 : 1));
    if (over) CHECK_THAT(planner.counters().last_reason, Contains("more than 8 events"));
  }
}

TEST_CASE("step planner: stop() while serving falls back, drains the arena, then answers nothing",
          "[step_plan][planner]") {
  Rig rig;
  auto& [host, planner, owner] = rig;
  for (int s = 0; s < 5; ++s) owner.step(kStep);
  REQUIRE(planner.serving());
  REQUIRE(host.maps.size() == 1);
  // Mid-step: A and B are live in the arena (events 0-2 ran). The plan falls back; the arena stays
  // until both are gone.
  planner.mark_step();
  owner.previous = std::move(owner.current);
  owner.current.clear();
  owner.served = 0;
  owner.run({kStep.begin(), kStep.begin() + 3});
  REQUIRE(owner.current.size() == 2);
  REQUIRE(owner.current[0].arena);  // A (served from the second step on)
  REQUIRE(owner.current[1].arena);  // B
  const std::uint64_t fallbacks = planner.counters().fallbacks;
  planner.stop("a test");
  CHECK_FALSE(planner.serving());
  CHECK_FALSE(planner.stopped());  // A and B are still in the arena
  CHECK_FALSE(planner.counters().stopped);
  CHECK(planner.counters().fallbacks == fallbacks + 1);
  CHECK_THAT(planner.counters().last_reason, Contains("stopped: a test"));
  owner.run({kStep.begin() + 3, kStep.begin() + 4});  // frees A
  CHECK_FALSE(planner.stopped());
  CHECK(host.unmaps.empty());
  owner.run({kStep.begin() + 4, kStep.end()});  // frees B: the arena is empty; the rest is the owner's
  CHECK(owner.served == 2);                      // A and B, before the stop
  CHECK(planner.stopped());
  CHECK(planner.counters().stopped);
  CHECK(host.unmaps.size() == 1);
  // Stopped: nothing is planned or served again, however often the step repeats.
  for (int s = 0; s < 6; ++s) owner.step(kStep);
  CHECK(owner.served == 0);
  CHECK(host.maps.size() == 1);
  CHECK(planner.counters().plans == 1);
  CHECK_FALSE(planner.free(owner.current[0].addr));
}

TEST_CASE("step planner: stop() while recording stops at once", "[step_plan][planner]") {
  Rig rig;
  auto& [host, planner, owner] = rig;
  owner.step(kStep);
  planner.stop("a test");
  CHECK(planner.stopped());
  CHECK(planner.counters().stopped);
  for (int s = 0; s < 6; ++s) owner.step(kStep);
  CHECK(planner.counters().plans == 0);
  CHECK(host.maps.empty());
}

TEST_CASE("step planner: a zero-byte request is no event and gets no address", "[step_plan][planner]") {
  // The engine gives no block for 0 bytes (null, and free(nullptr) does nothing): the planner leaves
  // such a request to its owner and does not count it as an event of the step.
  Rig one, zero;
  for (int s = 1; s <= 5; ++s) one.owner.step({A(1024), A(0), F(1), F(0)});
  CHECK(one.planner.counters().fallbacks == 0);
  CHECK(one.planner.counters().plans == 1);
  CHECK(one.host.maps.size() == 1);
  for (int s = 1; s <= 5; ++s) zero.owner.step({A(0), F(0)});
  CHECK(zero.host.maps.empty());
  CHECK(zero.planner.counters().plans == 0);
  // plan_step itself gives a zero-byte block round_bytes of its own.
  const auto plan = plan_step({A(1024), A(0), F(1), F(0)}, 512, nullptr);
  REQUIRE(plan);
  CHECK(plan->arena_bytes == 1536);
  CHECK(plan->offsets[0] != plan->offsets[1]);
}

// Options with a layout thread that waits until release() (or not at all, held == false).
struct HeldLayout {
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  StepPlanOptions options(bool held = true) {
    StepPlanOptions o;
    o.layout_thread = true;
    if (held) o.layout_hook = [g = gate] { g.wait(); };
    return o;
  }
  void release() { go.set_value(); }
};

// A rig whose planner has just found kStep (steps 2 and 3 are the same) and is laying it out on a
// thread held back until layout.release().
struct ArmedRig {
  HeldLayout layout;
  Rig rig{layout.options()};
  ArmedRig() {
    for (int s = 0; s < 3; ++s) rig.owner.step(kStep);
    rig.planner.mark_step();
    REQUIRE(rig.planner.laying_out());
  }
};

TEST_CASE("step planner: a layout on a thread of its own serves from the trough of the step it is done in",
          "[step_plan][planner][layout_thread]") {
  const auto plan = plan_step(kStep, 512, nullptr);
  REQUIRE(plan);
  REQUIRE(plan->trough == 2);
  HeldLayout layout;
  Rig rig(layout.options(false));
  auto& [host, planner, owner] = rig;
  for (int s = 0; s < 3; ++s) owner.step(kStep);
  CHECK_FALSE(planner.laying_out());
  planner.mark_step();  // steps 2 and 3 are the same: laid out on the thread
  CHECK(planner.laying_out());
  CHECK(planner.counters().laying_out);
  CHECK(planner.counters().plans == 0);
  planner.wait_for_layout();  // done before the step's first event: as without the thread
  CHECK_FALSE(planner.laying_out());
  CHECK(planner.counters().plans == 1);
  CHECK(planner.counters().layouts == 1);
  owner.unmarked_step(kStep);  // (marked above)
  CHECK(owner.served == 3);    // B, C, W from the trough on
  owner.step(kStep);
  CHECK(owner.served == 4);
  CHECK(planner.counters().fallbacks == 0);
  CHECK(host.maps == std::vector<std::size_t>{plan->arena_bytes});
}

TEST_CASE("step planner: a layout done past the trough serves from the next step's trough",
          "[step_plan][planner][layout_thread]") {
  ArmedRig armed;
  HeldLayout& layout = armed.layout;
  auto& [host, planner, owner] = armed.rig;
  // The step goes on while the layout is held back: A, free W, B, free A (past the trough, 2).
  const std::vector<StepEvent> head(kStep.begin(), kStep.begin() + 4), tail(kStep.begin() + 4, kStep.end());
  owner.unmarked_step(head);  // (marked above)
  CHECK(owner.served == 0);
  layout.release();
  planner.wait_for_layout();
  CHECK(planner.counters().plans == 1);
  CHECK_FALSE(planner.serving());
  owner.run(tail);
  CHECK(owner.served == 0);  // C and W come after the trough this step had already passed
  CHECK(host.maps.empty());
  owner.step(kStep);
  CHECK(owner.served == 3);  // the next step's trough: B, C, W
  owner.step(kStep);
  CHECK(owner.served == 4);
  CHECK(planner.counters().fallbacks == 0);
}

TEST_CASE("step planner: a plan that falls back while its layout is at work does not take it",
          "[step_plan][planner][layout_thread]") {
  ArmedRig armed;
  HeldLayout& layout = armed.layout;
  auto& [host, planner, owner] = armed.rig;
  auto changed = kStep;
  changed[0].size_bytes += 4096;
  owner.unmarked_step(changed);  // (marked above) differs at its first event: falls back
  CHECK(planner.counters().fallbacks == 1);
  layout.release();
  planner.wait_for_layout();
  CHECK(planner.counters().plans == 0);
  CHECK(planner.counters().layouts == 1);
  CHECK_FALSE(planner.serving());
  for (int s = 0; s < 3; ++s) owner.step(kStep);
  CHECK(owner.served == 0);
  CHECK(host.maps.empty());
}

TEST_CASE("step planner: a planner destroyed while its layout is at work waits for it",
          "[step_plan][planner][layout_thread]") {
  HeldLayout layout;
  std::atomic<bool> finished{false};
  StepPlanOptions options = layout.options(false);
  options.layout_hook = [g = layout.gate, &finished] {
    g.wait();
    finished.store(true);
  };
  std::thread releaser;
  {
    Rig rig(options);
    for (int s = 0; s < 3; ++s) rig.owner.step(kStep);
    rig.planner.mark_step();
    REQUIRE(rig.planner.laying_out());
    // Released 50 ms from now, while the planner is being destroyed: its destructor waits.
    releaser = std::thread([&layout] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      layout.release();
    });
  }
  CHECK(finished.load());
  releaser.join();
}

TEST_CASE("step planner: a child forked while a layout is at work neither waits for it nor takes it",
          "[step_plan][planner][layout_thread]") {
  auto armed = std::make_unique<ArmedRig>();
  HeldLayout& layout = armed->layout;
  StepPlanner& planner = armed->rig.planner;
  // Each child has no layout thread: a wait gives the layout up, and so does the destructor,
  // without joining a thread that is not there (glibc's fork marks the other threads as gone, so a
  // join would return there, but POSIX leaves it undefined; the alarm ends a child that hangs).
  for (const bool wait_first : {true, false}) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::alarm(10);
      bool ok = true;
      if (wait_first) {
        planner.wait_for_layout();
        ok = !planner.laying_out() && planner.counters().plans == 0 && !planner.serving();
      }
      armed.reset();
      ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    INFO("wait first: " << wait_first << ", status " << status);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // The parent's layout is still its own.
  layout.release();
  planner.wait_for_layout();
  CHECK(planner.counters().plans == 1);
}

namespace {

// A step of 2 x `blocks` events: blocks of varied sizes, each freed two allocations later, the
// last two freed in the next step (they live over its end).
std::vector<StepEvent> long_step(std::uint32_t blocks, std::uint64_t scale = 4096) {
  std::vector<StepEvent> step;
  for (std::uint32_t j = 0; j < blocks; ++j) {
    step.push_back(A(scale * (1 + (j * 7) % 13)));
    if (j == 0) step.push_back(F(blocks - 2, 1));
    if (j == 1) step.push_back(F(blocks - 1, 1));
    if (j >= 2) step.push_back(F(j - 2));
  }
  return step;
}

// The first of such steps: nothing of a step before to free.
std::vector<StepEvent> first_step(std::vector<StepEvent> step) {
  std::erase_if(step, [](const StepEvent& e) { return e.is_free && e.steps_back == 1; });
  return step;
}

}  // namespace

TEST_CASE("step planner: finds an unmarked step's length and serves the steps that repeat it", "[step_plan][detect]") {
  Rig rig({}, false);
  auto& [host, planner, owner] = rig;
  const auto step = long_step(48);  // 96 events
  REQUIRE(step.size() == 96);
  owner.unmarked_step(first_step(step));
  owner.unmarked_step(step);
  CHECK(planner.counters().detected_steps == 0);  // one whole repeat is not seen yet
  for (int s = 0; s < 5; ++s) owner.unmarked_step(step);
  CHECK(planner.counters().marks == 0);
  CHECK(planner.counters().detected_steps == 1);
  CHECK(planner.counters().step_events == 96);
  CHECK(planner.counters().plans == 1);
  CHECK(planner.counters().fallbacks == 0);
  CHECK(host.maps.size() == 1);
  CHECK(planner.serving());
  // The last steps are served whole, every block at the address its index had the step before.
  CHECK(owner.served == 48);
  CHECK(owner.same_address >= 48);
  CHECK(planner.counters().served_steps >= 2);
  // A step that differs falls back; the arena is given back once its blocks are freed.
  auto changed = step;
  changed[10].size_bytes += 4096;
  owner.unmarked_step(changed);
  CHECK(planner.counters().fallbacks == 1);
  CHECK_FALSE(planner.serving());
  CHECK_THAT(planner.counters().last_fallback, Contains("where the plan has"));
  owner.unmarked_step(step);
  CHECK(host.unmaps.size() == 1);
}

TEST_CASE("step planner: detection rests where nothing repeats, and finds a step that repeats after it wakes",
          "[step_plan][detect]") {
  StepPlanOptions options;
  options.awake_events = 1000;
  options.dormant_events = 3000;
  Rig rig(options, false);
  auto& [host, planner, owner] = rig;
  // Steps of one length whose sizes change every time: nothing repeats.
  for (std::uint64_t k = 0; k < 12; ++k) owner.unmarked_step(first_step(long_step(48, 4096 + 512 * k)));
  CHECK(planner.counters().detected_steps == 0);
  CHECK(planner.counters().dormant_periods == 1);  // after 1,000 events (of 1,152)
  CHECK(planner.counters().dormant);
  // The step now repeats. Dormant, the planner sees none of it; awake again (3,000 events after it
  // slept), it learns it afresh: the blocks of the steps before are unknown to it, so the first
  // step it records whole frees blocks it cannot place, and then the step is found and served.
  const auto step = long_step(48);
  for (int s = 0; s < 60 && planner.counters().plans == 0; ++s) owner.unmarked_step(step);
  CHECK_FALSE(planner.counters().dormant);
  CHECK(planner.counters().plans == 1);
  CHECK(planner.counters().dormant_periods == 1);
  for (int s = 0; s < 3; ++s) owner.unmarked_step(step);
  CHECK(planner.serving());
  CHECK(owner.served == 48);
  CHECK(planner.counters().fallbacks == 0);
  // While a plan serves (and after a plan is made or dropped) the planner does not rest.
  for (int s = 0; s < 40; ++s) owner.unmarked_step(step);
  CHECK(planner.counters().dormant_periods == 1);
  CHECK(planner.serving());
}

TEST_CASE("step planner: each rest with no plan between is twice as long as the one before, up to the cap",
          "[step_plan][detect]") {
  StepPlanOptions options;
  options.awake_events = 100;
  options.dormant_events = 200;
  options.dormant_doublings = 2;
  Rig rig(options, false);
  StepPlanner& planner = rig.planner;
  // Pairs of an allocation and its free, every size new: nothing ever repeats. The lengths of the
  // dormant runs (events after which the planner is dormant) are the rests.
  std::vector<std::uint64_t> rests;
  std::uint64_t run = 0;
  auto observe = [&] {
    if (planner.dormant()) {
      ++run;
    } else if (run != 0) {
      rests.push_back(std::exchange(run, 0));
    }
  };
  for (std::uint64_t i = 0; i < 2000 && rests.size() < 5; ++i) {
    const std::uintptr_t addr = 0x1000'0000 + i * 0x10'0000;
    CHECK_FALSE(planner.allocate(512 * (1 + i), 0));
    planner.note_allocated(addr);
    observe();
    CHECK_FALSE(planner.free(addr));
    observe();
  }
  CHECK(rests == std::vector<std::uint64_t>{200, 400, 800, 800, 800});
  CHECK(planner.counters().dormant_periods >= 5);
  CHECK(planner.counters().detected_steps == 0);
}

TEST_CASE("step planner: a mark wakes a dormant planner; marks then replace detection", "[step_plan][detect]") {
  StepPlanOptions options;
  options.awake_events = 500;
  options.dormant_events = 1000000;
  Rig rig(options, false);
  auto& [host, planner, owner] = rig;
  for (std::uint64_t k = 0; k < 8; ++k) owner.unmarked_step(first_step(long_step(48, 4096 + 512 * k)));
  REQUIRE(planner.counters().dormant);
  const auto step = long_step(48);
  for (int s = 0; s < 5; ++s) owner.step(step);  // marked
  CHECK_FALSE(planner.counters().dormant);
  CHECK(planner.counters().plans == 1);
  CHECK(planner.serving());
}

TEST_CASE("step planner: repeats shorter than min_step_events are loops inside a step, not steps", "[step_plan][detect]") {
  Rig rig({}, false);
  auto& [host, planner, owner] = rig;
  const auto loop = long_step(24);  // 48 events, below the default 64
  owner.unmarked_step(first_step(loop));
  for (int s = 0; s < 8; ++s) owner.unmarked_step(loop);
  CHECK(planner.counters().detected_steps == 0);
  CHECK(host.maps.empty());
  StepPlanOptions o;
  o.min_step_events = 32;
  Rig lower(o, false);
  lower.owner.unmarked_step(first_step(loop));
  for (int s = 0; s < 8; ++s) lower.owner.unmarked_step(loop);
  CHECK(lower.planner.counters().detected_steps == 1);
  CHECK(lower.planner.counters().step_events == 48);
}

TEST_CASE("step planner: detection is off when asked, and marks replace it", "[step_plan][detect]") {
  StepPlanOptions off;
  off.detect_steps = false;
  Rig quiet(off, false);
  quiet.owner.unmarked_step(first_step(long_step(48)));
  for (int s = 0; s < 6; ++s) quiet.owner.unmarked_step(long_step(48));
  CHECK(quiet.planner.counters().plans == 0);

  Rig rig({}, false);
  auto& [host, planner, owner] = rig;
  owner.unmarked_step(first_step(long_step(48)));
  for (int s = 0; s < 5; ++s) owner.unmarked_step(long_step(48));
  REQUIRE(planner.counters().detected_steps == 1);
  // The program starts marking: the detected plan is dropped and the marked steps are planned.
  owner.step(long_step(48));
  CHECK(planner.counters().fallbacks == 1);
  CHECK_THAT(planner.counters().last_fallback, Contains("marks replace detection"));
  for (int s = 0; s < 4; ++s) owner.step(long_step(48));
  CHECK(planner.counters().plans == 2);
  CHECK(planner.counters().marks == 5);
  CHECK(owner.served > 0);
}

TEST_CASE("step planner: an owner that cannot place a block at its planned address makes the plan fall back",
          "[step_plan][planner]") {
  Rig rig({}, false);
  auto& [host, planner, owner] = rig;
  owner.unmarked_step(first_step(long_step(48)));
  for (int s = 0; s < 5; ++s) owner.unmarked_step(long_step(48));
  REQUIRE(planner.serving());
  const auto addr = planner.allocate(4096, 0);
  REQUIRE(addr);
  planner.placement_failed();
  CHECK_FALSE(planner.serving());
  CHECK(planner.counters().fallbacks == 1);
  CHECK_THAT(planner.counters().last_fallback, Contains("could not place"));
  // The owner places it elsewhere: an ordinary block, not the arena's.
  planner.note_allocated(0x5000'0000'0000);
  CHECK_FALSE(planner.free(0x5000'0000'0000));
}

// ---- A random program and owner drive the planner end to end; invariants are checked after every call.
namespace {

constexpr std::uintptr_t kSimArenaBase = 0x7000'0000'0000;  // each map gets a fresh base above this
constexpr std::uintptr_t kSimOwnBase = 0x1000'0000'0000;    // the owner's own blocks, far below
constexpr std::uint64_t kSimRound = 512;
std::uint64_t sim_event = 0;  // events run so far (for failure messages)
bool sim_failed = false;

// Catch's CHECK costs too much for every call: evaluate first, report (with the event) only on failure.
#define SIM_CHECK(...) \
  do { if (!(__VA_ARGS__)) { sim_failed = true; CAPTURE(sim_event); CHECK(__VA_ARGS__); } } while (0)

std::uint64_t sim_uni(std::mt19937& rng, std::uint64_t lo, std::uint64_t hi) {
  return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
}
std::uint64_t sim_size(std::mt19937& rng) {  // 0 .. 8 MiB, some zero-byte
  return sim_uni(rng, 0, 99) < 6 ? 0 : sim_uni(rng, 1, std::uint64_t{1} << sim_uni(rng, 9, 23));
}
std::uint64_t sim_bytes(std::uint64_t size) { return round_up(std::max<std::uint64_t>(size, 1), kSimRound); }

// The owner's memory for arenas: a fresh base per map, refused at random; checks when it is asked.
struct SimHost final : StepArenaHost {
  std::mt19937* rng = nullptr;
  unsigned refuse_percent = 0;
  const std::size_t* arena_live = nullptr;  // the owner's arena blocks live
  std::uintptr_t base = 0;
  std::size_t size = 0;  // the arena mapped now (0: none)
  std::uint64_t maps = 0, refusals = 0, unmaps = 0;
  std::optional<std::uintptr_t> map_arena(std::size_t size_bytes, StreamId) override {
    SIM_CHECK(size == 0);  // never two arenas at once
    SIM_CHECK(size_bytes > 0);
    if (sim_uni(*rng, 0, 99) < refuse_percent) return ++refusals, std::nullopt;
    base = kSimArenaBase + (maps++ << 36);
    size = size_bytes;
    return base;
  }
  void unmap_arena(std::uintptr_t b, std::size_t s) override {
    SIM_CHECK((size != 0 && b == base && s == size));  // the arena mapped, as mapped
    SIM_CHECK(*arena_live == 0);  // no arena block live (the one being freed is not counted)
    ++unmaps;
    base = size = 0;
  }
};

struct SimBlock {
  std::uintptr_t addr = 0;  // 0: a zero-byte request (no block)
  std::uint64_t bytes = 0;
  bool arena = false, live = false;
};

// The owner: places what the planner leaves to it in its own memory (a cache of freed blocks by
// size, else a bump pointer; or, after a fallback, the arena's free bytes), knows which blocks the
// plan placed in the arena, and checks every answer.
struct SimOwner {
  StepPlanner& planner;
  SimHost& host;
  std::mt19937& rng;
  unsigned fail_per_mille = 0;  // planned placements the owner reports failed
  bool into_arena = false;  // after a fallback, places some of its own blocks in the arena's free bytes
  std::map<std::uintptr_t, std::pair<std::uint64_t, bool>> live;  // address -> bytes, in the arena
  std::size_t arena_live = 0;
  std::map<std::uint64_t, std::vector<std::uintptr_t>> cache;
  std::map<std::uintptr_t, std::pair<std::uint64_t, StreamId>> used;  // arena blocks of this mapping, ever
  std::uint64_t used_map = 0;  // the mapping `used` is of (host.maps then)
  std::uintptr_t bump = kSimOwnBase;
  std::uint64_t arena_placements = 0, placement_failures = 0, own_in_arena = 0, marks = 0, hinted = 0;

  SimOwner(StepPlanner& p, SimHost& h, std::mt19937& r) : planner(p), host(h), rng(r) {}
  void check() const {
    const StepPlanCounters& c = planner.counters();
    SIM_CHECK(c.served_allocations == arena_placements);
    SIM_CHECK(c.marks == marks);
    SIM_CHECK(c.arenas_mapped == host.maps);
    SIM_CHECK(c.arena_bytes == host.size);
    SIM_CHECK(c.fallbacks <= c.plans + host.refusals);
    SIM_CHECK((c.fallbacks <= c.plans && c.plans <= c.fallbacks + 1));  // one plan at a time, falls back once
    if (planner.serving()) SIM_CHECK(c.plans == c.fallbacks + 1);
    if (host.size == 0) SIM_CHECK(arena_live == 0);
  }
  void place(std::uintptr_t addr, std::uint64_t bytes, bool arena) {
    const auto next = live.lower_bound(addr);  // no two live blocks share a byte
    SIM_CHECK((next == live.end() || addr + bytes <= next->first));
    SIM_CHECK((next == live.begin() || std::prev(next)->first + std::prev(next)->second.first <= addr));
    live[addr] = {bytes, arena};
    arena_live += arena;
  }
  std::uintptr_t arena_gap(std::uint64_t bytes) const {  // the lowest free bytes of the arena that hold `bytes`
    std::uintptr_t at = host.base;
    for (auto it = live.lower_bound(host.base); it != live.end() && it->first < host.base + host.size; ++it) {
      if (it->first >= at + bytes) break;
      at = std::max(at, it->first + it->second.first);
    }
    return at + bytes <= host.base + host.size ? at : 0;
  }
  SimBlock allocate(std::uint64_t size, StreamId stream) {
    ++sim_event;
    const auto planned = planner.allocate(size, stream);
    check();
    if (size == 0) {  // no block: no note_allocated, no free
      SIM_CHECK(!planned);
      return {};
    }
    const std::uint64_t bytes = sim_bytes(size);
    if (planned) {
      SIM_CHECK((planner.serving() && planner.in_arena(*planned) && *planned % kSimRound == 0));
      SIM_CHECK((host.size != 0 && *planned >= host.base && *planned + bytes <= host.base + host.size));
      if (used_map != host.maps) used.clear(), used_map = host.maps;
      // Blocks of different streams never share arena bytes (no events are needed between them).
      for (const auto& [a, u] : used)
        if (a < *planned + bytes && *planned < a + u.first) SIM_CHECK(u.second == stream);
      used[*planned] = {bytes, stream};
      // The hint: a block of the arena next to the planned one, on the side it says, with no block
      // the plan placed between them. (It need not be live: in the first step served the blocks
      // allocated before the arena live elsewhere.)
      if (const StepPlacementHint h = planner.placement_hint(); h.neighbour != 0) {
        SIM_CHECK(planner.in_arena(h.neighbour));
        SIM_CHECK(h.neighbour != *planned);
        SIM_CHECK(h.above == (h.neighbour > *planned));
        if (const auto it = live.find(h.neighbour); it != live.end() && it->second.second) {
          ++hinted;
          SIM_CHECK((h.above ? h.neighbour >= *planned + bytes : h.neighbour + it->second.first <= *planned));
          const auto lo = live.upper_bound(std::min(h.neighbour, *planned));
          const auto hi = live.lower_bound(std::max(h.neighbour, *planned));
          for (auto b = lo; b != hi; ++b) SIM_CHECK(!b->second.second);
        }
      }
      if (sim_uni(rng, 0, 999) >= fail_per_mille) {
        place(*planned, bytes, true);
        ++arena_placements;
        planner.note_allocated(*planned);
        check();
        return {*planned, bytes, true, true};
      }
      ++placement_failures;
      const std::uint64_t before = planner.counters().fallbacks;
      planner.placement_failed();
      check();
      SIM_CHECK((!planner.serving() && planner.counters().fallbacks == before + 1));  // the plan falls back
    }
    // After a fallback, some go in the free bytes of the arena that drains: not the arena's blocks.
    const bool draining = host.size != 0 && !planner.serving();
    std::uintptr_t addr = into_arena && draining && sim_uni(rng, 0, 1) ? arena_gap(bytes) : 0;
    if (auto& free_list = cache[bytes]; addr == 0 && !free_list.empty()) {
      addr = free_list.back();
      free_list.pop_back();
    } else if (addr == 0) {
      addr = bump;
      bump += bytes;
    }
    own_in_arena += addr >= kSimArenaBase;
    place(addr, bytes, false);
    planner.note_allocated(addr);
    check();
    return {addr, bytes, false, true};
  }
  void release(SimBlock& b) {
    if (!b.live) return;
    b.live = false;
    ++sim_event;
    const auto it = live.find(b.addr);
    SIM_CHECK(it != live.end());  // the planner's answers never lose a block
    if (it == live.end()) return;
    arena_live -= it->second.second;
    live.erase(it);
    SIM_CHECK(planner.free(b.addr) == b.arena);
    if (b.addr < kSimArenaBase) cache[b.bytes].push_back(b.addr);  // (arena bytes are found by arena_gap)
    check();
  }
};

enum SimKind : std::uint8_t { kSimAlloc, kSimFree, kSimFreePrev };
struct SimOp {
  SimKind kind = kSimAlloc;
  std::uint32_t slot = 0;  // the allocation (of this step, or of the step before for kSimFreePrev)
  std::uint64_t size = 0;
  StreamId stream = 0;
  bool once = false;  // allocated at the pattern's first run only, and never freed
};

// A step: allocations and frees in random order; what is live at the end is freed there, or early
// in the next step (mostly before its own next instance); a few blocks are allocated once.
std::vector<SimOp> sim_pattern(std::mt19937& rng, std::uint32_t min_allocs, std::uint32_t max_allocs) {
  const StreamId streams = sim_uni(rng, 1, 2);
  const auto allocs = static_cast<std::uint32_t>(sim_uni(rng, min_allocs, max_allocs));
  std::vector<SimOp> ops;
  std::vector<std::size_t> at;
  std::vector<std::uint32_t> live;
  while (at.size() < allocs) {
    if (!live.empty() && sim_uni(rng, 0, 99) < 45) {
      std::swap(live[sim_uni(rng, 0, live.size() - 1)], live.back());
      ops.push_back({kSimFree, live.back()});
      live.pop_back();
    } else {
      live.push_back(static_cast<std::uint32_t>(at.size()));
      at.push_back(ops.size());
      ops.push_back({kSimAlloc, live.back(), sim_size(rng), sim_uni(rng, 0, streams - 1)});
    }
  }
  std::vector<std::pair<std::size_t, SimOp>> keyed;  // 2p + 1: op p; 2q: before op q
  for (std::size_t p = 0; p < ops.size(); ++p) keyed.emplace_back(2 * p + 1, ops[p]);
  for (std::uint32_t j : live) {
    const auto r = sim_uni(rng, 0, 99);
    if (r < 60) keyed.emplace_back(2 * ops.size() + 1, SimOp{kSimFree, j});
    else keyed.emplace_back(2 * sim_uni(rng, 0, r < 92 ? at[j] : ops.size()), SimOp{kSimFreePrev, j});
  }
  for (auto k = sim_uni(rng, 0, 2); k > 0; --k)
    keyed.emplace_back(2 * sim_uni(rng, 0, ops.size()),
                       SimOp{kSimAlloc, allocs + std::uint32_t(k), sim_size(rng), 0, true});
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  ops.clear();
  for (const auto& [key, op] : keyed) ops.push_back(op);
  return ops;
}

// A step that differs: a size or stream changed, two frees swapped, an extra allocation, an event
// dropped, or the step ended early.
void sim_perturb(std::vector<SimOp>& ops, std::mt19937& rng, std::uint32_t& fresh_slot) {
  if (ops.empty()) return;
  auto pick_alloc = [&]() -> SimOp* {
    for (int t = 0; t < 32; ++t)
      if (SimOp& o = ops[sim_uni(rng, 0, ops.size() - 1)]; o.kind == kSimAlloc) return &o;
    return nullptr;
  };
  switch (sim_uni(rng, 0, 6)) {
    case 0: if (SimOp* o = pick_alloc()) o->size = sim_size(rng); break;
    case 1: if (SimOp* o = pick_alloc()) o->stream ^= 1; break;
    case 2:
    case 3: {  // twice as likely: two frees swapped, the second of a block live at the first
      std::map<std::uint32_t, bool> allocated;  // slots live before the first
      std::vector<std::size_t> later;
      std::size_t i = sim_uni(rng, 0, ops.size() - 1);
      for (std::size_t k = 0; k < ops.size(); ++k) {
        if (ops[k].kind == kSimAlloc && k < i) allocated[ops[k].slot] = true;
        if (ops[k].kind == kSimFree && k < i) allocated.erase(ops[k].slot);
        if (ops[k].kind != kSimAlloc && k >= i && (ops[k].kind == kSimFreePrev || allocated.count(ops[k].slot)))
          later.push_back(k);
      }
      if (later.size() >= 2) std::swap(ops[later[0]], ops[later[sim_uni(rng, 1, later.size() - 1)]]);
      break;
    }
    case 4: {
      const std::size_t p = sim_uni(rng, 0, ops.size());
      ops.insert(ops.begin() + p, SimOp{kSimAlloc, fresh_slot, sim_size(rng), 0});
      if (sim_uni(rng, 0, 1)) ops.insert(ops.begin() + sim_uni(rng, p + 1, ops.size()), SimOp{kSimFree, fresh_slot});
      ++fresh_slot;
      break;
    }
    case 5: ops.erase(ops.begin() + sim_uni(rng, 0, ops.size() - 1)); break;
    default: ops.resize(sim_uni(rng, 0, ops.size() - 1)); break;
  }
}

}  // namespace

TEST_CASE("step planner: a random program and owner see no overlap, no stray arena address, consistent counters",
          "[step_plan][planner][property]") {
  sim_event = 0;
  sim_failed = false;
  std::map<std::string, std::uint64_t> total;  // what the seeds exercised, over all of them
  for (unsigned seed = 1; seed <= 32 && !sim_failed; ++seed) {
    std::mt19937 rng(seed * 7919u);
    const bool marked = seed % 2 == 0;
    const bool short_steps = seed % 8 >= 6;  // steps of ~24-50 events, min_step_events lowered
    StepPlanOptions options;
    if (short_steps) options.min_step_events = 16;
    if (seed % 5 == 3) {  // detection rests often, for a while (blocks live across it become unknown)
      options.awake_events = 700;
      options.dormant_events = 500;
    }
    SimHost host;
    host.rng = &rng;
    host.refuse_percent = seed % 3 == 0 ? 25 : 3;  // the host refuses arenas: often in a third of the seeds
    StepPlanner planner(host, options);
    SimOwner owner{planner, host, rng};
    host.arena_live = &owner.arena_live;
    owner.fail_per_mille = seed % 3 == 2 ? 20 : 1;  // ~2% of planned placements fail, in a third of the seeds
    owner.into_arena = seed % 4 < 2;  // as the replay's owner may, whose arena is a range of its own memory
    const std::uint32_t lo = short_steps ? 12 : 40, hi = short_steps ? 24 : 140;
    std::vector<SimOp> patterns[2] = {sim_pattern(rng, lo, hi), sim_pattern(rng, lo, hi)};
    bool ran[2] = {false, false};
    std::uint32_t fresh_slot = 1u << 20;
    const auto steps = sim_uni(rng, 15, 40);
    const auto mark_from = !marked ? steps : seed % 3 == 1 ? sim_uni(rng, 2, 6) : 0;  // some mark only later
    std::uint64_t other_left = 0;  // steps left of the second pattern
    std::map<std::uint32_t, SimBlock> current, previous;
    std::vector<SimBlock> forever;
    INFO("seed " << seed << (marked ? " marked" : " unmarked"));
    for (std::uint64_t s = 0; s < steps && !sim_failed; ++s) {
      if (s >= mark_from) {
        planner.mark_step();
        ++owner.marks;
        owner.check();
      }
      if (other_left == 0 && s > 4 && sim_uni(rng, 0, 99) < 6) other_left = sim_uni(rng, 3, 8);
      const int which = other_left > 0 ? 1 : 0;
      other_left -= other_left > 0;
      std::vector<SimOp> ops = patterns[which];
      if (ran[which]) std::erase_if(ops, [](const SimOp& o) { return o.once; });
      ran[which] = true;
      const bool perturbed = sim_uni(rng, 0, 99) < (planner.serving() ? 30 : 10);  // what matters most: while served
      if (perturbed) sim_perturb(ops, rng, fresh_slot);
      INFO("step " << s << ", pattern " << which << (perturbed ? " perturbed" : "") << ", " << ops.size() << " ops");
      for (const SimOp& o : ops) {
        if (o.kind == kSimAlloc) {
          SimBlock b = owner.allocate(o.size, o.stream);
          (o.once ? forever.emplace_back() : current[o.slot]) = b;
        } else if (auto& from = o.kind == kSimFree ? current : previous; from.count(o.slot)) {
          owner.release(from[o.slot]);
        }
      }
      for (auto& [slot, b] : previous) owner.release(b);  // what the step before left live
      previous = std::move(current);
      current.clear();
    }
    for (auto& [slot, b] : previous) owner.release(b);
    for (SimBlock& b : forever) owner.release(b);
    SIM_CHECK((owner.live.empty() && owner.arena_live == 0));
    const StepPlanCounters& c = planner.counters();
    total["plans"] += c.plans;
    total["detected"] += c.detected_steps;
    total[marked ? "served marked" : "served detected"] += c.served_allocations;
    total["served steps"] += c.served_steps;
    total["fallbacks"] += c.fallbacks;
    total["unmaps"] += host.unmaps;
    total["refusals"] += host.refusals;
    total["placement failures"] += owner.placement_failures;
    total["own blocks in an arena's range"] += owner.own_in_arena;
    total["placements with a live neighbour"] += owner.hinted;
    total["dormant periods"] += c.dormant_periods;
  }
  CHECK_FALSE(sim_failed);
  std::string summary = std::to_string(sim_event) + " events";
  for (const auto& [what, n] : total) summary += ", " + std::to_string(n) + " " + what;
  INFO(summary);
  // The test exercised every path it checks: it cannot pass vacuously.
  CHECK(total["plans"] >= 20);
  CHECK(total["served steps"] >= 20);  // plans served whole steps (blocks live over a step's end included)
  for (const char* what : {"detected", "served marked", "served detected", "fallbacks", "unmaps", "refusals",
                           "placement failures", "own blocks in an arena's range", "placements with a live neighbour", "dormant periods"})
    CHECK(total[what] > 0);
}

#undef SIM_CHECK

TEST_CASE("step planner: a step found at the event that broke the last plan starts after that event",
          "[step_plan][detect]") {
  // A cycle of ten equal inner steps (A: 80 events) and a tail B that starts with a free. The plan
  // for A falls back at B's first event; that same event completes two repeats of the whole cycle
  // (882 events), whose plan must start at the event after it.
  FakeHost host;
  StepPlanner planner(host);
  std::uintptr_t own = 0x1000'0000'0000;
  auto alloc = [&](std::size_t bytes) {
    const auto planned = planner.allocate(bytes, 0);
    const std::uintptr_t addr = planned ? *planned : (own += std::uintptr_t{1} << 24);
    planner.note_allocated(addr);
    return addr;
  };
  std::uintptr_t z = alloc(1 << 20);
  auto cycle_of = [&](bool varied) {
    for (int a = 0; a < 10; ++a) {
      std::uintptr_t prev = 0;
      for (int i = 0; i < 40; ++i) {
        const std::uintptr_t x = alloc(512 * (i + 1) + (varied && a == 9 && i == 20 ? 512 : 0));
        if (prev) planner.free(prev);
        prev = x;
      }
      planner.free(prev);
    }
    planner.free(z);
    std::vector<std::uintptr_t> tail;
    for (int i = 0; i < 40; ++i) tail.push_back(alloc(12288 + i * 512));
    for (const std::uintptr_t x : tail) planner.free(x);
    z = alloc(1 << 20);
  };
  for (int cycle = 0; cycle < 6; ++cycle) {
    cycle_of(cycle == 1);  // one inner step of the second cycle differs: its plan falls back early once
    INFO("cycle " << cycle << ": " << planner.counters().last_fallback);
    // Never compared one event off: a fallback is at a step's first event, or at the changed size.
    CHECK(planner.counters().last_fallback.find("event 1 of a step") == std::string::npos);
  }
  const StepPlanCounters& c = planner.counters();
  CHECK(c.step_events == 882);  // the whole cycle, found once the inner plans stop hiding it
  CHECK(planner.serving());
  const auto fallbacks = c.fallbacks;
  const auto served = c.served_allocations;
  cycle_of(false);  // one more cycle: served whole, no fallback
  CHECK(c.fallbacks == fallbacks);
  CHECK(c.served_allocations - served == 441);  // every allocation of the cycle
}
