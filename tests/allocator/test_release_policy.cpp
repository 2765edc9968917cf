// release_policy.h: when garbage collection runs and which segments it frees, in what order.
#include <vector>

#include "catch.h"
#include "gpumem/alloc/config.h"
#include "release_policy.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::policy;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
}

TEST_CASE("release policy: garbage collection needs a threshold and a cap", "[policy][release]") {
  CHECK_FALSE(should_collect_garbage(0.0, 900 * MiB, 1000 * MiB));
  CHECK_FALSE(should_collect_garbage(0.8, 900 * MiB, kNoLimit));
  CHECK(should_collect_garbage(0.8, 900 * MiB, 1000 * MiB));
  CHECK_FALSE(should_collect_garbage(0.8, 800 * MiB, 1000 * MiB));  // at the threshold: not over
}

TEST_CASE("release policy: garbage collection frees the least recently freed first, until under the threshold",
          "[policy][release]") {
  const std::vector<GcCandidate> c = {
      {100 * MiB, 30, 0x3000},
      {50 * MiB, 10, 0x1000},
      {20 * MiB, 20, 0x2000},
      {200 * MiB, 40, 0x4000},
  };
  // reserved 900, threshold 0.6 x 1000 = 600: free until reserved <= 600.
  const auto v = choose_gc_victims(c, 0.6, 900 * MiB, 1000 * MiB);
  // Order by free_seq: 10 (50) -> 850, 20 (20) -> 830, 30 (100) -> 730, 40 (200) -> 530.
  CHECK(v == std::vector<std::size_t>{1, 2, 0, 3});
  // A smaller overshoot stops early.
  CHECK(choose_gc_victims(c, 0.8, 900 * MiB, 1000 * MiB) == std::vector<std::size_t>{1, 2, 0});
  CHECK(choose_gc_victims(c, 0.95, 900 * MiB, 1000 * MiB).empty());
  CHECK(choose_gc_victims(c, 0.0, 900 * MiB, 1000 * MiB).empty());
  CHECK(choose_gc_victims({}, 0.6, 900 * MiB, 1000 * MiB).empty());
}

TEST_CASE("release policy: equal ages are freed lowest address first", "[policy][release]") {
  const std::vector<GcCandidate> c = {{10 * MiB, 5, 0x9000}, {10 * MiB, 5, 0x1000}, {10 * MiB, 5, 0x5000}};
  CHECK(choose_gc_victims(c, 0.1, 1000 * MiB, 1000 * MiB) == std::vector<std::size_t>{1, 2, 0});
}
