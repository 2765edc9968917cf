// MemoryState: the allocator's memory at one point of a trace, rebuilt from the trace entries:
// the reserved address ranges (segments) and the live blocks in them.
//
// Segments come from segment_alloc / segment_free (classic segments) and segment_map /
// segment_unmap (expandable segments: adjacent mapped ranges merge into one segment, an unmap
// carves its range out). Blocks come from alloc / free_completed, keyed by address; a block's
// extent is its requested size rounded up to 512 bytes, as PyTorch rounds (the trace records the
// request, not the block). free_requested changes nothing: the block stays live until its frees
// complete on every stream. Frees of addresses the state does not hold (a trace whose recorder
// ring wrapped) are ignored.
//
// Expandable segments live in a virtual address reservation that the trace does not record;
// `expandable_va` approximates it by the ranges ever mapped so far (merged), so a range that was
// mapped and then unmapped shows as reserved-but-unmapped address space.
//
// Invariants: segments do not overlap; every expandable segment lies inside expandable_va;
// allocated_bytes is the sum of live block extents and reserved_bytes the sum of segment sizes
// (check_invariants verifies them).
// Thread-safety: a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "gpumem/forensics/trace.h"

namespace gpumem::view {

struct SegmentInfo {
  std::uint64_t size_bytes = 0;
  std::uint64_t stream = 0;
  bool expandable = false;  // built from segment_map entries
};

struct BlockInfo {
  std::uint64_t size_bytes = 0;       // extent: requested rounded up to 512
  std::uint64_t requested_bytes = 0;  // what the program asked for
  std::uint32_t site = 0;             // index into the trace's sites
  std::int64_t t_us = 0;              // when it was allocated
  std::uint64_t entry = 0;            // the trace entry that allocated it
  std::uint32_t op = 0;               // index into the model's op names (0: unknown)
};

// PyTorch's block rounding: at least 512 bytes, a multiple of 512.
constexpr std::uint64_t block_bytes_for(std::uint64_t requested) noexcept {
  return requested < 512 ? 512 : (requested + 511) / 512 * 512;
}

struct MemoryState {
  std::map<std::uint64_t, SegmentInfo> segments;  // by start address
  std::map<std::uint64_t, BlockInfo> blocks;      // live blocks by address
  std::map<std::uint64_t, std::uint64_t> expandable_va;  // start -> end of ranges ever mapped
  std::uint64_t allocated_bytes = 0;
  std::uint64_t reserved_bytes = 0;

  // Applies one entry (its index in the trace is `entry`). block_bytes: the block's real size
  // when known (a snapshot says so for blocks still live at its end); 0 = round the request.
  // op: the op the allocation ran under (index into the model's op names, 0 = unknown).
  void apply(const forensics::TraceEntry& e, std::uint64_t entry, std::uint64_t block_bytes = 0, std::uint32_t op = 0);
  // Undoes one entry: the state before it, given the state after it. Used to find what existed
  // before a truncated trace began, from a snapshot's final segments.
  void undo(const forensics::TraceEntry& e);

  void add_segment(std::uint64_t addr, std::uint64_t size_bytes, SegmentInfo info);
  void remove_range(std::uint64_t addr, std::uint64_t size_bytes);
  void add_block(std::uint64_t addr, BlockInfo info);
  void remove_block(std::uint64_t addr);

  // The segment holding addr, or segments.end().
  std::map<std::uint64_t, SegmentInfo>::const_iterator segment_of(std::uint64_t addr) const;

  // Resets expandable_va to the expandable segments mapped now.
  void reset_expandable_va();

  bool check_invariants() const;
};

// One run of address space inside a segment: a live block or a free gap.
struct Extent {
  std::uint64_t addr = 0;
  std::uint64_t size_bytes = 0;
  bool live = false;
  const BlockInfo* block = nullptr;  // live extents only (points into the MemoryState)
};

// The extents of one segment in address order (free gaps between and around live blocks).
std::vector<Extent> extents_of(const MemoryState& state, std::uint64_t seg_addr, const SegmentInfo& seg);

// The largest free extent in any segment (what a request can be served from without growing).
std::uint64_t largest_free_extent(const MemoryState& state);

}  // namespace gpumem::view
