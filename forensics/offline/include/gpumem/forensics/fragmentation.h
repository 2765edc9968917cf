// Fragmentation of one device's memory at one moment, computed from its segments (a Snapshot's,
// or state_at_moment's): where reserved-but-unallocated memory sits, how broken up the free memory
// is, and which segments are held only by a few small live blocks.
//
// Terms (bytes; vocabulary.h and docs/forensics.md define them once for every command):
//   reserved      sum of segment sizes (memory held from the device)
//   allocated     sizes of active_allocated blocks (rounded, as the allocator hands them out)
//   requested     what the program asked for in those blocks
//   pending_free  blocks freed by the program but waiting for other streams
//   free          inactive blocks = reserved - allocated - pending_free
// and the identities (checked in the tests):
//   reserved - requested = rounding + pending_free + inactive_split + cached_free
//   rounding = allocated - requested; free = inactive_split + cached_free, split by the release
//   unit: a classic segment's free bytes are inactive split when the segment also holds active
//   (allocated or pending) blocks, cached free when it holds none; an expandable segment's free
//   bytes are inactive split in the 2 MiB pages (aligned from the segment's start) that also
//   hold active bytes, cached free in wholly free pages (those could be unmapped as they are).
// external_fragmentation = 1 - largest_free_extent / free (0 when nothing is free).
//
// A segment is "pinned" when at most max_pinned_blocks active blocks hold at most 1/8 of it and
// it has at least 2 MiB free: without those blocks it could be released. The pinning blocks come
// with their op, call site and age (from the trace's last alloc of their address, when known).
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

struct PinningBlock {
  std::uint64_t address = 0;
  std::uint64_t size_bytes = 0;
  std::uint64_t requested_bytes = 0;
  std::string op;    // "" if unknown
  std::string site;  // call site, "" if unknown
  std::optional<std::int64_t> age_us;  // moment minus its allocation time
};

struct PinnedSegment {
  std::uint64_t address = 0;
  std::uint64_t total_size_bytes = 0;
  std::uint64_t active_bytes = 0;
  std::uint64_t free_bytes = 0;
  bool expandable = false;
  std::vector<PinningBlock> blocks;
};

struct Fragmentation {
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t requested_bytes = 0;
  std::uint64_t pending_free_bytes = 0;
  std::uint64_t free_bytes = 0;
  std::uint64_t rounding_bytes = 0;
  std::uint64_t inactive_split_bytes = 0;
  std::uint64_t cached_free_bytes = 0;
  std::uint64_t largest_free_extent_bytes = 0;
  double external_fragmentation = 0.0;
  std::size_t segments = 0;
  std::size_t live_blocks = 0;
  std::vector<PinnedSegment> pinned;  // most free bytes held first

  std::uint64_t reserved_unallocated_bytes() const noexcept { return reserved_bytes - allocated_bytes; }
};

struct FragmentationOptions {
  std::size_t max_pinned_blocks = 4;
  std::size_t max_pinned_segments = 10;
  std::int64_t moment_us = 0;                                // for ages; 0 = no ages
  const std::vector<SnapshotTraceEntry>* trace = nullptr;    // for ops, sites and ages of blocks
  std::size_t trace_entries = SIZE_MAX;                      // use trace[0, trace_entries)
};

Fragmentation analyze_fragmentation(const std::vector<SnapshotSegment>& segments,
                                    const FragmentationOptions& options = {});

// The largest inactive block usable for a request: on `stream`, in the pool the request goes to
// (small for <= 1 MiB, large otherwise), in the default pool (not a private pool: segment_pool_id).
// Expandable segments of the pool count as one run each.
std::uint64_t largest_usable_extent(const std::vector<SnapshotSegment>& segments, std::uint64_t stream,
                                    std::uint64_t rounded_bytes);

}  // namespace gpumem::forensics
