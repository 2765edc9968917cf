// retry_policy.h: what the engine tries after a miss in the free index, in order.
#include <vector>

#include "catch.h"
#include "retry_policy.h"

using namespace gpumem::alloc::policy;

namespace {
std::vector<RecoveryStep> steps(bool gc) {
  auto s = recovery_steps(gc);
  return {s.begin(), s.end()};
}
}  // namespace

TEST_CASE("retry policy: grow, then release cached memory, look again, grow once more", "[policy][retry]") {
  using S = RecoveryStep;
  CHECK(steps(false) == std::vector<S>{S::grow, S::release_cached, S::take_cached, S::grow});
}

TEST_CASE("retry policy: garbage collection comes first when it is due", "[policy][retry]") {
  using S = RecoveryStep;
  CHECK(steps(true) == std::vector<S>{S::collect_garbage, S::grow, S::release_cached, S::take_cached, S::grow});
}

TEST_CASE("retry policy: the sequence is bounded and releases at most once", "[policy][retry]") {
  for (bool gc : {false, true}) {
    const auto s = steps(gc);
    CHECK(s.size() <= 5);
    std::size_t releases = 0, grows = 0;
    for (RecoveryStep x : s) {
      releases += x == RecoveryStep::release_cached;
      grows += x == RecoveryStep::grow;
    }
    CHECK(releases == 1);
    CHECK(grows == 2);
    CHECK(s.back() == RecoveryStep::grow);  // the last attempt grows with everything released
  }
  CHECK(std::string(to_string(RecoveryStep::release_cached)) == "release_cached");
}
