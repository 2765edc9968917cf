// growth_policy.h: region size, classic segment size, placement choice, recycling choice and
// plan_growth, as pure functions of plain values.
#include <algorithm>
#include <random>
#include <vector>

#include "catch.h"
#include "growth_policy.h"
#include "size_policy.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::policy;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::size_t kPiece = 20 * MiB;
constexpr std::uintptr_t kBase = 0x7f0000000000;

// What the engine did before the policy was a function: scan every extent each time, take the
// highest recyclable piece of the smallest extent holding one (ties: lower stream, then address),
// split the extent around it.
std::vector<RecycleChoice> reference_recycle(std::vector<FreeExtent> extents, std::size_t piece, std::uintptr_t lo,
                                             std::uintptr_t hi, std::size_t n) {
  std::vector<std::size_t> origin(extents.size());
  for (std::size_t i = 0; i < origin.size(); ++i) origin[i] = i;
  std::vector<RecycleChoice> out;
  while (out.size() < n) {
    std::ptrdiff_t best = -1;
    std::uintptr_t best_slot = 0;
    for (std::size_t i = 0; i < extents.size(); ++i) {
      const FreeExtent& e = extents[i];
      auto s = highest_recyclable_slot(e, piece, lo, hi);
      if (!s) continue;
      if (best >= 0) {
        const FreeExtent& b = extents[static_cast<std::size_t>(best)];
        if (std::tie(e.size_bytes, e.stream, e.addr) >= std::tie(b.size_bytes, b.stream, b.addr)) continue;
      }
      best = static_cast<std::ptrdiff_t>(i);
      best_slot = *s;
    }
    if (best < 0) break;
    const std::size_t bi = static_cast<std::size_t>(best);
    out.push_back({origin[bi], best_slot});
    const FreeExtent e = extents[bi];
    extents.erase(extents.begin() + best);
    const std::size_t o = origin[bi];
    origin.erase(origin.begin() + best);
    if (best_slot > e.addr) {
      extents.push_back({e.addr, best_slot - e.addr, e.stream, e.region_base});
      origin.push_back(o);
    }
    if (e.addr + e.size_bytes > best_slot + piece) {
      extents.push_back({best_slot + piece, e.addr + e.size_bytes - best_slot - piece, e.stream, e.region_base});
      origin.push_back(o);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("growth policy: an expandable region reserves 1.125 x the provider's memory", "[policy][growth]") {
  CHECK(region_va_bytes(0, 80 * GiB, kPiece) == round_up(90 * GiB, kPiece));
  CHECK(region_va_bytes(4 * GiB, 80 * GiB, kPiece) == 4 * GiB + 4 * MiB);  // va_reserve_mb, whole pieces
  CHECK(region_va_bytes(MiB, 80 * GiB, kPiece) == kPiece);                  // at least one piece
}

TEST_CASE("growth policy: an unknown provider total does not shrink regions to one piece", "[policy][growth]") {
  CHECK(region_va_bytes(0, 0, kPiece) == round_up(kUnknownTotalRegionVaBytes, kPiece));
  CHECK(region_va_bytes(0, 0, kPiece) > 1000 * kPiece);
  CHECK(region_va_bytes(8 * GiB, 0, kPiece) == round_up(8 * GiB, kPiece));
}

TEST_CASE("growth policy: classic segment sizes follow PyTorch", "[policy][growth]") {
  CHECK(classic_segment_bytes(512, 20 * MiB, 0) == 2 * MiB);
  CHECK(classic_segment_bytes(MiB, 20 * MiB, 0) == 2 * MiB);
  CHECK(classic_segment_bytes(MiB + 512, 20 * MiB, 0) == 20 * MiB);
  CHECK(classic_segment_bytes(10 * MiB - 512, 20 * MiB, 0) == 20 * MiB);
  CHECK(classic_segment_bytes(10 * MiB, 20 * MiB, 0) == 10 * MiB);
  CHECK(classic_segment_bytes(11 * MiB + 512, 20 * MiB, 0) == 12 * MiB);
  CHECK(classic_segment_bytes(MiB, 20 * MiB, 4 * MiB) == 4 * MiB);  // then the granularity
}

TEST_CASE("growth policy: a request may land at either end of a hole", "[policy][growth][placement]") {
  PlacementAddresses a = placement_addresses(kBase, kBase + 100 * MiB, 30 * MiB);
  REQUIRE(a.count == 2);
  CHECK(a.addr[0] == kBase);
  CHECK(a.addr[1] == kBase + 70 * MiB);
  a = placement_addresses(kBase, kBase + 30 * MiB, 30 * MiB);  // exact fit: one place
  CHECK(a.count == 1);
  a = placement_addresses(kBase, kBase + 29 * MiB, 30 * MiB);  // too small
  CHECK(a.count == 0);
  a = placement_addresses(kBase, kBase + 100 * MiB, 30 * MiB + 100);  // the end is 512-aligned
  REQUIRE(a.count == 2);
  CHECK(a.addr[1] % 512 == 0);
  CHECK(a.addr[1] + 30 * MiB + 100 <= kBase + 100 * MiB);
}

TEST_CASE("growth policy: placement needs the fewest new pieces, then the smallest hole, then the lowest address",
          "[policy][growth][placement]") {
  CHECK_FALSE(choose_placement({}).has_value());
  std::vector<PlacementCandidate> c = {
      {kBase + 0x1000, 3, 100 * MiB},
      {kBase + 0x2000, 1, 400 * MiB},  // fewest pieces wins over a smaller hole
      {kBase + 0x3000, 2, 50 * MiB},
  };
  CHECK(choose_placement(c) == 1u);
  c = {{kBase + 0x4000, 1, 400 * MiB}, {kBase + 0x5000, 1, 60 * MiB}, {kBase + 0x6000, 1, 80 * MiB}};
  CHECK(choose_placement(c) == 1u);  // equal pieces: the smaller hole
  c = {{kBase + 0x9000, 1, 60 * MiB}, {kBase + 0x5000, 1, 60 * MiB}, {kBase + 0x7000, 1, 60 * MiB}};
  CHECK(choose_placement(c) == 1u);  // all equal: the lowest address
}

TEST_CASE("growth policy: the highest whole piece of an extent outside the request's range",
          "[policy][growth][recycle]") {
  // Extent of 3.5 pieces starting half a piece in: whole pieces 1, 2, 3.
  const FreeExtent e{kBase + kPiece / 2, 3 * kPiece + kPiece / 2, 0, kBase};
  CHECK(highest_recyclable_slot(e, kPiece, 0, 0) == kBase + 3 * kPiece);
  // The request takes pieces 3 (and more): piece 2 is the highest left.
  CHECK(highest_recyclable_slot(e, kPiece, kBase + 3 * kPiece, kBase + 10 * kPiece) == kBase + 2 * kPiece);
  // A request range touching part of piece 1 excludes it.
  CHECK(highest_recyclable_slot(e, kPiece, kBase + kPiece + 512, kBase + 10 * kPiece) == std::nullopt);
  const FreeExtent small{kBase + 512, kPiece, 0, kBase};  // no whole piece
  CHECK(highest_recyclable_slot(small, kPiece, 0, 0) == std::nullopt);
}

TEST_CASE("growth policy: recycling takes the smallest extent's highest piece first", "[policy][growth][recycle]") {
  const std::vector<FreeExtent> extents = {
      {kBase, 5 * kPiece, 0, kBase},                       // big run: kept for last
      {kBase + 10 * kPiece, kPiece, 0, kBase},             // one piece
      {kBase + 20 * kPiece, 2 * kPiece, 7, kBase},         // two pieces, another stream
  };
  const auto c = choose_recycled_pieces(extents, kPiece, 0, 0, 5);
  REQUIRE(c.size() == 5);
  CHECK(c[0].extent == 1);
  CHECK(c[0].slot_addr == kBase + 10 * kPiece);
  CHECK(c[1].extent == 2);  // then the two-piece extent, from the top down
  CHECK(c[1].slot_addr == kBase + 21 * kPiece);
  CHECK(c[2].extent == 2);  // its rest (one piece) is now the smallest
  CHECK(c[2].slot_addr == kBase + 20 * kPiece);
  CHECK(c[3].extent == 0);
  CHECK(c[3].slot_addr == kBase + 4 * kPiece);
  CHECK(c[4].slot_addr == kBase + 3 * kPiece);
  // Asking for more than there is gives what there is; asking for none gives none.
  CHECK(choose_recycled_pieces(extents, kPiece, 0, 0, 100).size() == 8);
  CHECK(choose_recycled_pieces(extents, kPiece, 0, 0, 0).empty());
}

TEST_CASE("growth policy: recycling never takes a piece the request itself lands on", "[policy][growth][recycle]") {
  const std::vector<FreeExtent> extents = {{kBase, 6 * kPiece, 0, kBase}};
  const auto c = choose_recycled_pieces(extents, kPiece, kBase + 2 * kPiece, kBase + 4 * kPiece, 10);
  REQUIRE(c.size() == 4);
  for (const auto& x : c) CHECK((x.slot_addr + kPiece <= kBase + 2 * kPiece || x.slot_addr >= kBase + 4 * kPiece));
  CHECK(c[0].slot_addr == kBase + 5 * kPiece);
  CHECK(c[1].slot_addr == kBase + 4 * kPiece);
  // Pieces 2 and 3 are the request's; below them, the part left is [0, 2): pieces 1 then 0.
  CHECK(c[2].slot_addr == kBase + kPiece);
  CHECK(c[3].slot_addr == kBase);
}

TEST_CASE("growth policy: the recycling choice equals a scan of every extent after each piece",
          "[policy][growth][recycle]") {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 300; ++round) {
    std::vector<FreeExtent> extents;
    std::uintptr_t at = kBase;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      at += (rng() % 3) * kPiece + (rng() % 8) * 512 * 1024;
      const std::size_t size = 512 * (1 + rng() % (6 * kPiece / 512));
      extents.push_back({at, size, rng() % 3, kBase});
      at += size + 512;
    }
    const std::uintptr_t lo = kBase + (rng() % 40) * kPiece / 2;
    const std::uintptr_t hi = lo + (rng() % 6) * kPiece;
    const std::size_t want = rng() % 15;
    const auto got = choose_recycled_pieces(extents, kPiece, lo, hi, want);
    const auto ref = reference_recycle(extents, kPiece, lo, hi, want);
    REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].extent == ref[i].extent);
      CHECK(got[i].slot_addr == ref[i].slot_addr);
    }
  }
}

TEST_CASE("growth policy: plan_growth recycles before creating and refuses to pass the cap", "[policy][growth]") {
  GrowthInputs in;
  in.pieces_needed = 5;
  in.pieces_recyclable = 3;
  in.piece_bytes = kPiece;
  GrowthPlan p = plan_growth(in);
  CHECK(p.recycle == 3);
  CHECK(p.create == 2);
  CHECK_FALSE(p.over_cap);

  in.recycle_enabled = false;
  p = plan_growth(in);
  CHECK(p.recycle == 0);
  CHECK(p.create == 5);

  in.recycle_enabled = true;
  in.reserved_bytes = 100 * MiB;
  in.cap_bytes = 140 * MiB;  // 2 new pieces = 40 MiB: exactly reaches it
  CHECK_FALSE(plan_growth(in).over_cap);
  in.cap_bytes = 139 * MiB;
  CHECK(plan_growth(in).over_cap);

  in.pieces_recyclable = 9;  // everything recycled: the cap does not matter
  p = plan_growth(in);
  CHECK(p.recycle == 5);
  CHECK(p.create == 0);
  CHECK_FALSE(p.over_cap);
}
