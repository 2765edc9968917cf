// recycle_budget_policy.h: the token bucket of driver time that bounds how much time physical page
// recycling may spend.
#include <cstdint>

#include "catch.h"
#include "recycle_budget_policy.h"

using namespace gpumem::alloc::policy;

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
