// The checkpoint planner: plans, the cost model on a hand-worked chain, and the dynamic program
// against brute force over every plan of small random chains.
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>

#include "catch.h"
#include "contains.h"
#include "gpumem/ckpt/planner.h"

using namespace gpumem::ckpt;

namespace {

ModuleProfile module(std::int64_t kept, std::int64_t out, std::int64_t fwd_peak,
                     std::int64_t bwd_extra, std::int64_t bwd_peak, double fwd_ns) {
  ModuleProfile m;
  m.kept_bytes = kept;
  m.output_bytes = out;
  m.fwd_peak_bytes = fwd_peak;
  m.bwd_extra_bytes = bwd_extra;
  m.bwd_peak_bytes = bwd_peak;
  m.fwd_ns = fwd_ns;
  return m;
}

// Worked by hand in the comments of the first test case.
ChainProfile three_modules() {
  ChainProfile p;
  p.modules = {module(100, 10, 120, 5, 30, 1), module(200, 10, 250, 15, 50, 2),
               module(50, 20, 60, 25, 10, 3)};
  p.base_bytes = 1000;
  p.head_peak_bytes = 40;
  p.fwd_bwd_ns = 100;
  return p;
}

ChainProfile random_profile(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  ChainProfile p;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t out = pick(1, 64) << 10;
    const std::int64_t kept = pick(-out / 2, 1024 << 10);
    p.modules.push_back(module(kept, out, std::max<std::int64_t>(kept, 0) + pick(0, 256 << 10),
                               pick(0, 128 << 10), pick(0, 512 << 10),
                               static_cast<double>(pick(1, 1000))));
  }
  p.base_bytes = pick(0, 4 << 20);
  p.head_peak_bytes = pick(0, 1 << 20);
  p.fwd_bwd_ns = 1e6;
  return p;
}

// Calls visit(plan) for every plan of a chain of n modules.
void for_each_plan(std::size_t n, const std::function<void(const Plan&)>& visit) {
  std::vector<Segment> segs;
  std::function<void(std::size_t)> go = [&](std::size_t i) {
    if (i == n) {
      visit(Plan(n, segs));
      return;
    }
    go(i + 1);  // module i runs normally
    for (std::size_t e = i + 1; e <= n; ++e) {
      segs.push_back({i, e});
      go(e);
      segs.pop_back();
    }
  };
  go(0);
}

}  // namespace

TEST_CASE("predict follows the cost model on a hand-worked chain", "[ckpt][planner]") {
  const ChainProfile p = three_modules();
  // none: units at R = 0, 100, 300 need max(fwd peak, kept + X + bwd peak) = 135, 265, 85;
  // peaks 135, 365, 385; end R = 350, + loss 40 = 390.
  Prediction none = predict(p, Plan::none(3));
  CHECK(none.peak_bytes == 1000 + 390);
  CHECK(none.retained_bytes == 350);
  CHECK(none.recompute_ns == 0);
  CHECK(none.step_ns == 100);
  // ckpt[0,2): retains only module 1's output (10); its work is the recompute of both modules
  // plus module 1's backward: X1 + kept0 + fwd peak1 = 15 + 100 + 250 = 365.
  Prediction seg = predict(p, Plan(3, {{0, 2}}));
  CHECK(seg.peak_bytes == 1000 + 365);
  CHECK(seg.retained_bytes == 10 + 50);
  CHECK(seg.recompute_ns == 3);
  CHECK(seg.step_ns == 103);
  // ckpt[0,1): 135, then module 1 at R = 10: 275, module 2 at R = 210: 295, loss at 260: 300.
  CHECK(predict(p, Plan(3, {{0, 1}})).peak_bytes == 1300);
  // every module: 135, 10 + 265, 20 + 85, 40 + 40.
  CHECK(predict(p, Plan::every(3)).peak_bytes == 1000 + 275);
  CHECK(predict(p, Plan::every(3)).recompute_ns == 6);
}

TEST_CASE("a segment's backward carries the gradient it holds", "[ckpt][planner]") {
  ChainProfile p;
  p.modules = {module(100, 10, 100, 50, 20, 1), module(100, 30, 100, 40, 20, 1)};
  p.modules[1].bwd_peak_held_bytes = 45;    // its peak if its incoming gradient stays
  p.modules[1].freed_before_bwd_bytes = 30;  // its output was gone when its backward began
  // none: 0 + max(100, 100 + 50 + 20), then 100 + max(100, 100 + 40 + 20): 260.
  CHECK(predict(p, Plan::none(2)).peak_bytes == 260);
  // ckpt[0,2): recompute X1 + F1 + kept0 + fwd peak1 = 40 + 30 + 100 + 100 = 270; backward of
  // module 1 with its gradient held: 200 + 40 + 45 = 285; module 0 with the segment's output
  // gradient (30) still held: 100 + 50 + 20 + 30 = 200.
  CHECK(predict(p, Plan(2, {{0, 2}})).peak_bytes == 285);
  // ckpt[1,2) alone: 170, then 100 + max(100, 40 + 30 + 100, 100 + 40 + 45) = 285.
  CHECK(predict(p, Plan(2, {{1, 2}})).peak_bytes == 285);
}

TEST_CASE("the planner spends the budget on the least recompute", "[ckpt][planner]") {
  const ChainProfile p = three_modules();
  PlanResult r = plan_for_budget(p, 1390);
  REQUIRE(r.feasible);
  CHECK(r.plan == Plan::none(3));

  // Just under "none": ckpt[1,2) (peak 1365, 2 ns) and ckpt[0,2) (1365, 3 ns) fit, but
  // ckpt[0,1) fits too (1300) for 1 ns: the cheapest recompute wins, not the nearest peak.
  for (std::int64_t budget : {1389, 1300}) {
    r = plan_for_budget(p, budget);
    REQUIRE(r.feasible);
    CHECK(r.plan == Plan(3, {{0, 1}}));
    CHECK(r.prediction.recompute_ns == 1);
    CHECK(r.prediction.peak_bytes == 1300);
  }

  r = plan_for_budget(p, 1299);
  REQUIRE(r.feasible);
  CHECK(r.plan == Plan(3, {{0, 1}, {1, 2}}));
  CHECK(r.prediction.peak_bytes == 1275);

  r = plan_for_budget(p, 1200);
  CHECK_FALSE(r.feasible);
  CHECK(r.min_peak_bytes == 1275);
  CHECK(r.message.find("1275") != std::string::npos);
  CHECK(r.message.find("raise the budget") != std::string::npos);
}

TEST_CASE("the dynamic program matches brute force over every plan", "[ckpt][planner]") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    const std::size_t n = 2 + seed % 6;  // 3..7 modules
    const ChainProfile p = random_profile(n, seed);
    std::int64_t lowest = INT64_MAX, highest = 0;
    for_each_plan(n, [&](const Plan& plan) {
      const std::int64_t peak = predict(p, plan).peak_bytes;
      lowest = std::min(lowest, peak);
      highest = std::max(highest, peak);
    });
    CHECK(plan_min_peak(p).prediction.peak_bytes == lowest);
    for (int step = 0; step <= 8; ++step) {
      const std::int64_t budget = lowest - 1 + (highest - lowest + 1) * step / 8;
      double best = -1;
      for_each_plan(n, [&](const Plan& plan) {
        const Prediction pr = predict(p, plan);
        if (pr.peak_bytes <= budget && (best < 0 || pr.recompute_ns < best)) best = pr.recompute_ns;
      });
      const PlanResult r = plan_for_budget(p, budget);
      INFO("seed " << seed << " budget " << budget << " plan " << r.plan.to_string());
      REQUIRE(r.feasible == (best >= 0));
      if (r.feasible) {
        CHECK(r.prediction.recompute_ns == best);
        CHECK(r.prediction.peak_bytes <= budget);
        CHECK(predict(p, r.plan).peak_bytes == r.prediction.peak_bytes);
      }
    }
  }
}

TEST_CASE("the planner handles long chains quickly", "[ckpt][planner]") {
  const ChainProfile p = random_profile(120, 99);
  const Prediction none = predict(p, Plan::none(120));
  const Prediction sqrt = predict(p, Plan::sqrt_n(120));
  const std::int64_t budget = (none.peak_bytes + sqrt.peak_bytes) / 2;
  const PlanResult r = plan_for_budget(p, budget);
  REQUIRE(r.feasible);
  CHECK(r.prediction.peak_bytes <= budget);
  CHECK(r.prediction.recompute_ns <= sqrt.recompute_ns);
}

TEST_CASE("plans are built and validated", "[ckpt][plan]") {
  CHECK(Plan::none(4).to_string() == "none");
  CHECK(Plan::every(3).to_string() == "ckpt[0,1) ckpt[1,2) ckpt[2,3)");
  CHECK(Plan::every(5, 1, 3).to_string() == "ckpt[1,2) ckpt[2,3)");
  CHECK(Plan::grouped(7, 2, 1, 6).to_string() == "ckpt[1,3) ckpt[3,5) ckpt[5,6)");
  // 10 modules: ceil(sqrt(10)) = 4 segments of 3, 3, 2, 2.
  CHECK(Plan::sqrt_n(10).to_string() == "ckpt[0,3) ckpt[3,6) ckpt[6,8) ckpt[8,10)");
  CHECK(Plan::sqrt_n(12).checkpointed().size() == 4);
  CHECK(Plan::sqrt_n(12).checkpointed_modules() == 12);
  const Plan p(6, {{1, 3}, {4, 5}});
  CHECK(p.segment_of(0) == nullptr);
  REQUIRE(p.segment_of(2) != nullptr);
  CHECK(p.segment_of(2)->begin == 1);
  CHECK(p.segment_of(3) == nullptr);
  CHECK(p.segment_of(4)->end == 5);

  CHECK_THROWS_WITH(Plan(3, {{1, 1}}), CKPT_CONTAINS("empty"));
  CHECK_THROWS_WITH(Plan(3, {{1, 4}}), CKPT_CONTAINS("ends past the chain"));
  CHECK_THROWS_WITH(Plan(5, {{2, 4}, {3, 5}}), CKPT_CONTAINS("sorted and disjoint"));
  CHECK_THROWS_WITH(Plan::every(3, 2, 5), CKPT_CONTAINS("not inside the chain"));
  CHECK_THROWS_WITH(Plan::grouped(3, 0), CKPT_CONTAINS("group is 0"));
  CHECK_THROWS_AS(predict(three_modules(), Plan::none(4)), std::invalid_argument);

  CHECK(Plan::parse(6, p.to_string()) == p);
  CHECK(Plan::parse(6, " ckpt[1, 3)ckpt[4,5) ") == p);
  CHECK(Plan::parse(6, "none") == Plan::none(6));
  CHECK_THROWS_WITH(Plan::parse(6, "ckpt[1;3)"), CKPT_CONTAINS("expected ','"));
  CHECK_THROWS_WITH(Plan::parse(6, "[1,3)"), CKPT_CONTAINS("expected 'ckpt['"));
  CHECK_THROWS_WITH(Plan::parse(6, "ckpt[4,9)"), CKPT_CONTAINS("ends past the chain"));
}

TEST_CASE("byte counts parse and print", "[ckpt][plan]") {
  CHECK(parse_bytes("123") == 123);
  CHECK(parse_bytes("64kB") == 64000);
  CHECK(parse_bytes("1.5GB") == 1500000000);
  CHECK(parse_bytes("2GiB") == (std::int64_t{2} << 30));
  CHECK(parse_bytes("512 MiB") == (std::int64_t{512} << 20));
  CHECK_THROWS_WITH(parse_bytes("lots"), CKPT_CONTAINS("not a byte count"));
  CHECK_THROWS_WITH(parse_bytes("3 parsecs"), CKPT_CONTAINS("GiB"));
  CHECK_THROWS_AS(parse_bytes("-1GB"), std::invalid_argument);
  CHECK(format_bytes(3 << 20) == "3.0 MiB");
  CHECK(format_bytes(std::int64_t{5} << 30) == "5.00 GiB");
}
