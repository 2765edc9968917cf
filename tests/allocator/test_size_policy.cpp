// size_policy.h: rounding, pools, splitting, classic reuse and whole pieces, as pure functions.
#include "catch.h"
#include "size_policy.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::policy;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
}  // namespace

TEST_CASE("size policy: requests round to 512-byte multiples without divisions", "[policy][size]") {
  const std::array<std::uint32_t, 16> none{};
  CHECK(round_size(1, none, false) == 512);
  CHECK(round_size(512, none, false) == 512);
  CHECK(round_size(513, none, false) == 1024);
  CHECK(round_size(MiB + 1, none, false) == MiB + 512);
  // any_divisions = true with no bucket set gives the same answer.
  for (std::size_t n : {std::size_t{1}, std::size_t{700}, 3 * MiB + 5, 100 * MiB + 1})
    CHECK(round_size(n, none, true) == round_size(n, none, false));
}

TEST_CASE("size policy: roundup_power2_divisions rounds to the next 1/N step", "[policy][size]") {
  std::array<std::uint32_t, 16> div{};
  div[0] = 4;   // [1, 2) MiB and below: quarters
  div[5] = 2;   // [32, 64) MiB: halves
  CHECK(round_size(MiB + 1, div) == MiB + MiB / 4);
  CHECK(round_size(MiB + MiB / 4, div) == MiB + MiB / 4);  // on a step: kept
  CHECK(round_size(2 * MiB, div) == 2 * MiB);              // a power of two: kept
  CHECK(round_size(33 * MiB, div) == 48 * MiB);
  CHECK(round_size(5 * MiB + 1, div) == 5 * MiB + 512);    // bucket without divisions
  CHECK(round_size(1000, div) == 1024);                    // too small to divide: 512 multiples
}

TEST_CASE("size policy: the small pool takes requests up to 1 MiB", "[policy][size]") {
  CHECK(pool_for(512) == PoolKind::small);
  CHECK(pool_for(MiB) == PoolKind::small);
  CHECK(pool_for(MiB + 512) == PoolKind::large);
}

TEST_CASE("size policy: should_split", "[policy][size]") {
  // Expandable regions and the small pool split off any remainder of at least 512 bytes.
  CHECK(should_split(true, PoolKind::large, 40 * MiB, 40 * MiB - 512, kNoLimit));
  CHECK_FALSE(should_split(true, PoolKind::large, 40 * MiB, 40 * MiB, kNoLimit));
  CHECK(should_split(false, PoolKind::small, 2 * MiB, 2 * MiB - 512, kNoLimit));
  // Classic large pool: only a remainder over 1 MiB, and never at or over max_split_size.
  CHECK_FALSE(should_split(false, PoolKind::large, 20 * MiB, 19 * MiB, kNoLimit));
  CHECK(should_split(false, PoolKind::large, 20 * MiB, 19 * MiB - 512, kNoLimit));
  CHECK_FALSE(should_split(false, PoolKind::large, 400 * MiB, 300 * MiB, 256 * MiB));
  CHECK(should_split(false, PoolKind::large, 400 * MiB, 200 * MiB, 256 * MiB));
}

TEST_CASE("size policy: accept_cached_classic keeps oversize blocks for oversize requests", "[policy][size]") {
  CHECK(accept_cached_classic(500 * MiB, 4 * MiB, kNoLimit, 20 * MiB));      // no max_split: anything fits
  CHECK_FALSE(accept_cached_classic(300 * MiB, 4 * MiB, 256 * MiB, 20 * MiB)); // oversize for a normal request
  CHECK(accept_cached_classic(200 * MiB, 4 * MiB, 256 * MiB, 20 * MiB));
  CHECK(accept_cached_classic(310 * MiB, 300 * MiB, 256 * MiB, 20 * MiB));    // wastes 10 < 20 MiB
  CHECK_FALSE(accept_cached_classic(320 * MiB, 300 * MiB, 256 * MiB, 20 * MiB));  // wastes 20 MiB
}

TEST_CASE("size policy: whole_slots finds the pieces wholly inside a range", "[policy][size]") {
  const std::uintptr_t base = 0x100000000;
  const std::size_t piece = 2 * MiB;
  SlotSpan s = whole_slots(base, 6 * MiB, base, piece);
  CHECK(s.lo == base);
  CHECK(s.hi == base + 6 * MiB);
  CHECK(s.count(piece) == 3);
  s = whole_slots(base + 512, 6 * MiB, base, piece);  // starts inside slot 0, ends inside slot 3
  CHECK(s.lo == base + piece);
  CHECK(s.hi == base + 6 * MiB);
  CHECK(s.count(piece) == 2);
  s = whole_slots(base + 512, piece, base, piece);  // straddles two slots, holds neither
  CHECK(s.count(piece) == 0);
  CHECK(s.lo == s.hi);
  s = whole_slots(base + 4 * KiB, 100 * KiB, base, piece);  // inside one slot
  CHECK(s.count(piece) == 0);
}
