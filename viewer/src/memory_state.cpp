#include "gpumem/view/memory_state.h"

#include <algorithm>

namespace gpumem::view {

using forensics::TraceAction;

void MemoryState::add_segment(std::uint64_t addr, std::uint64_t size_bytes, SegmentInfo info) {
  if (size_bytes == 0) return;
  remove_range(addr, size_bytes);  // a well-formed trace never overlaps; keep the invariant anyway
  info.size_bytes = size_bytes;
  reserved_bytes += size_bytes;
  if (info.expandable) {
    // Grow the ever-mapped address ranges, merging neighbours that touch or overlap.
    std::uint64_t lo = addr, hi = addr + size_bytes;
    auto v = expandable_va.upper_bound(lo);
    if (v != expandable_va.begin() && std::prev(v)->second >= lo) --v;
    while (v != expandable_va.end() && v->first <= hi) {
      lo = std::min(lo, v->first);
      hi = std::max(hi, v->second);
      v = expandable_va.erase(v);
    }
    expandable_va.emplace(lo, hi);
    // Merge with an adjacent expandable range on either side.
    auto next = segments.find(addr + size_bytes);
    if (next != segments.end() && next->second.expandable) {
      info.size_bytes += next->second.size_bytes;
      segments.erase(next);
    }
    auto it = segments.lower_bound(addr);
    if (it != segments.begin()) {
      auto prev = std::prev(it);
      if (prev->second.expandable && prev->first + prev->second.size_bytes == addr) {
        prev->second.size_bytes += info.size_bytes;
        return;
      }
    }
  }
  segments.emplace(addr, info);
}

void MemoryState::remove_range(std::uint64_t addr, std::uint64_t size_bytes) {
  const std::uint64_t end = addr + size_bytes;
  auto it = segments.lower_bound(addr);
  if (it != segments.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size_bytes > addr) it = prev;
  }
  while (it != segments.end() && it->first < end) {
    const std::uint64_t s = it->first;
    const SegmentInfo info = it->second;
    const std::uint64_t e = s + info.size_bytes;
    it = segments.erase(it);
    const std::uint64_t cut_lo = std::max(s, addr);
    const std::uint64_t cut_hi = std::min(e, end);
    reserved_bytes -= cut_hi - cut_lo;
    if (s < cut_lo) {
      SegmentInfo left = info;
      left.size_bytes = cut_lo - s;
      segments.emplace(s, left);
    }
    if (cut_hi < e) {
      SegmentInfo right = info;
      right.size_bytes = e - cut_hi;
      it = segments.emplace(cut_hi, right).first;
      ++it;
    }
  }
}

void MemoryState::add_block(std::uint64_t addr, BlockInfo info) {
  auto [it, inserted] = blocks.try_emplace(addr, info);
  if (!inserted) {
    allocated_bytes -= it->second.size_bytes;
    it->second = info;
  }
  allocated_bytes += info.size_bytes;
}

void MemoryState::remove_block(std::uint64_t addr) {
  auto it = blocks.find(addr);
  if (it == blocks.end()) return;
  allocated_bytes -= it->second.size_bytes;
  blocks.erase(it);
}

void MemoryState::apply(const forensics::TraceEntry& e, std::uint64_t entry, std::uint64_t block_bytes, std::uint32_t op) {
  switch (e.action) {
    case TraceAction::alloc:
      add_block(e.addr, BlockInfo{block_bytes ? block_bytes : block_bytes_for(e.size_bytes), e.size_bytes, e.site, e.time_us, entry, op});
      break;
    case TraceAction::free_completed:
      remove_block(e.addr);
      break;
    case TraceAction::segment_alloc:
      add_segment(e.addr, e.size_bytes, SegmentInfo{e.size_bytes, e.stream, false});
      break;
    case TraceAction::segment_map:
      add_segment(e.addr, e.size_bytes, SegmentInfo{e.size_bytes, e.stream, true});
      break;
    case TraceAction::segment_free:
    case TraceAction::segment_unmap:
      remove_range(e.addr, e.size_bytes);
      break;
    case TraceAction::free_requested:
    case TraceAction::snapshot:
    case TraceAction::oom:
      break;
  }
}

void MemoryState::undo(const forensics::TraceEntry& e) {
  switch (e.action) {
    case TraceAction::alloc:
      remove_block(e.addr);
      break;
    case TraceAction::free_completed:
      add_block(e.addr, BlockInfo{block_bytes_for(e.size_bytes), e.size_bytes, e.site, 0, 0});
      break;
    case TraceAction::segment_alloc:
    case TraceAction::segment_map:
      remove_range(e.addr, e.size_bytes);
      break;
    case TraceAction::segment_free:
      add_segment(e.addr, e.size_bytes, SegmentInfo{e.size_bytes, e.stream, false});
      break;
    case TraceAction::segment_unmap:
      add_segment(e.addr, e.size_bytes, SegmentInfo{e.size_bytes, e.stream, true});
      break;
    case TraceAction::free_requested:
    case TraceAction::snapshot:
    case TraceAction::oom:
      break;
  }
}

std::map<std::uint64_t, SegmentInfo>::const_iterator MemoryState::segment_of(std::uint64_t addr) const {
  auto it = segments.upper_bound(addr);
  if (it == segments.begin()) return segments.end();
  --it;
  return addr < it->first + it->second.size_bytes ? it : segments.end();
}

void MemoryState::reset_expandable_va() {
  expandable_va.clear();
  for (const auto& [addr, seg] : segments) {
    if (!seg.expandable) continue;
    if (!expandable_va.empty() && std::prev(expandable_va.end())->second == addr) {
      std::prev(expandable_va.end())->second = addr + seg.size_bytes;
    } else {
      expandable_va.emplace(addr, addr + seg.size_bytes);
    }
  }
}

bool MemoryState::check_invariants() const {
  std::uint64_t reserved = 0;
  std::uint64_t prev_end = 0;
  for (const auto& [addr, seg] : segments) {
    if (seg.size_bytes == 0 || addr < prev_end) return false;
    if (seg.expandable) {
      auto v = expandable_va.upper_bound(addr);
      if (v == expandable_va.begin() || std::prev(v)->second < addr + seg.size_bytes) return false;
    }
    prev_end = addr + seg.size_bytes;
    reserved += seg.size_bytes;
  }
  std::uint64_t allocated = 0;
  for (const auto& [addr, b] : blocks) allocated += b.size_bytes;
  return reserved == reserved_bytes && allocated == allocated_bytes;
}

std::vector<Extent> extents_of(const MemoryState& state, std::uint64_t seg_addr, const SegmentInfo& seg) {
  std::vector<Extent> out;
  const std::uint64_t end = seg_addr + seg.size_bytes;
  std::uint64_t at = seg_addr;
  for (auto it = state.blocks.lower_bound(seg_addr); it != state.blocks.end() && it->first < end; ++it) {
    const std::uint64_t b_end = std::min(end, it->first + it->second.size_bytes);
    if (b_end <= at) continue;  // overlaps the previous block (rounding guess too large)
    const std::uint64_t b_start = std::max(at, it->first);
    if (b_start > at) out.push_back(Extent{at, b_start - at, false, nullptr});
    out.push_back(Extent{b_start, b_end - b_start, true, &it->second});
    at = b_end;
  }
  if (at < end) out.push_back(Extent{at, end - at, false, nullptr});
  return out;
}

std::uint64_t largest_free_extent(const MemoryState& state) {
  std::uint64_t best = 0;
  for (const auto& [addr, seg] : state.segments) {
    for (const auto& x : extents_of(state, addr, seg)) {
      if (!x.live) best = std::max(best, x.size_bytes);
    }
  }
  return best;
}

}  // namespace gpumem::view
