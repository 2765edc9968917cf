// cap_policy.h: the one rule for the memory cap.
#include "cap_policy.h"
#include "catch.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::policy;

namespace {
constexpr std::size_t GiB = std::size_t{1} << 30;
}

TEST_CASE("cap policy: fraction of the provider's total, absolute limit, the smaller wins", "[policy][cap]") {
  const std::size_t total = 80 * GiB;
  CHECK(cap_bytes(1.0, 0, total) == kNoLimit);
  CHECK(cap_bytes(0.5, 0, total) == 40 * GiB);
  CHECK(cap_bytes(1.0, 10 * GiB, total) == 10 * GiB);
  CHECK(cap_bytes(0.5, 50 * GiB, total) == 40 * GiB);
  CHECK(cap_bytes(0.5, 10 * GiB, total) == 10 * GiB);
  CHECK(cap_bytes(0.0, 0, total) == 0);  // a zero fraction allows nothing
}

TEST_CASE("cap policy: an unknown provider total (0) applies no fraction cap", "[policy][cap]") {
  CHECK(cap_bytes(0.5, 0, 0) == kNoLimit);
  CHECK(cap_bytes(0.0, 0, 0) == kNoLimit);
  CHECK(cap_bytes(0.5, 50 * GiB, 0) == 50 * GiB);  // the absolute limit still applies
}

TEST_CASE("cap policy: no overflow on huge totals, negative fractions clamp to 0", "[policy][cap]") {
  CHECK(cap_bytes(0.9, 0, kNoLimit) < kNoLimit);
  CHECK(cap_bytes(0.9, 0, kNoLimit) > kNoLimit / 2);
  CHECK(cap_bytes(-1.0, 0, 80 * GiB) == 0);
}

TEST_CASE("cap policy: exceeds_cap", "[policy][cap]") {
  CHECK_FALSE(exceeds_cap(0, 100 * GiB, kNoLimit));
  CHECK_FALSE(exceeds_cap(6 * GiB, 4 * GiB, 10 * GiB));  // exactly reaches the cap
  CHECK(exceeds_cap(6 * GiB, 4 * GiB + 1, 10 * GiB));
  CHECK(exceeds_cap(11 * GiB, 0, 10 * GiB));             // already over: nothing more
  CHECK_FALSE(exceeds_cap(0, 0, 0));
  CHECK(exceeds_cap(0, 1, 0));
  CHECK_FALSE(exceeds_cap(kNoLimit - 1, 1, kNoLimit));   // no cap: never
}
