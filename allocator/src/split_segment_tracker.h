// SplitSegmentTracker: the block layout of classic segments, rebuilt from the event stream, so
// StatsObserver can keep PyTorch's inactive_split / inactive_split_bytes stats.
//
// Model: a classic segment (segment_alloc .. segment_free) holds active blocks (alloc ..
// free_completed) at known addresses; everything else in it is free, and because the engine
// coalesces adjacent free blocks, each maximal gap between active blocks is exactly one free block.
// PyTorch counts a free block as "inactive split" when it is not the whole segment, so:
//   contribution(segment) = active blocks present ? (number of gaps, size - active bytes) : (0, 0)
// and each update returns the change of its segment's contribution, which the caller adds with
// Stat::increase / Stat::decrease (PyTorch applies the same net changes per operation, so the
// allocated/freed accumulators match too).
//
// Invariants (per segment): active blocks lie inside the segment and do not overlap;
// active_bytes = sum of their sizes; gaps = number of maximal free runs between/around them
// (0 when there is no active block).
//
// Thread-safety: none; StatsObserver calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "gpumem/alloc/events.h"

namespace gpumem::alloc {

class SplitSegmentTracker {
 public:
  // What to add to inactive_split (blocks) and inactive_split_bytes (bytes) of pool.
  struct Change {
    std::int64_t blocks = 0;
    std::int64_t bytes = 0;
    PoolKind pool = PoolKind::large;
  };

  enum class Result : std::uint8_t {
    ok,            // change is set
    untracked,     // the address is in no known classic segment (expandable memory): no change
    inconsistent,  // the event contradicts the layout (overlap, unknown block, size mismatch)
  };

  Result add_segment(std::uintptr_t base, std::size_t size_bytes, PoolKind pool);
  // A segment with active blocks left is removed anyway (and reported inconsistent); its
  // contribution is taken back through change.
  Result remove_segment(std::uintptr_t base, Change& change);
  Result activate(std::uintptr_t addr, std::size_t size_bytes, Change& change);
  Result deactivate(std::uintptr_t addr, std::size_t size_bytes, Change& change);

  bool empty() const noexcept { return segments_.empty(); }
  std::size_t segment_count() const noexcept { return segments_.size(); }

  // Aborts with a description if an invariant above is broken (tests).
  void check_invariants() const;

 private:
  struct Segment {
    std::uintptr_t base = 0;
    std::size_t size_bytes = 0;
    PoolKind pool = PoolKind::large;
    std::map<std::uintptr_t, std::size_t> active;  // addr -> size
    std::size_t active_bytes = 0;
    std::int64_t gaps = 0;
  };

  static Change contribution(const Segment& s) noexcept;
  Segment* find(std::uintptr_t addr) noexcept;

  std::map<std::uintptr_t, Segment> segments_;  // by base
};

}  // namespace gpumem::alloc
