#include "gpumem/view/pinned_segments.h"

#include <algorithm>

namespace gpumem::view {

std::vector<PinnedSegment> pinned_segments(const MemoryState& state) {
  std::vector<PinnedSegment> out;
  for (const auto& [addr, seg] : state.segments) {
    PinnedSegment p;
    p.addr = addr;
    p.segment = seg;
    const std::uint64_t end = addr + seg.size_bytes;
    for (auto it = state.blocks.lower_bound(addr); it != state.blocks.end() && it->first < end; ++it) {
      p.blocks.emplace_back(it->first, &it->second);
      p.live_bytes += std::min(it->second.size_bytes, end - it->first);
    }
    if (p.blocks.empty()) continue;
    p.held_free_bytes = seg.size_bytes > p.live_bytes ? seg.size_bytes - p.live_bytes : 0;
    if (p.held_free_bytes == 0) continue;  // filled: nothing held hostage
    out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(), [](const PinnedSegment& a, const PinnedSegment& b) {
    return a.held_free_bytes > b.held_free_bytes;
  });
  return out;
}

bool segment_has_live_block(const MemoryState& state, std::uint64_t segment_addr) {
  const auto seg = state.segments.find(segment_addr);
  if (seg == state.segments.end()) return false;
  const auto it = state.blocks.lower_bound(segment_addr);
  return it != state.blocks.end() && it->first < segment_addr + seg->second.size_bytes;
}

PinCounts pin_counts(const MemoryState& state) {
  PinCounts c;
  c.pinned = pinned_segments(state).size();
  for (const auto& [addr, seg] : state.segments) {
    if (!segment_has_live_block(state, addr)) ++c.releasable;
  }
  c.full = state.segments.size() - c.pinned - c.releasable;
  return c;
}

}  // namespace gpumem::view
