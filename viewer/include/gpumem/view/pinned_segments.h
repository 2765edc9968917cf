// PinnedSegment: a segment whose free memory cannot be released because live blocks sit in it,
// with those blocks, ordered by the free bytes they hold hostage (the segment's size minus its live
// bytes), largest first. Segments with no live block are releasable (empty_cache frees them) and
// segments that live blocks fill hold nothing hostage: neither is listed (PinCounts counts them).
//
// Thread-safety: pure functions; the block pointers point into the MemoryState passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpumem/view/memory_state.h"

namespace gpumem::view {

struct PinnedSegment {
  std::uint64_t addr = 0;
  SegmentInfo segment;
  std::uint64_t live_bytes = 0;
  std::uint64_t held_free_bytes = 0;  // size - live bytes
  std::vector<std::pair<std::uint64_t, const BlockInfo*>> blocks;  // address, block
};

std::vector<PinnedSegment> pinned_segments(const MemoryState& state);

// How the segments of state divide: pinned (listed above), filled by live blocks, releasable.
struct PinCounts {
  std::size_t pinned = 0;
  std::size_t full = 0;
  std::size_t releasable = 0;
};
PinCounts pin_counts(const MemoryState& state);

// Whether a live block starts inside the segment at segment_addr.
bool segment_has_live_block(const MemoryState& state, std::uint64_t segment_addr);

}  // namespace gpumem::view
