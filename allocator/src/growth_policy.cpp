#include "growth_policy.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <tuple>

#include "cap_policy.h"
#include "size_policy.h"

namespace gpumem::alloc::policy {

std::size_t region_va_bytes(std::size_t va_reserve_bytes, std::size_t provider_total_bytes,
                            std::size_t unit_bytes) noexcept {
  std::size_t va = va_reserve_bytes;
  if (va == 0) va = provider_total_bytes ? provider_total_bytes + provider_total_bytes / 8 : kUnknownTotalRegionVaBytes;
  return round_up(std::max(va, unit_bytes), unit_bytes);
}

std::size_t classic_segment_bytes(std::size_t rounded_bytes, std::size_t large_segment_bytes,
                                  std::size_t granularity_bytes) noexcept {
  std::size_t seg;
  if (rounded_bytes <= kSmallRequestBytes) {
    seg = kSmallSegmentBytes;
  } else if (rounded_bytes < kMinLargeAllocBytes) {
    seg = large_segment_bytes;
  } else {
    seg = round_up(rounded_bytes, kRoundLargeBytes);
  }
  return granularity_bytes ? round_up(seg, granularity_bytes) : seg;
}

PlacementAddresses placement_addresses(std::uintptr_t hole_lo, std::uintptr_t hole_hi, std::size_t size_bytes,
                                       bool both_ends) noexcept {
  PlacementAddresses out;
  if (hole_hi - hole_lo < size_bytes) return out;
  out.addr[out.count++] = hole_lo;
  if (!both_ends) return out;
  const std::uintptr_t high = (hole_hi - size_bytes) & ~(kMinBlockBytes - 1);
  if (high > hole_lo) out.addr[out.count++] = high;
  return out;
}

std::vector<std::size_t> shortlist_placements(std::span<const PlacementCandidate> candidates, std::size_t limit) {
  std::vector<std::size_t> out;
  shortlist_placements(candidates, limit, out);
  return out;
}

void shortlist_placements(std::span<const PlacementCandidate> candidates, std::size_t limit,
                          std::vector<std::size_t>& out) {
  std::vector<std::size_t>& order = out;  // sorted in place, then the tail compacted
  order.resize(candidates.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](std::size_t i) {
    const PlacementCandidate& c = candidates[i];
    return std::tie(c.slots_needed, c.hole_bytes, c.addr);
  };
  const std::size_t n = std::min(limit, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  // The first n, then the frontier candidates among the rest, in the order partial_sort left them.
  std::size_t kept = n;
  for (std::size_t k = n; k < order.size(); ++k)
    if (candidates[order[k]].at_region_end) order[kept++] = order[k];
  order.resize(kept);
}

std::optional<std::size_t> choose_growth(std::span<const GrowthOption> options) noexcept {
  std::optional<std::size_t> best;
  auto key = [](const GrowthOption& o) { return std::tie(o.created_slots, o.pieces_moved, o.hole_bytes, o.addr); };
  for (std::size_t i = 0; i < options.size(); ++i)
    if (!best || key(options[i]) < key(options[*best])) best = i;
  return best;
}

std::size_t GrowthLayout::created_slots() const noexcept {
  std::size_t n = 0;
  for (const SlotRange& r : created) n += r.size();
  return n;
}

std::vector<SlotRange> plan_new_pieces(SlotRange gap, bool head_shared, bool tail_shared, const PieceRules& rules) {
  std::vector<SlotRange> out;
  append_new_pieces(gap, head_shared, tail_shared, rules, out);
  return out;
}

void append_new_pieces(SlotRange gap, bool head_shared, bool tail_shared, const PieceRules& rules,
                       std::vector<SlotRange>& out) {
  if (gap.size() == 0) return;
  if (rules.mode == PieceMode::fixed) {
    const std::size_t unit = std::max<std::size_t>(rules.fixed_slots, 1);
    for (std::size_t s = gap.lo; s < gap.hi; s += unit) out.push_back({s, std::min(s + unit, gap.hi)});
    return;
  }
  std::size_t lo = gap.lo, hi = gap.hi;
  const bool head = head_shared, tail = tail_shared && hi - lo > (head ? 1u : 0u);
  if (head) ++lo;
  if (tail) --hi;
  if (head) out.push_back({gap.lo, gap.lo + 1});
  if (hi > lo) {
    const std::size_t n = hi - lo;
    const std::size_t longest = rules.max_piece_slots ? rules.max_piece_slots : n;
    const std::size_t count = (n + longest - 1) / longest;
    // count pieces of near-equal length: the first n % count are one slot longer.
    std::size_t at = lo;
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t len = n / count + (i < n % count ? 1 : 0);
      out.push_back({at, at + len});
      at += len;
    }
  }
  if (tail) out.push_back({gap.hi - 1, gap.hi});
}

void RecyclePlanner::prepare(std::span<const FreePiece> free_pieces, const PieceRules& rules) {
  pieces_ = free_pieces;
  keys_.clear();
  lengths_.clear();
  ready_.clear();
  const bool edge_first = rules.hole_edge_first;
  std::size_t longest = 0;
  for (std::size_t i = 0; i < free_pieces.size(); ++i) {
    const FreePiece& p = free_pieces[i];
    if (p.slots == 0) continue;
    keys_.push_back({p.slots, edge_first && !p.at_hole_edge, p.extent_bytes, p.stream, ~p.addr, i});
    longest = std::max(longest, p.slots);
  }
  order_.resize(keys_.size());
  if (longest > kCountedSlots) {
    // Pieces this long are not made by any rule in use; every length is put in order now.
    std::sort(keys_.begin(), keys_.end());
    for (std::size_t k = 0; k < keys_.size(); ++k) {
      order_[k] = keys_[k].index;
      if (lengths_.empty() || lengths_.back().slots != keys_[k].slots) lengths_.push_back({keys_[k].slots, k, k});
      lengths_.back().end = k + 1;
    }
    ready_.reserve(lengths_.size());
    for (const Length& l : lengths_) ready_.push_back(l.end);
    return;
  }
  // The keys grouped by length (a counting sort: lengths ascending, each group in the keys' order).
  counts_.assign(longest + 1, 0);
  for (const Key& k : keys_) ++counts_[k.slots];
  for (std::size_t slots = 1, at = 0; slots <= longest; ++slots) {
    if (counts_[slots] == 0) continue;
    lengths_.push_back({slots, at, at + counts_[slots]});
    counts_[slots] = at;  // from here on: where the next key of this length goes
    at = lengths_.back().end;
  }
  grouped_.resize(keys_.size());
  for (const Key& k : keys_) grouped_[counts_[k.slots]++] = k;
  // Each length a heap whose least key (the first taken) is found in O(1) and put in order in
  // O(log n): the heap lies on [ready, end) seen backwards, so popping it leaves its least key at
  // `ready`, the next place of the order.
  ready_.reserve(lengths_.size());
  for (const Length& l : lengths_) {
    ready_.push_back(l.begin);
    std::make_heap(std::make_reverse_iterator(grouped_.begin() + static_cast<std::ptrdiff_t>(l.end)),
                   std::make_reverse_iterator(grouped_.begin() + static_cast<std::ptrdiff_t>(l.begin)),
                   std::greater<>{});
  }
}

// Puts length b's pieces in order up to position pos (the rest stays a heap).
void RecyclePlanner::order_up_to(std::size_t b, std::size_t pos) {
  const std::size_t end = lengths_[b].end;
  std::size_t& ready = ready_[b];
  while (ready <= pos) {
    std::pop_heap(std::make_reverse_iterator(grouped_.begin() + static_cast<std::ptrdiff_t>(end)),
                  std::make_reverse_iterator(grouped_.begin() + static_cast<std::ptrdiff_t>(ready)),
                  std::greater<>{});
    order_[ready] = grouped_[ready].index;
    ++ready;
  }
}

// Whether length b has a piece this plan may take; moves past the pieces it leaves out.
bool RecyclePlanner::has_piece(std::size_t b) {
  std::size_t& at = next_[b];
  const std::size_t end = lengths_[b].end;
  if (!skip_.empty())
    while (at < end && skip_[piece_at(b, at)]) ++at;
  return at < end;
}

// A length found empty stays empty for the rest of the plan: the links passed over are pointed
// past it, so no walk crosses it twice.
std::size_t RecyclePlanner::highest_at_or_below(std::size_t b) {
  std::size_t x = b;
  while (x != kNone && !has_piece(x)) x = below_[x];
  while (b != x) {
    const std::size_t next = below_[b];
    below_[b] = x;
    b = next;
  }
  return x;
}

std::size_t RecyclePlanner::lowest_at_or_above(std::size_t b) {
  const std::size_t none = lengths_.size();
  std::size_t x = b;
  while (x != none && !has_piece(x)) x = above_[x];
  while (b != x) {
    const std::size_t next = above_[b];
    above_[b] = x;
    b = next;
  }
  return x;
}

// The longest piece of at most `room` slots, if any (the first of its length in the order).
std::optional<std::size_t> RecyclePlanner::take_longest_within(std::size_t room) {
  const auto it = std::upper_bound(lengths_.begin(), lengths_.end(), room,
                                   [](std::size_t r, const Length& l) { return r < l.slots; });
  if (it == lengths_.begin()) return std::nullopt;
  const std::size_t b = highest_at_or_below(static_cast<std::size_t>(it - lengths_.begin()) - 1);
  if (b == kNone) return std::nullopt;
  return take_from(b);
}

void RecyclePlanner::plan(std::span<const std::uint8_t> skip, std::span<const TargetRun> runs,
                          const PieceRules& rules, bool recycle, GrowthLayout& out) {
  out.recycled.clear();
  out.created.clear();
  // Without recycling no length has a piece: every take finds none.
  const std::size_t lengths = recycle ? lengths_.size() : 0;
  skip_ = skip;
  next_.resize(lengths);
  below_.resize(lengths);
  above_.resize(lengths);
  for (std::size_t b = 0; b < lengths; ++b) {
    next_[b] = lengths_[b].begin;
    below_[b] = b - 1;  // kNone for the shortest
    above_[b] = b + 1;
  }
  const std::span<const Length> by_length(lengths_.data(), lengths);
  auto take = [&](std::size_t room) -> std::optional<std::size_t> {
    return lengths ? take_longest_within(room) : std::nullopt;
  };
  for (const TargetRun& run : runs) {
    if (run.slots.size() == 0) continue;
    const bool adaptive = rules.mode == PieceMode::adaptive;
    std::size_t lo = run.slots.lo, hi = run.slots.hi;
    const bool head = adaptive && run.head_shared;
    const bool tail = adaptive && run.tail_shared && hi - lo > (head ? 1u : 0u);
    if (head) ++lo;
    if (tail) --hi;
    // The inside, from its start.
    std::size_t at = lo;
    while (at < hi) {
      const auto i = take(hi - at);
      if (!i) break;
      out.recycled.push_back({*i, at});
      at += pieces_[*i].slots;
    }
    bool head_done = false, tail_done = false;
    // Overhang: what is left at the run's end (the rest of the inside, every free piece left being
    // longer, and the shared last slot) goes to the shortest free piece that covers it and ends
    // within the unmapped slots after the run: it takes least of the hole.
    if (adaptive && rules.overhang && (at < hi || tail) && lengths) {
      const std::size_t rest = run.slots.hi - at;
      const auto it = std::lower_bound(by_length.begin(), by_length.end(), hi - at + 1,
                                       [](const Length& l, std::size_t n) { return l.slots < n; });
      const std::size_t b = lowest_at_or_above(static_cast<std::size_t>(it - by_length.begin()));
      if (b != lengths && lengths_[b].slots <= rest + run.room_after) {
        out.recycled.push_back({take_from(b), at});
        at = hi;
        tail_done = tail;
      }
    }
    // The shared ends: one-slot pieces.
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
    // What is left: [head slot] [at, hi) [tail slot].
    if (head && !head_done) out.created.push_back({run.slots.lo, run.slots.lo + 1});
    append_new_pieces({at, hi}, false, false, rules, out.created);
    if (tail && !tail_done) out.created.push_back({run.slots.hi - 1, run.slots.hi});
  }
  skip_ = {};
}

GrowthLayout plan_growth(std::span<const FreePiece> free_pieces, std::span<const TargetRun> runs,
                         const PieceRules& rules, bool recycle) {
  RecyclePlanner planner;
  if (recycle) planner.prepare(free_pieces, rules);
  GrowthLayout out;
  planner.plan({}, runs, rules, recycle, out);
  return out;
}

PieceRules piece_rules_for_footprint(const PieceRules& rules, std::size_t reserved_bytes,
                                     std::size_t slot_bytes) noexcept {
  PieceRules out = rules;
  if (rules.mode != PieceMode::adaptive) return out;
  if (reserved_bytes < rules.short_below_bytes) {
    out.max_piece_slots = 1;
    out.frontier_max_piece_slots = 0;
    return out;
  }
  if (rules.footprint_pieces != 0 && slot_bytes != 0) {
    const std::size_t longest = std::max<std::size_t>(reserved_bytes / rules.footprint_pieces / slot_bytes, 1);
    if (out.max_piece_slots == 0 || out.max_piece_slots > longest) out.max_piece_slots = longest;
    if (out.frontier_max_piece_slots > longest) out.frontier_max_piece_slots = longest;
  }
  return out;
}

GrowthLayout lengthen_frontier_pieces(const GrowthLayout& layout, std::span<const TargetRun> runs,
                                      bool at_region_end, const PieceRules& rules) {
  GrowthLayout out = layout;
  lengthen_frontier_pieces_in_place(out, runs, at_region_end, rules);
  return out;
}

void lengthen_frontier_pieces_in_place(GrowthLayout& layout, std::span<const TargetRun> runs, bool at_region_end,
                                       const PieceRules& rules) {
  const bool on = rules.mode == PieceMode::adaptive && rules.max_piece_slots != 0 &&
                  rules.frontier_max_piece_slots > rules.max_piece_slots;
  if (!on || !at_region_end || !layout.recycled.empty() || layout.created.empty()) return;
  PieceRules longer = rules;
  longer.max_piece_slots = rules.frontier_max_piece_slots;
  // The layout planned again without recycling (it moved nothing).
  RecyclePlanner planner;
  planner.plan({}, runs, longer, /*recycle=*/false, layout);
}

}  // namespace gpumem::alloc::policy
