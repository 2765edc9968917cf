// Growth policy: how the engine grows when no cached block fits. Pure functions of plain values:
// the mechanism (expandable_growth.cpp, classic_growth.cpp) gathers the candidates, asks, and
// acts. See Note [Physical page recycling] in docs/notes/physical-page-recycling.md and Note
// [Allocation policy] in docs/notes/allocation-policy.md (the corpus the choices were measured on).
// Thread-safety: pure functions, callable from anywhere. RecyclePlanner holds plain values only
// (its answers depend on its inputs alone) and is used by one thread at a time.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "gpumem/alloc/config.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc::policy {

// Address space an expandable region reserves: va_reserve_bytes if set, else 1.125 x the provider's
// total (PyTorch's choice), else (total unknown, 0) kUnknownTotalRegionVaBytes; at least one unit
// (the longest fixed piece, or a slot), rounded up to whole units.
inline constexpr std::size_t kUnknownTotalRegionVaBytes = std::size_t{256} << 30;
std::size_t region_va_bytes(std::size_t va_reserve_bytes, std::size_t provider_total_bytes,
                            std::size_t unit_bytes) noexcept;

// Classic (non-expandable) segment size for a rounded request: 2 MiB for the small pool, the large
// segment size for 1-10 MiB, else rounded up to 2 MiB (then to the source's granularity).
std::size_t classic_segment_bytes(std::size_t rounded_bytes, std::size_t large_segment_bytes,
                                  std::size_t granularity_bytes) noexcept;

// ---- placement: where in an expandable region a request lands

// Where a request of size_bytes may go in a hole [hole_lo, hole_hi) (a run of free and unmapped
// blocks at least size_bytes long): at its start, so that it shares its first granule with the
// memory below the hole instead of opening a new partly used granule; with both_ends, also at its
// end (rounded down to 512 bytes). The engine places at the start only: on the corpus, placing at
// either end left more partly used granules at the peak (docs/notes/allocation-policy.md).
struct PlacementAddresses {
  std::uintptr_t addr[2] = {};
  int count = 0;
};
PlacementAddresses placement_addresses(std::uintptr_t hole_lo, std::uintptr_t hole_hi, std::size_t size_bytes,
                                       bool both_ends = false) noexcept;

struct PlacementCandidate {
  std::uintptr_t addr = 0;
  std::size_t slots_needed = 0;  // unmapped slots the request needs mapped there (unit-aligned)
  std::size_t hole_bytes = 0;    // size of the hole it lies in
  bool at_region_end = false;    // the hole reaches the end of its region (the frontier)
};

// The candidates worth planning in full (plan_growth for each, then choose_growth): the `limit`
// needing the fewest new slots (ties: the smaller hole, then the lower address), and every
// candidate at a region's end, where any free piece fits. Indices, without repeats.
std::vector<std::size_t> shortlist_placements(std::span<const PlacementCandidate> candidates, std::size_t limit);
// The same indices, in the same order, into `out` (its capacity kept; no list of its own).
void shortlist_placements(std::span<const PlacementCandidate> candidates, std::size_t limit,
                          std::vector<std::size_t>& out);

// ---- pieces: how the slots a request needs are backed

// Slots [lo, hi) of a region, counted from its base.
struct SlotRange {
  std::size_t lo = 0;
  std::size_t hi = 0;
  std::size_t size() const noexcept { return hi - lo; }
  friend bool operator==(const SlotRange&, const SlotRange&) = default;
};

enum class PieceMode : std::uint8_t {
  // Pieces follow the requests: the slots inside a request are backed by as few pieces as the
  // longest-piece rule allows, and a slot the request shares with memory around it (its first or
  // last, when the request starts or ends inside it) by a piece of one slot. A piece that backs
  // only the inside of a request is wholly free once the request is, so it can move.
  adaptive,
  // Every piece is fixed_slots long and aligned to that many slots (PyTorch's expandable segments
  // map 20 MiB pages this way).
  fixed,
};

struct PieceRules {
  PieceMode mode = PieceMode::adaptive;
  std::size_t fixed_slots = 1;        // fixed: the length of every piece
  std::size_t max_piece_slots = 0;    // adaptive: the longest piece (0 = no limit)
  // adaptive: the longest piece of a growth at a region's end that moves no free piece
  // (lengthen_frontier_pieces); 0 = max_piece_slots there too.
  std::size_t frontier_max_piece_slots = 0;
  bool recycle_across_pools = true;   // adaptive: the other pool's wholly free pieces may move too
  // Recycling takes the free pieces that border unmapped slots (or their region's end) first:
  // moving one widens a hole instead of opening a new one, and every hole's edges leave partly
  // used granules behind.
  bool hole_edge_first = true;
  // adaptive: when no free piece fits what is left of a run, a longer one may still move there if
  // the slots after the run are unmapped (TargetRun::room_after): it covers the rest of the run and
  // reaches past it into the hole, instead of new memory being created for the rest. The footprint
  // does not grow (the piece was mapped elsewhere); the part past the request is free memory where
  // the next request in that hole lands (placement takes a hole's start).
  bool overhang = false;
  // adaptive, pieces that follow the footprint (piece_rules_for_footprint): while the engine
  // reserves less than short_below_bytes, every piece is one slot (short_pieces_below_mb; 0 = off);
  // with footprint_pieces N, no piece is longer than the footprint / N, at least one slot
  // (footprint_pieces; 0 = off).
  std::size_t short_below_bytes = 0;
  std::size_t footprint_pieces = 0;
};

// Growth maps whole units: fixed_slots in fixed mode, one slot in adaptive mode.
inline std::size_t unit_slots(const PieceRules& rules) noexcept {
  return rules.mode == PieceMode::fixed ? rules.fixed_slots : 1;
}

// A maximal run of unmapped slots that a growth maps (the unmapped slots of the unit-aligned range
// a request covers). head_shared / tail_shared: its first / last slot also holds memory outside
// the request (the request starts / ends inside that slot, or, in fixed mode, the unit reaches
// past the request).
struct TargetRun {
  SlotRange slots;
  bool head_shared = false;
  bool tail_shared = false;
  // Unmapped slots right after the run, in the same hole, that a recycled piece may also cover
  // (PieceRules::overhang); 0 when the slot after the run is mapped or the region ends there.
  std::size_t room_after = 0;
};

// A wholly free mapped piece that could move to where the request lands.
struct FreePiece {
  std::size_t slots = 0;         // its length
  std::size_t extent_bytes = 0;  // the free block holding it
  StreamId stream = 0;
  std::uintptr_t addr = 0;
  bool at_hole_edge = false;     // an unmapped slot (or its region's start or end) borders it
};

struct RecycleChoice {
  std::size_t piece = 0;        // index into the free pieces given
  std::size_t target_slot = 0;  // the first slot it is mapped at
};

// What one growth maps: free pieces moved (unmapped where they are, mapped at target_slot) and new
// pieces created. Together they cover every slot of the target runs exactly once.
struct GrowthLayout {
  std::vector<RecycleChoice> recycled;
  std::vector<SlotRange> created;
  std::size_t created_slots() const noexcept;
};

// New pieces for slots [gap.lo, gap.hi) of one target run. Fixed mode: units of fixed_slots (the
// gap is unit-aligned). Adaptive mode: a one-slot piece for a shared first or last slot (head /
// tail: the gap begins / ends at such a slot), the rest in the fewest pieces no longer than
// max_piece_slots, of near-equal length. In address order; they tile the gap.
std::vector<SlotRange> plan_new_pieces(SlotRange gap, bool head_shared, bool tail_shared, const PieceRules& rules);
// The same pieces, appended to `out` (no list of its own).
void append_new_pieces(SlotRange gap, bool head_shared, bool tail_shared, const PieceRules& rules,
                       std::vector<SlotRange>& out);

// The layout of one growth. With recycle, free pieces are moved before anything is created:
// each run's inside slots (all of them in fixed mode; adaptive: without the shared first and last
// slot) are filled from its start with the longest free piece that fits in what is left (ties: with
// hole_edge_first, a piece at a hole's edge; then the piece in the smaller free block, so large free
// runs stay whole; then the lower stream, then the higher address, then the lower index: the engine's
// pieces never tie that far), then its shared slots with one-slot pieces. With overhang (adaptive),
// when the inside is not filled, the shortest free piece that covers the rest of the run (its shared
// last slot included) and ends within room_after slots past it moves there instead. What is left is
// created with plan_new_pieces. free_pieces must not lie where the request lands. A recycled piece
// may end past its run only by overhang. A RecyclePlanner of its own (below) does the work.
GrowthLayout plan_growth(std::span<const FreePiece> free_pieces, std::span<const TargetRun> runs,
                         const PieceRules& rules, bool recycle);

// plan_growth for many places of one growth. The order in which recycling takes the free pieces
// (by length; within a length, with hole_edge_first the pieces at a hole's edge first, then the
// piece in the smaller free block, the lower stream, the higher address, then the lower index) does
// not depend on where the request lands, so it is shared by every plan of the growth, each leaving
// out the pieces where its own request lands. plan_growth sorted the pieces and built a map of
// lists by length for every place (docs/notes/fast-path.md). prepare groups the pieces by length;
// within a length the order is made only as far as the plans read it (a heap per length), since a
// growth takes a few of the pieces it is offered. Reusable: its lists keep their capacity from one
// growth to the next.
class RecyclePlanner {
 public:
  // The free pieces the following plans take from, in recycling's order for `rules`
  // (hole_edge_first). The pieces are not copied: they must stay alive and unchanged until the
  // last plan over them.
  void prepare(std::span<const FreePiece> free_pieces, const PieceRules& rules);
  // Exactly the layout plan_growth(offered, runs, rules, recycle) gives, where `offered` is the
  // prepared pieces without those whose skip[i] is nonzero (an empty skip leaves none out, else it
  // has one entry per prepared piece), in their order, except that recycled[].piece indexes the
  // prepared pieces. Written into `out` (its lists cleared first, their capacity kept). `rules` must
  // be prepare's (the order depends on them).
  void plan(std::span<const std::uint8_t> skip, std::span<const TargetRun> runs, const PieceRules& rules,
            bool recycle, GrowthLayout& out);

 private:
  struct Length {
    std::size_t slots = 0;
    std::size_t begin = 0, end = 0;  // its pieces: order_[begin, end), the first taken first
  };
  // A piece's place in the order: compared member by member.
  struct Key {
    std::size_t slots = 0;
    bool not_at_edge = false;  // with hole_edge_first
    std::size_t extent_bytes = 0;
    StreamId stream = 0;
    std::uintptr_t inverted_addr = 0;  // ~addr: the higher address first
    std::size_t index = 0;
    friend auto operator<=>(const Key&, const Key&) = default;
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  // Lengths up to this many slots are grouped by counting; longer ones (no rule makes them) by one
  // sort of every piece.
  static constexpr std::size_t kCountedSlots = 1024;
  void order_up_to(std::size_t b, std::size_t pos);
  // The piece at position pos of the order, pos in length b's range.
  std::size_t piece_at(std::size_t b, std::size_t pos) {
    if (pos >= ready_[b]) order_up_to(b, pos);
    return order_[pos];
  }
  bool has_piece(std::size_t b);
  std::size_t highest_at_or_below(std::size_t b);
  std::size_t lowest_at_or_above(std::size_t b);
  std::size_t take_from(std::size_t b) { return piece_at(b, next_[b]++); }
  std::optional<std::size_t> take_longest_within(std::size_t room);

  std::span<const FreePiece> pieces_;
  std::vector<Key> keys_;      // the pieces of at least one slot, in the pieces' order
  std::vector<Key> grouped_;   // the same keys by length: per length, [begin, ready) in order, then a heap
  std::vector<std::size_t> counts_;
  std::vector<std::size_t> order_;  // indices of the pieces, by length, then as taken; valid below ready_
  std::vector<std::size_t> ready_;  // per length, the end of the part of order_ made so far
  std::vector<Length> lengths_;     // the distinct lengths, ascending
  // One plan's state: per length, the next piece of order_ to look at; and links to skip lengths
  // found empty (below_: towards shorter ones, kNone past the shortest; above_: towards longer
  // ones, lengths_.size() past the longest), shortened as they are followed.
  std::span<const std::uint8_t> skip_;
  std::vector<std::size_t> next_, below_, above_;
};

// Frontier pieces: a growth at a region's end that moves no free piece builds the footprint (the
// warm-up, or a new high); every piece costs a create and a map (~49 us on an H200) whatever its
// length, so there the pieces may be longer: the layout planned again (no recycling: it moved
// nothing) with frontier_max_piece_slots as the longest piece. Unchanged in fixed mode, when the
// rule is off (frontier_max_piece_slots not above a limited max_piece_slots), away from a region's
// end, or when the growth moves pieces. The cost: a longer piece, once free, fits fewer of the
// holes recycling fills (docs/notes/allocation-policy.md, "How far the whole-run VMM share can go").
GrowthLayout lengthen_frontier_pieces(const GrowthLayout& layout, std::span<const TargetRun> runs,
                                      bool at_region_end, const PieceRules& rules);
// The same change made in place (no copy of the layout).
void lengthen_frontier_pieces_in_place(GrowthLayout& layout, std::span<const TargetRun> runs, bool at_region_end,
                                       const PieceRules& rules);

// Pieces that follow the footprint (docs/notes/allocation-policy.md, "Held-out workloads" and
// "Pieces that follow the footprint"): the piece rules a growth plans with when the engine reserves
// reserved_bytes, in slots of slot_bytes. A piece that a small long-lived block lands in keeps the
// rest of its length from moving, so the waste a hole's edges leave is up to a piece per edge:
// pieces short against the footprint bound it as a share of the footprint.
// - While reserved_bytes < short_below_bytes: every piece is one slot (frontier pieces too).
// - With footprint_pieces N: the longest piece (max_piece_slots, and frontier_max_piece_slots when
//   it is on) is at most reserved_bytes / N, and at least one slot; a longer limit is kept.
// Unchanged in fixed mode (its pieces are fixed_slots long whatever the footprint), and with both
// rules off (0).
PieceRules piece_rules_for_footprint(const PieceRules& rules, std::size_t reserved_bytes,
                                     std::size_t slot_bytes) noexcept;

// ---- which planned growth to take

struct GrowthOption {
  std::size_t created_slots = 0;  // new physical memory it needs
  std::size_t pieces_moved = 0;   // pieces created or recycled (each a map call, and a create or an unmap)
  std::size_t hole_bytes = 0;
  std::uintptr_t addr = 0;
};

// The option creating the fewest slots (physical memory grows least); ties: the fewest pieces
// moved (driver calls), then the smaller hole (large holes stay for large requests), then the lower
// address (regions stay compact). nullopt if there is none.
std::optional<std::size_t> choose_growth(std::span<const GrowthOption> options) noexcept;

}  // namespace gpumem::alloc::policy
