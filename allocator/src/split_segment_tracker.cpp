#include "split_segment_tracker.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace gpumem::alloc {

SplitSegmentTracker::Change SplitSegmentTracker::contribution(const Segment& s) noexcept {
  Change c;
  c.pool = s.pool;
  if (!s.active.empty()) {
    c.blocks = s.gaps;
    c.bytes = static_cast<std::int64_t>(s.size_bytes - s.active_bytes);
  }
  return c;
}

SplitSegmentTracker::Segment* SplitSegmentTracker::find(std::uintptr_t addr) noexcept {
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return nullptr;
  --it;
  Segment& s = it->second;
  return addr - s.base < s.size_bytes ? &s : nullptr;
}

SplitSegmentTracker::Result SplitSegmentTracker::add_segment(std::uintptr_t base,
                                                             std::size_t size_bytes, PoolKind pool) {
  if (size_bytes == 0) return Result::inconsistent;
  // Refuse a segment overlapping a known one (the older one stays).
  if (find(base) || find(base + size_bytes - 1)) return Result::inconsistent;
  auto next = segments_.lower_bound(base);
  if (next != segments_.end() && next->first < base + size_bytes) return Result::inconsistent;
  Segment s;
  s.base = base;
  s.size_bytes = size_bytes;
  s.pool = pool;
  segments_.emplace(base, std::move(s));
  return Result::ok;
}

SplitSegmentTracker::Result SplitSegmentTracker::remove_segment(std::uintptr_t base,
                                                                Change& change) {
  auto it = segments_.find(base);
  if (it == segments_.end()) return Result::untracked;
  Change before = contribution(it->second);
  bool had_active = !it->second.active.empty();
  segments_.erase(it);
  change = before;
  change.blocks = -before.blocks;
  change.bytes = -before.bytes;
  return had_active ? Result::inconsistent : Result::ok;
}

SplitSegmentTracker::Result SplitSegmentTracker::activate(std::uintptr_t addr,
                                                          std::size_t size_bytes, Change& change) {
  Segment* s = find(addr);
  if (!s) return Result::untracked;
  const std::uintptr_t end = addr + size_bytes;
  if (size_bytes == 0 || end > s->base + s->size_bytes) return Result::inconsistent;
  auto next = s->active.lower_bound(addr);
  if (next != s->active.end() && next->first < end) return Result::inconsistent;
  std::uintptr_t left_bound = s->base;
  if (next != s->active.begin()) {
    auto prev = std::prev(next);
    left_bound = prev->first + prev->second;
    if (left_bound > addr) return Result::inconsistent;
  }
  const std::uintptr_t right_bound = next != s->active.end() ? next->first : s->base + s->size_bytes;
  const std::int64_t pieces = (addr > left_bound ? 1 : 0) + (end < right_bound ? 1 : 0);

  Change before = contribution(*s);
  s->gaps = s->active.empty() ? pieces : s->gaps + pieces - 1;  // the gap it lands in splits
  s->active.emplace_hint(next, addr, size_bytes);
  s->active_bytes += size_bytes;
  Change after = contribution(*s);
  change = {after.blocks - before.blocks, after.bytes - before.bytes, s->pool};
  return Result::ok;
}

SplitSegmentTracker::Result SplitSegmentTracker::deactivate(std::uintptr_t addr,
                                                            std::size_t size_bytes, Change& change) {
  Segment* s = find(addr);
  if (!s) return Result::untracked;
  auto it = s->active.find(addr);
  if (it == s->active.end() || it->second != size_bytes) return Result::inconsistent;
  std::uintptr_t left_bound = s->base;
  if (it != s->active.begin()) {
    auto prev = std::prev(it);
    left_bound = prev->first + prev->second;
  }
  auto next = std::next(it);
  const std::uintptr_t right_bound = next != s->active.end() ? next->first : s->base + s->size_bytes;
  const std::int64_t neighbours = (addr > left_bound ? 1 : 0) +
                                  (addr + size_bytes < right_bound ? 1 : 0);

  Change before = contribution(*s);
  s->active.erase(it);
  s->active_bytes -= size_bytes;
  s->gaps = s->active.empty() ? 0 : s->gaps + 1 - neighbours;  // it and its free neighbours merge
  Change after = contribution(*s);
  change = {after.blocks - before.blocks, after.bytes - before.bytes, s->pool};
  return Result::ok;
}

void SplitSegmentTracker::check_invariants() const {
  auto die = [](const char* what, std::uintptr_t base) {
    std::fprintf(stderr, "SplitSegmentTracker invariant broken in segment %#zx: %s\n",
                 static_cast<std::size_t>(base), what);
    std::abort();
  };
  std::uintptr_t prev_end = 0;
  for (const auto& [base, s] : segments_) {
    if (base != s.base || base < prev_end) die("segments overlap or are misfiled", base);
    prev_end = base + s.size_bytes;
    std::uintptr_t cursor = s.base;
    std::size_t bytes = 0;
    std::int64_t gaps = 0;
    for (const auto& [addr, size] : s.active) {
      if (addr < cursor) die("active blocks overlap", base);
      if (addr > cursor) ++gaps;
      cursor = addr + size;
      bytes += size;
    }
    if (cursor > s.base + s.size_bytes) die("an active block ends past the segment", base);
    if (!s.active.empty() && cursor < s.base + s.size_bytes) ++gaps;
    if (bytes != s.active_bytes) die("active_bytes is not the sum of the active blocks", base);
    if (gaps != s.gaps) die("gaps does not match the layout", base);
  }
}

}  // namespace gpumem::alloc
