#include "segment_map.h"

#include <algorithm>

namespace gpumem::forensics::detail {
namespace {

constexpr const char* kInactive = "inactive";
constexpr const char* kAllocated = "active_allocated";

}  // namespace

std::uint64_t round_block(std::uint64_t requested_bytes) noexcept {
  if (requested_bytes < 512) return 512;
  return (requested_bytes + 511) / 512 * 512;
}

SegmentMap::SegmentMap(int device, const std::vector<SnapshotSegment>& segments) : device_(device) {
  for (const auto& s : segments) {
    if (s.device == device) segs_.emplace(s.address, s);
  }
}

SnapshotSegment* SegmentMap::containing(std::uint64_t addr) {
  auto it = segs_.upper_bound(addr);
  if (it == segs_.begin()) return nullptr;
  --it;
  if (addr >= it->second.address + it->second.total_size_bytes) return nullptr;
  return &it->second;
}

void SegmentMap::merge_inactive(SnapshotSegment& seg) {
  std::vector<SnapshotBlock> out;
  out.reserve(seg.blocks.size());
  for (auto& b : seg.blocks) {
    if (b.size_bytes == 0) continue;
    if (!out.empty() && out.back().state == kInactive && b.state == kInactive) {
      out.back().size_bytes += b.size_bytes;
      continue;
    }
    out.push_back(std::move(b));
  }
  for (auto& b : out) {
    if (b.state == kInactive) {
      b.requested_bytes = 0;
      b.frames.clear();
      b.op.clear();
    }
  }
  seg.blocks = std::move(out);
}

std::uint64_t SegmentMap::carve(std::uint64_t addr, std::uint64_t requested_bytes, const std::string& op,
                                const std::vector<SnapshotFrame>& frames) {
  SnapshotSegment* seg = containing(addr);
  if (!seg) return ++skipped, 0;
  for (std::size_t i = 0; i < seg->blocks.size(); ++i) {
    auto& b = seg->blocks[i];
    if (addr < b.address || addr >= b.address + b.size_bytes) continue;
    if (b.state != kInactive) return ++skipped, 0;
    const std::uint64_t end = b.address + b.size_bytes;
    std::uint64_t size = std::min(round_block(requested_bytes), end - addr);
    // PyTorch's should_split: a remainder too small to split off stays in the block.
    const std::uint64_t remaining = end - addr - size;
    const bool small = seg->segment_type == "small";
    if (!seg->is_expandable && (small ? remaining < 512 : remaining <= (1u << 20))) size = end - addr;
    SnapshotBlock before{b.address, addr - b.address, 0, kInactive, {}, {}};
    SnapshotBlock mid{addr, size, requested_bytes, kAllocated, frames, op};
    SnapshotBlock after{addr + size, end - addr - size, 0, kInactive, {}, {}};
    seg->blocks.erase(seg->blocks.begin() + static_cast<std::ptrdiff_t>(i));
    std::vector<SnapshotBlock> parts;
    if (before.size_bytes) parts.push_back(std::move(before));
    parts.push_back(std::move(mid));
    if (after.size_bytes) parts.push_back(std::move(after));
    seg->blocks.insert(seg->blocks.begin() + static_cast<std::ptrdiff_t>(i), parts.begin(), parts.end());
    return size;
  }
  return ++skipped, 0;
}

bool SegmentMap::release(std::uint64_t addr) {
  SnapshotSegment* seg = containing(addr);
  if (!seg) return ++skipped, false;
  for (auto& b : seg->blocks) {
    if (b.address != addr) continue;
    if (b.state == kInactive) return ++skipped, false;
    b.state = kInactive;
    merge_inactive(*seg);
    return true;
  }
  return ++skipped, false;
}

bool SegmentMap::set_state(std::uint64_t addr, const char* from, const char* to) {
  SnapshotSegment* seg = containing(addr);
  if (!seg) return false;
  for (auto& b : seg->blocks) {
    if (b.address == addr && b.state == from) {
      b.state = to;
      return true;
    }
  }
  return false;
}

bool SegmentMap::add_range(std::uint64_t addr, std::uint64_t size_bytes, std::uint64_t stream, bool expandable,
                           bool small_pool) {
  if (size_bytes == 0 || containing(addr) || containing(addr + size_bytes - 1)) return ++skipped, false;
  if (expandable) {
    // Mapped next to an existing expandable range: extend it.
    auto next = segs_.find(addr + size_bytes);
    auto prev = segs_.lower_bound(addr);
    SnapshotSegment* left = nullptr;
    if (prev != segs_.begin()) {
      --prev;
      if (prev->second.is_expandable && prev->second.address + prev->second.total_size_bytes == addr) left = &prev->second;
    }
    if (left) {
      left->blocks.push_back(SnapshotBlock{addr, size_bytes, 0, kInactive, {}, {}});
      left->total_size_bytes += size_bytes;
      if (next != segs_.end() && next->second.is_expandable) {
        for (auto& b : next->second.blocks) left->blocks.push_back(std::move(b));
        left->total_size_bytes += next->second.total_size_bytes;
        segs_.erase(next);
      }
      merge_inactive(*left);
      return true;
    }
    if (next != segs_.end() && next->second.is_expandable) {
      SnapshotSegment seg = std::move(next->second);
      segs_.erase(next);
      seg.blocks.insert(seg.blocks.begin(), SnapshotBlock{addr, size_bytes, 0, kInactive, {}, {}});
      seg.address = addr;
      seg.total_size_bytes += size_bytes;
      merge_inactive(seg);
      segs_.emplace(addr, std::move(seg));
      return true;
    }
  }
  SnapshotSegment seg;
  seg.device = device_;
  seg.address = addr;
  seg.total_size_bytes = size_bytes;
  seg.stream = stream;
  seg.is_expandable = expandable;
  seg.segment_type = small_pool ? "small" : "large";
  seg.blocks.push_back(SnapshotBlock{addr, size_bytes, 0, kInactive, {}, {}});
  segs_.emplace(addr, std::move(seg));
  return true;
}

bool SegmentMap::remove_range(std::uint64_t addr, std::uint64_t size_bytes) {
  SnapshotSegment* seg = containing(addr);
  if (!seg) return ++skipped, false;
  const std::uint64_t end = addr + size_bytes;
  if (end > seg->address + seg->total_size_bytes) return ++skipped, false;
  for (const auto& b : seg->blocks) {
    const bool overlaps = b.address < end && addr < b.address + b.size_bytes;
    if (overlaps && b.state != kInactive) return ++skipped, false;
  }
  // Split the segment into what lies before and after the range.
  SnapshotSegment left = *seg, right = *seg;
  left.blocks.clear();
  right.blocks.clear();
  for (const auto& b : seg->blocks) {
    const std::uint64_t bend = b.address + b.size_bytes;
    if (b.address < addr) {
      SnapshotBlock part = b;
      part.size_bytes = std::min(bend, addr) - b.address;
      left.blocks.push_back(std::move(part));
    }
    if (bend > end) {
      SnapshotBlock part = b;
      part.address = std::max(b.address, end);
      part.size_bytes = bend - part.address;
      right.blocks.push_back(std::move(part));
    }
  }
  segs_.erase(seg->address);
  if (!left.blocks.empty()) {
    recompute_sizes(left);
    segs_.emplace(left.address, std::move(left));
  }
  if (!right.blocks.empty()) {
    right.address = right.blocks.front().address;
    recompute_sizes(right);
    segs_.emplace(right.address, std::move(right));
  }
  return true;
}

std::vector<SnapshotSegment> SegmentMap::segments() const {
  std::vector<SnapshotSegment> out;
  out.reserve(segs_.size());
  for (const auto& [addr, seg] : segs_) {
    out.push_back(seg);
    recompute_sizes(out.back());
  }
  return out;
}

}  // namespace gpumem::forensics::detail
