// SnapshotDiff: what changed between two snapshots (or traces) of a program: live bytes per op
// and per call site, segments added and removed, and the change in fragmentation. Each side is
// described as build_report describes it (at its OOM when it records one, else at its end).
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/forensics/fragmentation.h"
#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

struct GroupDelta {
  std::string name;
  std::uint64_t a_bytes = 0;
  std::uint64_t b_bytes = 0;
  std::int64_t delta_bytes() const noexcept {
    return static_cast<std::int64_t>(b_bytes) - static_cast<std::int64_t>(a_bytes);
  }
};

struct SegmentRef {
  std::uint64_t address = 0;
  std::uint64_t total_size_bytes = 0;
  std::string segment_type;
};

struct SnapshotDiff {
  std::string a_source, b_source;
  std::vector<GroupDelta> ops;    // changed ones, largest |delta| first
  std::vector<GroupDelta> sites;
  std::vector<SegmentRef> segments_added;    // in B, not in A (same address and size)
  std::vector<SegmentRef> segments_removed;  // in A, not in B
  Fragmentation a, b;
};

SnapshotDiff diff_snapshots(const Snapshot& a, const Snapshot& b, std::size_t top = 20);

std::string render_diff_text(const SnapshotDiff& diff);
std::string render_diff_json(const SnapshotDiff& diff);

}  // namespace gpumem::forensics
