// SegmentMap: one device's segments, editable by address, used to move a snapshot's state along
// its trace: forward (rebuilding segments from a trace that has none) or backward (undoing what
// the trace recorded after a moment). Internal to gpumem::forensics.
//
// Invariants (checked by check()): segments do not overlap; each segment's blocks tile it in
// address order; no two adjacent blocks are both inactive.
// Block sizes of allocations the trace records only by requested size are rounded up to 512
// bytes (PyTorch's and gpumem's minimum rounding), clamped to the free block they are carved
// from, and take the whole block where PyTorch would not split it (remainder under 512 bytes in
// small segments, at most 1 MiB in large ones); operations the state cannot take (a free of an address that holds no block, ...) are
// counted in `skipped` and otherwise ignored.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics::detail {

class SegmentMap {
 public:
  SegmentMap(int device, const std::vector<SnapshotSegment>& segments);

  // Makes [addr, addr + round(requested)) an active_allocated block (carved from an inactive one).
  // Returns the block's size (the rounded request plus what the split rule leaves in it), 0 when
  // the state cannot take it (counted in `skipped`).
  std::uint64_t carve(std::uint64_t addr, std::uint64_t requested_bytes, const std::string& op,
             const std::vector<SnapshotFrame>& frames);
  // The block at addr becomes inactive (merged with inactive neighbours).
  bool release(std::uint64_t addr);
  // The block at addr changes state (active_allocated <-> active_pending_free).
  bool set_state(std::uint64_t addr, const char* from, const char* to);
  // A new range of free memory (a segment, or memory mapped next to an expandable one).
  bool add_range(std::uint64_t addr, std::uint64_t size_bytes, std::uint64_t stream, bool expandable,
                 bool small_pool);
  // Removes a wholly inactive range (a segment freed, or memory unmapped).
  bool remove_range(std::uint64_t addr, std::uint64_t size_bytes);

  // Segments again, sorted by address, with allocated/active/requested sizes recomputed.
  std::vector<SnapshotSegment> segments() const;
  std::size_t skipped = 0;

 private:
  SnapshotSegment* containing(std::uint64_t addr);
  static void merge_inactive(SnapshotSegment& seg);
  int device_;
  std::map<std::uint64_t, SnapshotSegment> segs_;
};

std::uint64_t round_block(std::uint64_t requested_bytes) noexcept;

}  // namespace gpumem::forensics::detail
