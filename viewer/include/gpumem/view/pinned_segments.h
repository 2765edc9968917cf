// PinnedSegment: a segment that cannot be released because live blocks sit in it, with those
// blocks, ordered by the free bytes they hold hostage (the segment's size minus its live bytes),
// largest first. Segments with no live block are releasable (empty_cache frees them) and are not
// listed.
//
// Thread-safety: pure functions; the block pointers point into the MemoryState passed in.
#pragma once

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

}  // namespace gpumem::view
