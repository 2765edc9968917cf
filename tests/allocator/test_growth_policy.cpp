// growth_policy.h: region size, classic segment size, placement, piece sizing, recycling (plan_growth)
// and the growth choice, as pure functions of plain values.
#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <tuple>
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

// plan_growth as it was before RecyclePlanner (main d2faec3): for every call it sorts the pieces
// and keeps them in a map of lists by length. The model the planner is checked against.
GrowthLayout reference_plan_growth(std::span<const FreePiece> free_pieces, std::span<const TargetRun> runs,
                                   const PieceRules& rules, bool recycle) {
  GrowthLayout out;
  const bool edge_first = rules.hole_edge_first;
  std::map<std::size_t, std::vector<std::size_t>> by_length;  // each list: last = next taken
  if (recycle && !free_pieces.empty()) {
    std::vector<std::size_t> order(free_pieces.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto key = [&](std::size_t i) {
      const FreePiece& p = free_pieces[i];
      return std::make_tuple(edge_first && !p.at_hole_edge, p.extent_bytes, p.stream, ~p.addr);
    };
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) > key(b); });
    for (std::size_t i : order)
      if (free_pieces[i].slots > 0) by_length[free_pieces[i].slots].push_back(i);
  }
  auto take = [&](std::size_t room) -> std::optional<std::size_t> {
    auto it = by_length.upper_bound(room);
    if (it == by_length.begin()) return std::nullopt;
    --it;
    const std::size_t i = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) by_length.erase(it);
    return i;
  };
  for (const TargetRun& run : runs) {
    if (run.slots.size() == 0) continue;
    const bool adaptive = rules.mode == PieceMode::adaptive;
    std::size_t lo = run.slots.lo, hi = run.slots.hi;
    const bool head = adaptive && run.head_shared;
    const bool tail = adaptive && run.tail_shared && hi - lo > (head ? 1u : 0u);
    if (head) ++lo;
    if (tail) --hi;
    std::size_t at = lo;
    while (at < hi) {
      const auto i = take(hi - at);
      if (!i) break;
      out.recycled.push_back({*i, at});
      at += free_pieces[*i].slots;
    }
    bool head_done = false, tail_done = false;
    if (adaptive && rules.overhang && (at < hi || tail)) {
      const std::size_t rest = run.slots.hi - at;
      auto it = by_length.lower_bound(hi - at + 1);
      if (it != by_length.end() && it->first <= rest + run.room_after) {
        const std::size_t i = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) by_length.erase(it);
        out.recycled.push_back({i, at});
        at = hi;
        tail_done = tail;
      }
    }
    if (head)
      if (const auto i = take(1)) {
        out.recycled.push_back({*i, run.slots.lo});
        head_done = true;
      }
    if (tail && !tail_done)
      if (const auto i = take(1)) {
        out.recycled.push_back({*i, run.slots.hi - 1});
        tail_done = true;
      }
    if (head && !head_done) out.created.push_back({run.slots.lo, run.slots.lo + 1});
    for (const SlotRange& r : plan_new_pieces({at, hi}, false, false, rules)) out.created.push_back(r);
    if (tail && !tail_done) out.created.push_back({run.slots.hi - 1, run.slots.hi});
  }
  return out;
}

bool same_choices(const std::vector<RecycleChoice>& a, const std::vector<RecycleChoice>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const RecycleChoice& x, const RecycleChoice& y) {
           return x.piece == y.piece && x.target_slot == y.target_slot;
         });
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
  PlacementAddresses a = placement_addresses(kBase, kBase + 100 * MiB, 30 * MiB, /*both_ends=*/true);
  REQUIRE(a.count == 2);
  CHECK(a.addr[0] == kBase);
  CHECK(a.addr[1] == kBase + 70 * MiB);
  a = placement_addresses(kBase, kBase + 30 * MiB, 30 * MiB, true);  // exact fit: one place
  CHECK(a.count == 1);
  a = placement_addresses(kBase, kBase + 29 * MiB, 30 * MiB, true);  // too small
  CHECK(a.count == 0);
  a = placement_addresses(kBase, kBase + 100 * MiB, 30 * MiB + 100, true);  // the end is 512-aligned
  REQUIRE(a.count == 2);
  CHECK(a.addr[1] % 512 == 0);
  CHECK(a.addr[1] + 30 * MiB + 100 <= kBase + 100 * MiB);
}

TEST_CASE("growth policy: by default a request lands at the start of a hole only", "[policy][growth][placement]") {
  const PlacementAddresses a = placement_addresses(kBase, kBase + 100 * MiB, 30 * MiB);
  REQUIRE(a.count == 1);
  CHECK(a.addr[0] == kBase);
}

TEST_CASE("growth policy: the shortlist keeps the fewest new slots and every frontier candidate",
          "[policy][growth][placement]") {
  std::vector<PlacementCandidate> c = {
      {kBase + 0x1000, 3, 100 * MiB, false},
      {kBase + 0x2000, 1, 400 * MiB, false},
      {kBase + 0x3000, 2, 50 * MiB, false},
      {kBase + 0x4000, 9, 900 * MiB, true},  // at a region's end: always planned
      {kBase + 0x5000, 1, 60 * MiB, false},
  };
  const std::vector<std::size_t> s = shortlist_placements(c, 2);
  REQUIRE(s.size() == 3);
  CHECK(s[0] == 4u);  // one slot, the smaller hole
  CHECK(s[1] == 1u);
  CHECK(s[2] == 3u);
  CHECK(shortlist_placements({}, 4).empty());
  CHECK(shortlist_placements(c, 100).size() == c.size());  // no repeats
  // Into a list that held another shortlist: the same indices, nothing of the old ones left.
  std::vector<std::size_t> reused = {7, 7, 7, 7, 7, 7, 7, 7};
  shortlist_placements(c, 2, reused);
  CHECK(reused == s);
  shortlist_placements({}, 4, reused);
  CHECK(reused.empty());
}

TEST_CASE("growth policy: the growth creating least, then moving fewest pieces, then the smaller hole wins",
          "[policy][growth]") {
  CHECK_FALSE(choose_growth({}).has_value());
  std::vector<GrowthOption> o = {
      {4, 1, 100 * MiB, kBase + 0x1000},
      {2, 9, 400 * MiB, kBase + 0x2000},  // creates least: wins over fewer calls
      {3, 1, 50 * MiB, kBase + 0x3000},
  };
  CHECK(choose_growth(o) == 1u);
  o = {{2, 3, 10 * MiB, kBase}, {2, 1, 400 * MiB, kBase + 0x10}, {2, 1, 60 * MiB, kBase + 0x20}};
  CHECK(choose_growth(o) == 2u);  // equal memory: fewer calls, then the smaller hole
  o = {{0, 1, 60 * MiB, kBase + 0x9000}, {0, 1, 60 * MiB, kBase + 0x5000}};
  CHECK(choose_growth(o) == 1u);  // all equal: the lower address
}

TEST_CASE("growth policy: fixed pieces are whole units", "[policy][growth][pieces]") {
  PieceRules r;
  r.mode = PieceMode::fixed;
  r.fixed_slots = 10;
  CHECK(unit_slots(r) == 10);
  const auto p = plan_new_pieces({20, 50}, true, true, r);
  REQUIRE(p.size() == 3);
  CHECK(p[0] == SlotRange{20, 30});
  CHECK(p[1] == SlotRange{30, 40});
  CHECK(p[2] == SlotRange{40, 50});
}

TEST_CASE("growth policy: adaptive pieces give shared ends a slot and split the inside evenly",
          "[policy][growth][pieces]") {
  PieceRules r;  // adaptive, no longest piece
  CHECK(unit_slots(r) == 1);
  auto p = plan_new_pieces({0, 10}, true, true, r);
  REQUIRE(p.size() == 3);
  CHECK(p[0] == SlotRange{0, 1});
  CHECK(p[1] == SlotRange{1, 9});
  CHECK(p[2] == SlotRange{9, 10});
  r.max_piece_slots = 3;  // 8 inside slots, at most 3 each: 3 near-equal pieces 3, 3, 2
  p = plan_new_pieces({0, 10}, true, true, r);
  REQUIRE(p.size() == 5);
  CHECK(p[1] == SlotRange{1, 4});
  CHECK(p[2] == SlotRange{4, 7});
  CHECK(p[3] == SlotRange{7, 9});
  p = plan_new_pieces({5, 6}, true, true, r);  // one slot shared at both ends: one piece
  REQUIRE(p.size() == 1);
  CHECK(p[0] == SlotRange{5, 6});
  CHECK(plan_new_pieces({4, 4}, false, false, r).empty());
  // Whatever the rules, the pieces tile the gap in address order.
  for (std::size_t n = 1; n < 40; ++n)
    for (std::size_t longest : {0u, 1u, 2u, 5u, 16u})
      for (int ends = 0; ends < 4; ++ends) {
        r.max_piece_slots = longest;
        const auto q = plan_new_pieces({100, 100 + n}, ends & 1, ends & 2, r);
        std::size_t at = 100;
        for (const SlotRange& x : q) {
          CHECK(x.lo == at);
          CHECK(x.size() > 0);
          if (longest) CHECK(x.size() <= longest);
          at = x.hi;
        }
        CHECK(at == 100 + n);
      }
}

TEST_CASE("growth policy: plan_growth recycles the longest fitting free piece before creating",
          "[policy][growth][recycle]") {
  PieceRules r;
  r.hole_edge_first = false;
  const std::vector<FreePiece> free = {
      {4, 40 * MiB, 0, kBase + 0x100000000},  // 4 slots
      {2, 4 * MiB, 0, kBase + 0x200000000},   // 2 slots, in a small block
      {2, 80 * MiB, 0, kBase + 0x300000000},  // 2 slots, in a large block
      {1, 2 * MiB, 1, kBase + 0x400000000},
  };
  const std::vector<TargetRun> runs = {{{10, 20}, true, true}};  // 10 slots, both ends shared
  const GrowthLayout g = plan_growth(free, runs, r, true);
  // Inside [11, 19): the 4-slot piece, then a 2-slot piece (the one in the smaller block), then the
  // other; the shared ends: the one-slot piece, then a new slot.
  REQUIRE(g.recycled.size() == 4);
  CHECK(g.recycled[0].piece == 0);
  CHECK(g.recycled[0].target_slot == 11);
  CHECK(g.recycled[1].piece == 1);
  CHECK(g.recycled[1].target_slot == 15);
  CHECK(g.recycled[2].piece == 2);
  CHECK(g.recycled[2].target_slot == 17);
  CHECK(g.recycled[3].piece == 3);
  CHECK(g.recycled[3].target_slot == 10);
  REQUIRE(g.created.size() == 1);
  CHECK(g.created[0] == SlotRange{19, 20});
  CHECK(g.created_slots() == 1);
  // Without recycling everything is created.
  const GrowthLayout n = plan_growth(free, runs, r, false);
  CHECK(n.recycled.empty());
  CHECK(n.created_slots() == 10);
}

TEST_CASE("growth policy: pieces are one slot while the footprint is below short_pieces_below_mb",
          "[policy][growth][pieces][short_pieces]") {
  constexpr std::size_t slot = 2 * MiB;
  PieceRules r;
  r.max_piece_slots = 4;            // 8 MiB
  r.frontier_max_piece_slots = 16;  // 32 MiB
  r.short_below_bytes = 4 * GiB;
  // Below the bound: one-slot pieces, and no longer frontier pieces.
  const PieceRules small = piece_rules_for_footprint(r, 4 * GiB - slot, slot);
  CHECK(small.max_piece_slots == 1);
  CHECK(small.frontier_max_piece_slots == 0);
  CHECK(small.mode == PieceMode::adaptive);
  CHECK(small.recycle_across_pools == r.recycle_across_pools);
  CHECK(small.hole_edge_first == r.hole_edge_first);
  // An empty engine is below any bound but 0.
  CHECK(piece_rules_for_footprint(r, 0, slot).max_piece_slots == 1);
  // At and above the bound, and with the rule off (0): unchanged.
  PieceRules off = r;
  off.short_below_bytes = 0;
  for (const auto& [rules, reserved] : {std::pair{r, 4 * GiB}, std::pair{r, 4 * GiB + slot}, std::pair{off, std::size_t{0}}}) {
    const PieceRules same = piece_rules_for_footprint(rules, reserved, slot);
    CHECK(same.max_piece_slots == 4);
    CHECK(same.frontier_max_piece_slots == 16);
  }
  // Fixed mode keeps its fixed pieces whatever the footprint.
  PieceRules fixed = r;
  fixed.mode = PieceMode::fixed;
  fixed.fixed_slots = 10;
  const PieceRules f = piece_rules_for_footprint(fixed, 0, slot);
  CHECK(f.fixed_slots == 10);
  CHECK(f.max_piece_slots == 4);
  CHECK(unit_slots(f) == 10);

  // What the planner makes of it: a 40-slot frontier growth whose first slot is shared with the
  // memory below is 11 pieces with the rules as they are (1 + 10 of at most 4), 40 below the bound.
  const std::vector<TargetRun> runs = {{{100, 140}, true, false}};
  CHECK(plan_growth({}, runs, r, true).created.size() == 11);
  const GrowthLayout one = plan_growth({}, runs, small, true);
  REQUIRE(one.created.size() == 40);
  for (const SlotRange& c : one.created) CHECK(c.size() == 1);
  CHECK(lengthen_frontier_pieces(one, runs, /*at_region_end=*/true, small).created.size() == 40);
}

TEST_CASE("growth policy: with footprint_pieces no piece is longer than the footprint / N",
          "[policy][growth][pieces][footprint_pieces]") {
  constexpr std::size_t slot = 2 * MiB;
  PieceRules r;
  r.max_piece_slots = 4;  // 8 MiB
  r.footprint_pieces = 512;
  // footprint / 512: 1 GiB -> 2 MiB (1 slot), 2 GiB -> 4 MiB, 3 GiB -> 6 MiB; from 4 GiB on the
  // longest piece is max_piece_slots again. Below 1 GiB: one slot, never none.
  const std::vector<std::pair<std::size_t, std::size_t>> cases = {
      {0, 1}, {100 * MiB, 1}, {GiB, 1}, {2 * GiB - slot, 1}, {2 * GiB, 2}, {3 * GiB, 3}, {4 * GiB, 4}, {64 * GiB, 4}};
  for (const auto& [reserved, longest] : cases) {
    CAPTURE(reserved, longest);
    const PieceRules g = piece_rules_for_footprint(r, reserved, slot);
    CHECK(g.max_piece_slots == longest);
    CHECK(g.frontier_max_piece_slots == 0);  // off stays off
  }
  // Unlimited pieces (max_piece_slots 0) get the footprint's limit.
  PieceRules unlimited = r;
  unlimited.max_piece_slots = 0;
  CHECK(piece_rules_for_footprint(unlimited, 64 * GiB, slot).max_piece_slots == 64);
  // Frontier pieces: limited too, so below the footprint that allows them they are off
  // (lengthen_frontier_pieces acts only when they are longer than max_piece_slots).
  PieceRules frontier = r;
  frontier.frontier_max_piece_slots = 16;
  const PieceRules fs = piece_rules_for_footprint(frontier, 2 * GiB, slot);
  CHECK(fs.max_piece_slots == 2);
  CHECK(fs.frontier_max_piece_slots == 2);
  const std::vector<TargetRun> runs = {{{100, 140}, true, false}};
  const GrowthLayout planned = plan_growth({}, runs, fs, true);
  CHECK(planned.created.size() == 1 + 20);  // the shared slot, then 39 inside slots in pieces of <= 2
  for (const SlotRange& c : planned.created) CHECK(c.size() <= 2);
  CHECK(lengthen_frontier_pieces(planned, runs, true, fs).created == planned.created);
  CHECK(piece_rules_for_footprint(frontier, 32 * GiB, slot).frontier_max_piece_slots == 16);
  // short_below_bytes wins below its bound; off (0), and in fixed mode: unchanged.
  PieceRules both = r;
  both.short_below_bytes = 4 * GiB;
  CHECK(piece_rules_for_footprint(both, 3 * GiB, slot).max_piece_slots == 1);
  CHECK(piece_rules_for_footprint(both, 4 * GiB, slot).max_piece_slots == 4);
  PieceRules off = r;
  off.footprint_pieces = 0;
  CHECK(piece_rules_for_footprint(off, 0, slot).max_piece_slots == 4);
  PieceRules fixed = r;
  fixed.mode = PieceMode::fixed;
  CHECK(piece_rules_for_footprint(fixed, 0, slot).max_piece_slots == 4);
}

TEST_CASE("growth policy: a growth at a region's end that moves nothing creates longer frontier pieces",
          "[policy][growth][pieces][frontier]") {
  PieceRules r;
  r.max_piece_slots = 4;            // 8 MiB
  r.frontier_max_piece_slots = 16;  // 32 MiB
  // 40 slots, the first shared with memory below: one slot for it, the 39 inside slots in
  // near-equal pieces of at most 4 (10 pieces) or, at the frontier, at most 16 (3 pieces of 13).
  const std::vector<TargetRun> runs = {{{100, 140}, true, false}};
  const GrowthLayout planned = plan_growth({}, runs, r, true);
  REQUIRE(planned.created.size() == 11);
  const GrowthLayout g = lengthen_frontier_pieces(planned, runs, /*at_region_end=*/true, r);
  CHECK(g.recycled.empty());
  REQUIRE(g.created.size() == 4);
  CHECK(g.created[0] == SlotRange{100, 101});
  CHECK(g.created[1] == SlotRange{101, 114});
  CHECK(g.created[2] == SlotRange{114, 127});
  CHECK(g.created[3] == SlotRange{127, 140});
  CHECK(g.created_slots() == planned.created_slots());
  // Away from a region's end: unchanged.
  CHECK(lengthen_frontier_pieces(planned, runs, false, r).created == planned.created);
  // A growth that moves a free piece is not building the footprint: unchanged.
  const std::vector<FreePiece> free = {{4, 8 * MiB, 0, kBase}};
  const GrowthLayout moving = plan_growth(free, runs, r, true);
  REQUIRE(moving.recycled.size() == 1);
  const GrowthLayout kept = lengthen_frontier_pieces(moving, runs, true, r);
  CHECK(kept.created == moving.created);
  CHECK(kept.recycled.size() == 1);
  // Off (0, or not above the longest piece), and in fixed mode: unchanged.
  PieceRules off = r;
  off.frontier_max_piece_slots = 0;
  CHECK(lengthen_frontier_pieces(planned, runs, true, off).created == planned.created);
  off.frontier_max_piece_slots = 4;
  CHECK(lengthen_frontier_pieces(planned, runs, true, off).created == planned.created);
  PieceRules fixed;
  fixed.mode = PieceMode::fixed;
  fixed.fixed_slots = 10;
  fixed.frontier_max_piece_slots = 20;
  const GrowthLayout f = plan_growth({}, runs, fixed, false);
  CHECK(lengthen_frontier_pieces(f, runs, true, fixed).created == f.created);
}

TEST_CASE("growth policy: recycling takes pieces at a hole's edge first", "[policy][growth][recycle]") {
  PieceRules r;  // hole_edge_first by default
  const std::vector<FreePiece> free = {
      {2, 4 * MiB, 0, kBase + 0x100000000, false},   // in the smallest block, mapped memory around it
      {2, 80 * MiB, 0, kBase + 0x200000000, true},   // bordering an unmapped slot
      {2, 40 * MiB, 0, kBase + 0x300000000, true},
  };
  const std::vector<TargetRun> runs = {{{0, 4}, false, false}};
  GrowthLayout g = plan_growth(free, runs, r, true);
  REQUIRE(g.recycled.size() == 2);
  CHECK(g.recycled[0].piece == 2);  // edge pieces first, the smaller block first among them
  CHECK(g.recycled[1].piece == 1);
  r.hole_edge_first = false;
  g = plan_growth(free, runs, r, true);
  REQUIRE(g.recycled.size() == 2);
  CHECK(g.recycled[0].piece == 0);  // without the rule: the smallest block first
  CHECK(g.recycled[1].piece == 2);
}

TEST_CASE("growth policy: with overhang a longer free piece covers a run's rest and reaches into the hole",
          "[policy][growth][recycle][overhang]") {
  PieceRules r;
  r.hole_edge_first = false;
  const std::vector<FreePiece> free = {
      {4, 40 * MiB, 0, kBase + 0x100000000},  // 4 slots
      {3, 30 * MiB, 0, kBase + 0x200000000},  // 3 slots
      {6, 60 * MiB, 0, kBase + 0x300000000},  // 6 slots
  };
  // 6 slots [10, 16), the last shared (the request ends inside it), 5 unmapped slots after it.
  TargetRun run{{10, 16}, false, true};
  run.room_after = 5;
  const std::vector<TargetRun> runs = {run};
  // Without overhang: the 4-slot piece fills [10, 14), nothing fits [14, 15), so slot 14 and the
  // shared slot 15 are created.
  GrowthLayout g = plan_growth(free, runs, r, true);
  REQUIRE(g.recycled.size() == 1);
  CHECK(g.recycled[0].piece == 0);
  CHECK(g.created_slots() == 2);
  // With it: the rest [14, 16) goes to the shortest longer piece, the 3-slot one, which ends at
  // slot 17, inside the room after the run. Nothing is created.
  r.overhang = true;
  g = plan_growth(free, runs, r, true);
  REQUIRE(g.recycled.size() == 2);
  CHECK(g.recycled[0].piece == 0);
  CHECK(g.recycled[0].target_slot == 10);
  CHECK(g.recycled[1].piece == 1);
  CHECK(g.recycled[1].target_slot == 14);
  CHECK(g.created.empty());
  // Only as far as the room after the run: one slot there still takes the 3-slot piece (it ends
  // at 17); with none (the slot after the run mapped) it does not fit, and the rest is created.
  std::vector<TargetRun> tight = runs;
  tight[0].room_after = 1;
  g = plan_growth(free, tight, r, true);
  REQUIRE(g.recycled.size() == 2);
  CHECK(g.recycled[1].piece == 1);
  CHECK(g.created.empty());
  tight[0].room_after = 0;
  g = plan_growth(free, tight, r, true);
  REQUIRE(g.recycled.size() == 1);
  CHECK(g.created_slots() == 2);
  // Fixed pieces never overhang (they stay unit-aligned).
  PieceRules fixed;
  fixed.mode = PieceMode::fixed;
  fixed.fixed_slots = 1;
  fixed.overhang = true;
  const std::vector<FreePiece> ones = {{1, 2 * MiB, 0, kBase + 0x100000000}};
  g = plan_growth(ones, runs, fixed, true);
  REQUIRE(g.recycled.size() == 1);
  CHECK(g.created_slots() == 5);
}

TEST_CASE("growth policy: overhang covers a lone shared last slot with the shortest piece", "[policy][growth][recycle][overhang]") {
  PieceRules r;
  r.overhang = true;
  const std::vector<FreePiece> free = {
      {4, 40 * MiB, 0, kBase + 0x100000000},
      {2, 30 * MiB, 0, kBase + 0x200000000},
  };
  // Two slots [0, 2), the last shared: no piece fits the one inside slot, so the rest (both slots)
  // goes to the shortest piece that covers it, the 2-slot one, exactly, without reaching past.
  TargetRun run{{0, 2}, false, true};
  run.room_after = 8;
  GrowthLayout g = plan_growth(free, std::vector<TargetRun>{run}, r, true);
  REQUIRE(g.recycled.size() == 1);
  CHECK(g.recycled[0].piece == 1);
  CHECK(g.recycled[0].target_slot == 0);
  CHECK(g.created.empty());
  // A run that is only a shared last slot after a recycled inside: the 4-slot piece fills [0, 4),
  // the shared slot 4 takes the 2-slot piece, which reaches one slot into the hole.
  TargetRun run2{{0, 5}, false, true};
  run2.room_after = 1;
  g = plan_growth(free, std::vector<TargetRun>{run2}, r, true);
  REQUIRE(g.recycled.size() == 2);
  CHECK(g.recycled[0].piece == 0);
  CHECK(g.recycled[1].piece == 1);
  CHECK(g.recycled[1].target_slot == 4);
  CHECK(g.created.empty());
}

TEST_CASE("growth policy: every planned growth covers its runs exactly once", "[policy][growth][recycle]") {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 500; ++round) {
    PieceRules r;
    if (rng() % 3 == 0) {
      r.mode = PieceMode::fixed;
      r.fixed_slots = 1 + rng() % 4;
    } else {
      r.max_piece_slots = rng() % 6;
    }
    r.overhang = rng() % 2 == 0;
    std::vector<FreePiece> free;
    const int nf = static_cast<int>(rng() % 8);
    for (int i = 0; i < nf; ++i) {
      const std::size_t len = r.mode == PieceMode::fixed ? r.fixed_slots : 1 + rng() % 5;
      free.push_back({len, (1 + rng() % 10) * MiB, rng() % 2, kBase + 0x100000000 * (i + 1), rng() % 2 == 0});
    }
    std::vector<TargetRun> runs;
    std::size_t at = 0;
    const int nr = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < nr; ++i) {
      const std::size_t u = unit_slots(r);
      at = round_up(at + rng() % 5, u);
      const std::size_t len = u * (1 + rng() % 5);
      runs.push_back({{at, at + len}, rng() % 2 == 0, rng() % 2 == 0});
      at += len + u;
    }
    // The last run may have unmapped slots after it (the others have a mapped slot after them).
    runs.back().room_after = rng() % 4;
    const std::size_t end = at + runs.back().room_after;
    const GrowthLayout g = plan_growth(free, runs, r, rng() % 4 != 0);
    std::vector<int> cover(end + 8, 0);  // pieces are at most 5 slots: a bad overhang shows past `end`
    std::vector<int> used(free.size(), 0);
    for (const RecycleChoice& c : g.recycled) {
      REQUIRE(c.piece < free.size());
      CHECK(++used[c.piece] == 1);
      for (std::size_t s = c.target_slot; s < c.target_slot + free[c.piece].slots; ++s) ++cover[s];
    }
    for (const SlotRange& c : g.created)
      for (std::size_t s = c.lo; s < c.hi; ++s) ++cover[s];
    // Every slot of the runs once; the room after the last run at most once, and only by a piece
    // that starts inside that run (an overhang).
    std::vector<int> want(end + 8, 0);
    for (const TargetRun& t : runs)
      for (std::size_t s = t.slots.lo; s < t.slots.hi; ++s) want[s] = 1;
    const SlotRange after{runs.back().slots.hi, end};
    for (std::size_t s = after.lo; s < after.hi; ++s) {
      CHECK(cover[s] <= 1);
      if (r.mode == PieceMode::fixed || !r.overhang) CHECK(cover[s] == 0);
      want[s] = cover[s];
    }
    CHECK(cover == want);
    for (const SlotRange& c : g.created) CHECK(c.hi <= after.lo);
  }
}

TEST_CASE("growth policy: one RecyclePlanner plans every place as plan_growth did, sorting once",
          "[policy][growth][recycle][planner]") {
  // Random free pieces (lengths 0-12, and over 1,024 in some rounds; few distinct extents and
  // streams so that the later keys decide, unique addresses as in the engine), planned over by one
  // planner at several places, each leaving out random pieces (those where its request lands):
  // every layout equals the old algorithm's over the pieces offered, its piece indices mapped back.
  std::mt19937_64 rng(7);
  RecyclePlanner planner;  // one for every round: its lists are reused
  GrowthLayout got;
  int recycled_total = 0, overhangs_possible = 0;
  for (int round = 0; round < 400; ++round) {
    PieceRules r;
    if (rng() % 4 == 0) {
      r.mode = PieceMode::fixed;
      r.fixed_slots = 1 + rng() % 3;
    } else {
      r.max_piece_slots = rng() % 8;
    }
    r.overhang = rng() % 2 == 0;
    r.hole_edge_first = rng() % 3 != 0;
    std::vector<FreePiece> free;
    const int nf = static_cast<int>(rng() % 40);
    for (int i = 0; i < nf; ++i) {
      std::size_t len = r.mode == PieceMode::fixed ? r.fixed_slots * (rng() % 8 == 0 ? 0 : 1) : rng() % 13;
      // Every tenth round has pieces longer than the planner groups by counting (its sorted path).
      if (round % 10 == 0 && rng() % 5 == 0) len = 1025 + rng() % 3;
      free.push_back({len, (1 + rng() % 3) * MiB, rng() % 2, kBase + 0x100000000 * ((i * 7919) % 1000 + 1),
                      rng() % 2 == 0});
    }
    planner.prepare(free, r);
    REQUIRE(reference_plan_growth(free, {}, r, true).recycled.empty());
    for (int place = 0; place < 6; ++place) {
      std::vector<TargetRun> runs;
      std::size_t at = 0;
      const int nr = static_cast<int>(rng() % 4);
      for (int i = 0; i < nr; ++i) {
        const std::size_t u = unit_slots(r);
        at = round_up(at + rng() % 5, u);
        const std::size_t len = u * (1 + rng() % 12);
        runs.push_back({{at, at + len}, rng() % 2 == 0, rng() % 2 == 0});
        at += len + u;
      }
      if (!runs.empty()) runs.back().room_after = rng() % 8;
      const bool recycle = rng() % 5 != 0;
      std::vector<std::uint8_t> skip;
      std::vector<FreePiece> offered;
      std::vector<std::size_t> offered_index;  // position in offered -> index in free
      const bool skipping = rng() % 3 != 0;
      for (std::size_t i = 0; i < free.size(); ++i) {
        const bool left_out = skipping && rng() % 4 == 0;
        skip.push_back(left_out ? 1 : 0);
        if (left_out) continue;
        offered.push_back(free[i]);
        offered_index.push_back(i);
      }
      planner.plan(skipping ? std::span<const std::uint8_t>(skip) : std::span<const std::uint8_t>(), runs, r, recycle,
                   got);
      GrowthLayout want = reference_plan_growth(offered, runs, r, recycle);
      for (RecycleChoice& c : want.recycled) c.piece = offered_index[c.piece];
      CHECK(same_choices(got.recycled, want.recycled));
      CHECK(got.created == want.created);
      recycled_total += static_cast<int>(got.recycled.size());
      if (r.overhang && r.mode == PieceMode::adaptive && !runs.empty() && runs.back().room_after > 0) ++overhangs_possible;
    }
    // plan_growth itself (a planner of its own) over every piece.
    const std::vector<TargetRun> one = {{{3, 3 + 1 + rng() % 30}, rng() % 2 == 0, rng() % 2 == 0, rng() % 6}};
    const GrowthLayout g = plan_growth(free, one, r, true), w = reference_plan_growth(free, one, r, true);
    CHECK(same_choices(g.recycled, w.recycled));
    CHECK(g.created == w.created);
  }
  // The rounds exercised recycling and overhang, not only creation.
  CHECK(recycled_total > 2000);
  CHECK(overhangs_possible > 200);
}

TEST_CASE("growth policy: frontier pieces lengthened in place are those of lengthen_frontier_pieces",
          "[policy][growth][pieces][frontier]") {
  PieceRules r;
  r.max_piece_slots = 4;
  r.frontier_max_piece_slots = 16;
  const std::vector<TargetRun> runs = {{{100, 140}, true, false}, {{150, 153}, false, true}};
  const GrowthLayout planned = plan_growth({}, runs, r, true);
  GrowthLayout in_place = planned;
  lengthen_frontier_pieces_in_place(in_place, runs, true, r);
  const GrowthLayout copied = lengthen_frontier_pieces(planned, runs, true, r);
  CHECK(in_place.created == copied.created);
  CHECK(in_place.created.size() < planned.created.size());
  CHECK(in_place.created_slots() == planned.created_slots());
  // Away from a region's end: unchanged.
  GrowthLayout away = planned;
  lengthen_frontier_pieces_in_place(away, runs, false, r);
  CHECK(away.created == planned.created);
}
