// recycle_budget_policy.h: the token bucket of driver time that bounds how much time physical page
// recycling may spend.
#include <cstddef>
#include <cstdint>

#include "catch.h"
#include "recycle_budget_policy.h"

using namespace gpumem::alloc::policy;
using gpumem::alloc::kNoLimit;

namespace {
constexpr std::int64_t kMs = 1'000'000;  // ns
constexpr std::int64_t kS = 1000 * kMs;
}  // namespace

TEST_CASE("recycle budget: unlimited never denies and ignores charges", "[policy][recycle_budget]") {
  RecycleBudget b(RecycleBudgetRules{1.0, 0});
  CHECK(b.rules().unlimited());
  CHECK(b.allows(0));
  b.charge(10 * kS);
  CHECK(b.allows(1));
  CHECK(b.spent_ns() == 0);
  CHECK(b.denials() == 0);
}

TEST_CASE("recycle budget: starts with the burst, then runs on the fraction of elapsed time", "[policy][recycle_budget]") {
  RecycleBudget b(RecycleBudgetRules{0.01, 5 * kMs});
  CHECK(b.tokens_ns() == Approx(5.0 * kMs));
  CHECK(b.allows(100 * kS));  // the first call starts the clock: no refill for the time before it
  b.charge(6 * kMs);          // one growth may overdraw: 1 ms of debt
  CHECK(b.spent_ns() == 6 * kMs);
  CHECK_FALSE(b.allows(100 * kS + 50 * kMs));  // +0.5 ms: still 0.5 ms in debt
  CHECK(b.denials() == 1);
  CHECK(b.allows(100 * kS + 150 * kMs));  // +1.5 ms in all: 0.5 ms left
  CHECK(b.tokens_ns() == Approx(0.5 * kMs));
}

TEST_CASE("recycle budget: holds at most the burst, however long recycling was idle", "[policy][recycle_budget]") {
  RecycleBudget b(RecycleBudgetRules{0.005, 10 * kMs});
  CHECK(b.allows(0));
  b.charge(10 * kMs);
  CHECK_FALSE(b.allows(0));
  CHECK(b.allows(3600 * kS));
  CHECK(b.tokens_ns() == Approx(10.0 * kMs));
}

TEST_CASE("recycle budget: a clock that goes backwards refills nothing", "[policy][recycle_budget]") {
  RecycleBudget b(RecycleBudgetRules{0.5, 4 * kMs});
  CHECK(b.allows(10 * kS));
  b.charge(4 * kMs);
  CHECK_FALSE(b.allows(5 * kS));
  CHECK_FALSE(b.allows(10 * kS));  // the clock's high mark is still 10 s
  CHECK(b.allows(10 * kS + 2 * kMs));
  CHECK(b.tokens_ns() == Approx(1.0 * kMs));
}

TEST_CASE("recycle budget: over a long steady run, spending stays within the fraction plus the burst",
          "[policy][recycle_budget]") {
  // A workload that would recycle 1 ms every 10 ms step (10% of its time) under a 1% budget.
  const double fraction = 0.01;
  const std::int64_t burst = 20 * kMs;
  RecycleBudget b(RecycleBudgetRules{fraction, burst});
  std::int64_t now = 0;
  int recycled_steps = 0;
  for (int step = 0; step < 10'000; ++step) {
    now += 10 * kMs;
    if (b.allows(now)) {
      b.charge(kMs);
      ++recycled_steps;
    }
  }
  const double spent = static_cast<double>(b.spent_ns());
  CHECK(spent <= fraction * static_cast<double>(now) + static_cast<double>(burst) + static_cast<double>(kMs));
  CHECK(spent >= 0.9 * fraction * static_cast<double>(now));  // and it does spend what it may
  CHECK(recycled_steps > 900);
  CHECK(recycled_steps < 1100);
}

TEST_CASE("memory guard: bought memory may grow to slack x the rest of the footprint", "[policy][recycle_budget]") {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // 1000 MiB reserved, none bought: 2% of it may be bought.
  CHECK(within_slack(0, 20 * kMiB, 1000 * kMiB, 0.02));
  CHECK_FALSE(within_slack(0, 21 * kMiB, 1000 * kMiB, 0.02));
  // 10 MiB bought already: 10 + 9 <= 0.02 x 990, 10 + 10 is not.
  CHECK(within_slack(10 * kMiB, 9 * kMiB, 1000 * kMiB, 0.02));
  CHECK_FALSE(within_slack(10 * kMiB, 10 * kMiB, 1000 * kMiB, 0.02));
  // Slack 0 buys nothing; slack 1 buys up to the rest of the footprint.
  CHECK_FALSE(within_slack(0, 2 * kMiB, 1000 * kMiB, 0.0));
  CHECK(within_slack(0, 1000 * kMiB, 1000 * kMiB, 1.0));
  // More counted than reserved (a release gave memory back): counted as all of it, nothing left.
  CHECK_FALSE(within_slack(2000 * kMiB, 2 * kMiB, 1000 * kMiB, 0.5));
}

TEST_CASE("bought estimate: the counted purchases, at most the footprint beyond the most ever in use",
          "[policy][recycle_budget]") {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // Warm-up: growth past the budget counted 464 MiB created beyond its recycling plans, but the
  // footprint is only 12 MiB above the most memory in use so far: recycling alone would have
  // reserved at least that much too, so at most 12 MiB was bought.
  CHECK(bought_estimate(464 * kMiB, 24'924 * kMiB, 24'912 * kMiB) == 12 * kMiB);
  // Steady state with memory cached beyond the peak: the count is the tighter bound.
  CHECK(bought_estimate(100 * kMiB, 25'000 * kMiB, 24'000 * kMiB) == 100 * kMiB);
  // Nothing counted: nothing bought, however much is cached.
  CHECK(bought_estimate(0, 25'000 * kMiB, 20'000 * kMiB) == 0);
  // Reserved below the high mark (a release emptied the cache after the peak): nothing bought.
  CHECK(bought_estimate(50 * kMiB, 10'000 * kMiB, 24'000 * kMiB) == 0);
  // The guard against the estimate lets the budget buy what the raw count would have refused.
  const std::size_t counted = 464 * kMiB, reserved = 24'924 * kMiB, high = 24'912 * kMiB;
  CHECK_FALSE(within_slack(counted, 54 * kMiB, reserved, 0.02));
  CHECK(within_slack(bought_estimate(counted, reserved, high), 54 * kMiB, reserved, 0.02));
}

TEST_CASE("memory guard with a ceiling: buys only while the footprint stays near the most ever in use",
          "[policy][recycle_budget]") {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  RecycleBudgetRules rules;
  rules.fraction = 0.0;
  rules.slack = 0.008;
  rules.ceiling = 0.015;
  // A large footprint close to the memory in use (1000 MiB reserved, 995 ever in use): buying
  // 4 MiB passes both bounds (slack: 4 <= 8; ceiling: 1000 + 4 <= 1.015 x 995).
  CHECK(within_guard(0, 4 * kMiB, 4 * kMiB, 1000 * kMiB, 995 * kMiB, rules));
  // The slack bound alone still refuses what passes the ceiling (9 MiB > 0.008 x 1000).
  CHECK_FALSE(within_guard(0, 9 * kMiB, 9 * kMiB, 1000 * kMiB, 995 * kMiB, rules));
  // A small, granule-bound footprint already 3% above the memory in use (the decoding traces):
  // the slack would let it buy 4 MiB on top (4 <= 0.008 x 1000), the ceiling does not.
  CHECK(within_slack(0, 4 * kMiB, 1000 * kMiB, rules.slack));
  CHECK_FALSE(within_guard(0, 4 * kMiB, 4 * kMiB, 1000 * kMiB, 970 * kMiB, rules));
  // The ceiling counts all the growth creates without recycling, not only the part bought.
  CHECK(within_guard(0, 2 * kMiB, 8 * kMiB, 1000 * kMiB, 995 * kMiB, rules));
  CHECK_FALSE(within_guard(0, 2 * kMiB, 12 * kMiB, 1000 * kMiB, 995 * kMiB, rules));
  // Ceiling 0: the slack bound alone decides (the rule before the ceiling).
  rules.ceiling = 0.0;
  CHECK(within_guard(0, 4 * kMiB, 4 * kMiB, 1000 * kMiB, 970 * kMiB, rules));
  CHECK(within_guard(0, 4 * kMiB, 4 * kMiB, 1000 * kMiB, 0, rules));
  // No high mark yet and a ceiling: nothing may be bought.
  rules.ceiling = 0.5;
  CHECK_FALSE(within_guard(0, 2 * kMiB, 2 * kMiB, 1000 * kMiB, 0, rules));
}

TEST_CASE("recycle budget 0 with no burst: no time for recycling, whatever the clock says", "[policy][recycle_budget]") {
  RecycleBudget b(RecycleBudgetRules{0.0, 0});
  CHECK(b.rules().none());
  CHECK_FALSE(b.rules().unlimited());
  CHECK_FALSE(b.allows(0));
  CHECK_FALSE(b.allows(std::int64_t{3600} * 1'000'000'000));
  CHECK(b.denials() == 2);
  // A burst with no refill: the burst is spent once, then nothing.
  RecycleBudget burst(RecycleBudgetRules{0.0, 5 * kMs});
  CHECK_FALSE(burst.rules().none());
  CHECK(burst.allows(0));
  burst.charge(5 * kMs);
  CHECK_FALSE(burst.allows(std::int64_t{3600} * 1'000'000'000));
}

TEST_CASE("headroom rule: create instead of recycling while the footprint stays within the headroom",
          "[policy][recycle_budget][headroom]") {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // 1000 MiB ever in use at once, headroom 1%: the footprint may grow to 1010 MiB by creating.
  CHECK(within_headroom(1000 * kMiB, 10 * kMiB, 1000 * kMiB, 0.01));
  CHECK_FALSE(within_headroom(1000 * kMiB, 12 * kMiB, 1000 * kMiB, 0.01));
  CHECK(within_headroom(990 * kMiB, 20 * kMiB, 1000 * kMiB, 0.01));
  // A footprint already past the headroom (memory cached from an earlier, larger shape) recycles.
  CHECK_FALSE(within_headroom(1020 * kMiB, 2 * kMiB, 1000 * kMiB, 0.01));
  // Headroom 0 is off: growth always recycles first, even when it would add nothing past the mark.
  CHECK_FALSE(within_headroom(900 * kMiB, 2 * kMiB, 1000 * kMiB, 0.0));
  // Nothing in use yet: nothing is within any headroom.
  CHECK_FALSE(within_headroom(0, 2 * kMiB, 0, 0.5));
}

namespace {
// The default guard's bounds (recycle_slack, recycle_ceiling) with the churn allowance on at `churn`.
RecycleBudgetRules churn_rules(double churn) {
  RecycleBudgetRules rules;
  rules.slack = 0.008;
  rules.ceiling = 0.015;
  rules.churn = churn;
  rules.churn_allowance = 0.1;
  return rules;
}
}  // namespace

TEST_CASE("churn meter: a steady rate of driver time reads as that share of the time", "[policy][recycle_budget][churn]") {
  ChurnMeter m;
  CHECK(m.share(0) == 0.0);
  // 0.3 ms of moves every ms for a second (ten time constants): the decaying sum settles at 0.3.
  for (std::int64_t t = 1; t <= 1000; ++t) m.note_recycling(t * kMs, 3 * kMs / 10);
  CHECK(m.share(1000 * kMs) == Approx(0.3).margin(0.01));
  // Idle for one time constant: e^-1 of it; for ten: nothing left to speak of.
  CHECK(m.share(1000 * kMs + ChurnMeter::kWindowNs) == Approx(0.3 / 2.718281828).margin(0.01));
  CHECK(m.share(1000 * kMs + 10 * ChurnMeter::kWindowNs) < 0.0001);
  // A clock that goes backwards decays nothing.
  CHECK(m.share(500 * kMs) == m.share(1000 * kMs));
}

TEST_CASE("churn meter: the allowance opens at the share, closes below a quarter of it", "[policy][recycle_budget][churn]") {
  const RecycleBudgetRules rules = churn_rules(0.2);
  ChurnMeter m;
  m.note_recycling(10 * kMs, 10 * kMs);  // 10 ms of moves: a share of 0.1
  CHECK_FALSE(m.open(10 * kMs, rules));
  m.note_recycling(20 * kMs, 15 * kMs);  // 0.1 e^-0.1 + 0.15: 0.24
  CHECK(m.open(20 * kMs, rules));
  CHECK(m.openings() == 1);
  // Between a quarter of the share and the share it stays open; below a quarter it closes.
  const std::int64_t mid = 20 * kMs + ChurnMeter::kWindowNs / 2;  // 0.24 e^-0.5: 0.146
  CHECK(m.share(mid) < rules.churn);
  CHECK(m.open(mid, rules));
  const std::int64_t late = 20 * kMs + 2 * ChurnMeter::kWindowNs;  // 0.24 e^-2: 0.032
  CHECK_FALSE(m.open(late, rules));
  // Closed, the same middling share does not open it again.
  m.note_recycling(late + kMs, 12 * kMs);  // 0.032 e^-0.01 + 0.12: 0.152
  CHECK_FALSE(m.open(late + kMs, rules));
  CHECK(m.openings() == 1);
  // Off: no churn share, or no allowance, never opens.
  RecycleBudgetRules off = rules;
  off.churn = 0.0;
  ChurnMeter busy;
  busy.note_recycling(kMs, 90 * kMs);
  CHECK_FALSE(busy.open(kMs, off));
  off = rules;
  off.churn_allowance = 0.0;
  CHECK_FALSE(busy.open(kMs, off));
  CHECK(busy.open(kMs, rules));
}

TEST_CASE("churn meter: a clock that stands still never opens the allowance", "[policy][recycle_budget][churn]") {
  // SimSource's clock reads 0 and its calls take no time: nothing is ever noted as spent.
  const RecycleBudgetRules rules = churn_rules(0.01);
  ChurnMeter m;
  for (int i = 0; i < 1000; ++i) m.note_recycling(0, 0);
  CHECK(m.share(0) == 0.0);
  CHECK_FALSE(m.open(0, rules));
}

TEST_CASE("churn meter: the allowance widens both bounds of the memory guard", "[policy][recycle_budget][churn]") {
  RecycleBudgetRules rules = churn_rules(0.3);
  const RecycleBudgetRules wide = ChurnMeter::allowed_rules(rules);
  CHECK(wide.slack == Approx(0.108));
  CHECK(wide.ceiling == Approx(0.115));
  CHECK(wide.fraction == rules.fraction);
  // 40 MiB on a 1,124 MiB footprint that is all in use: refused by the usual bounds, bought with
  // the allowance.
  constexpr std::size_t MiB = std::size_t{1} << 20;
  CHECK_FALSE(within_guard(0, 40 * MiB, 40 * MiB, 1124 * MiB, 1124 * MiB, rules));
  CHECK(within_guard(0, 40 * MiB, 40 * MiB, 1124 * MiB, 1124 * MiB, wide));
  // No ceiling stays no ceiling; the slack stops at 1.
  rules.ceiling = 0.0;
  rules.slack = 0.95;
  CHECK(ChurnMeter::allowed_rules(rules).ceiling == 0.0);
  CHECK(ChurnMeter::allowed_rules(rules).slack == 1.0);
}

TEST_CASE("memory guard's decision: cap first, then the guard, the churn allowance asked only when it refuses",
          "[policy][recycle_budget][churn]") {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  const RecycleBudgetRules rules = churn_rules(0.3);  // slack 0.008, ceiling 0.015, allowance 0.1
  int asked = 0;
  auto open = [&] { ++asked; return true; };
  auto closed = [&] { ++asked; return false; };
  // 4 MiB bought on a 1,000 MiB footprint, 995 MiB ever in use: within the usual bounds, so the
  // growth creates and the allowance's clock is not read.
  GuardInputs in{0, 4 * MiB, 4 * MiB, 1000 * MiB, 995 * MiB, kNoLimit};
  CHECK_FALSE(guard_forces_recycling(in, rules, open));
  CHECK(asked == 0);
  // A growth that buys nothing never must recycle, whatever the bounds say.
  GuardInputs nothing{0, 0, 400 * MiB, 1000 * MiB, 10 * MiB, kNoLimit};
  CHECK_FALSE(guard_forces_recycling(nothing, rules, open));
  CHECK(asked == 0);
  // Past the cap: recycle, allowance or not.
  in.cap_bytes = 1002 * MiB;
  CHECK(guard_forces_recycling(in, rules, open));
  CHECK(asked == 0);
  // 40 MiB on a 1,124 MiB footprint all in use: the usual bounds refuse. Closed allowance: recycle;
  // open: the wider bounds accept, so create.
  GuardInputs churning{0, 40 * MiB, 40 * MiB, 1124 * MiB, 1124 * MiB, kNoLimit};
  CHECK(guard_forces_recycling(churning, rules, closed));
  CHECK(asked == 1);
  CHECK_FALSE(guard_forces_recycling(churning, rules, open));
  CHECK(asked == 2);
  // Even the wider bounds refuse 200 MiB (slack 0.108 x 1,124 = 121 MiB): recycle.
  GuardInputs too_much{0, 200 * MiB, 200 * MiB, 1124 * MiB, 1124 * MiB, kNoLimit};
  CHECK(guard_forces_recycling(too_much, rules, open));
  CHECK(asked == 3);
  // recycle_churn off: the allowance is never asked.
  RecycleBudgetRules off = rules;
  off.churn = 0.0;
  CHECK(guard_forces_recycling(churning, off, open));
  CHECK(asked == 3);
}
