#include "growth_policy.h"

#include <algorithm>
#include <queue>
#include <tuple>

#include "cap_policy.h"
#include "size_policy.h"

namespace gpumem::alloc::policy {

std::size_t region_va_bytes(std::size_t va_reserve_bytes, std::size_t provider_total_bytes,
                            std::size_t piece_bytes) noexcept {
  std::size_t va = va_reserve_bytes;
  if (va == 0) va = provider_total_bytes ? provider_total_bytes + provider_total_bytes / 8 : kUnknownTotalRegionVaBytes;
  return round_up(std::max(va, piece_bytes), piece_bytes);
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

PlacementAddresses placement_addresses(std::uintptr_t hole_lo, std::uintptr_t hole_hi, std::size_t size_bytes) noexcept {
  PlacementAddresses out;
  if (hole_hi - hole_lo < size_bytes) return out;
  out.addr[out.count++] = hole_lo;
  const std::uintptr_t high = (hole_hi - size_bytes) & ~(kMinBlockBytes - 1);
  if (high > hole_lo) out.addr[out.count++] = high;
  return out;
}

std::optional<std::size_t> choose_placement(std::span<const PlacementCandidate> candidates) noexcept {
  std::optional<std::size_t> best;
  auto key = [](const PlacementCandidate& c) { return std::tie(c.pieces_needed, c.hole_bytes, c.addr); };
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (!best || key(candidates[i]) < key(candidates[*best])) best = i;
  return best;
}

std::optional<std::uintptr_t> highest_recyclable_slot(const FreeExtent& e, std::size_t piece_bytes,
                                                      std::uintptr_t exclude_lo, std::uintptr_t exclude_hi) noexcept {
  const SlotSpan span = whole_slots(e.addr, e.size_bytes, e.region_base, piece_bytes);
  for (std::uintptr_t hi = span.hi; hi >= span.lo + piece_bytes; hi -= piece_bytes) {
    const std::uintptr_t s = hi - piece_bytes;
    if (s + piece_bytes <= exclude_lo || s >= exclude_hi) return s;
  }
  return std::nullopt;
}

std::vector<RecycleChoice> choose_recycled_pieces(std::span<const FreeExtent> extents, std::size_t piece_bytes,
                                                  std::uintptr_t exclude_lo, std::uintptr_t exclude_hi,
                                                  std::size_t max_count) {
  std::vector<RecycleChoice> out;
  if (max_count == 0 || piece_bytes == 0) return out;
  // Extents holding a recyclable piece, smallest first: (size, stream, addr) is unique per extent.
  struct Entry {
    std::size_t size_bytes;
    StreamId stream;
    std::uintptr_t addr;
    std::size_t extent;
    std::uintptr_t slot;
    bool operator>(const Entry& o) const noexcept {
      return std::tie(size_bytes, stream, addr) > std::tie(o.size_bytes, o.stream, o.addr);
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (std::size_t i = 0; i < extents.size(); ++i) {
    const FreeExtent& e = extents[i];
    if (auto s = highest_recyclable_slot(e, piece_bytes, exclude_lo, exclude_hi))
      heap.push({e.size_bytes, e.stream, e.addr, i, *s});
  }
  while (!heap.empty() && out.size() < max_count) {
    const Entry top = heap.top();
    heap.pop();
    out.push_back({top.extent, top.slot});
    // What lies below the piece is a smaller extent; above it nothing is recyclable (the piece was
    // the highest that is).
    if (top.slot > top.addr) {
      const FreeExtent below{top.addr, top.slot - top.addr, top.stream, extents[top.extent].region_base};
      if (auto s = highest_recyclable_slot(below, piece_bytes, exclude_lo, exclude_hi))
        heap.push({below.size_bytes, below.stream, below.addr, top.extent, *s});
    }
  }
  return out;
}

GrowthPlan plan_growth(const GrowthInputs& in) noexcept {
  GrowthPlan plan;
  plan.recycle = in.recycle_enabled ? std::min(in.pieces_needed, in.pieces_recyclable) : 0;
  plan.create = in.pieces_needed - plan.recycle;
  if (plan.create > 0) plan.over_cap = exceeds_cap(in.reserved_bytes, plan.create * in.piece_bytes, in.cap_bytes);
  return plan;
}

}  // namespace gpumem::alloc::policy
