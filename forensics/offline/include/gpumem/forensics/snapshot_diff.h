// SnapshotDiff: what changed between two snapshots (or traces) of a program, or two moments of
// one: live bytes per op and per call site, segments added and removed, and the change in the
// memory terms (vocabulary.h). Each side is described as build_report describes it, at the moment
// its options name (by default its OOM when it records one, else its peak of reserved bytes).
//
// Every list holds at most `top` rows (the largest changes); the counts before that limit are kept
// (ops_changed, sites_changed, segments_added_count, segments_removed_count).
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/forensics/fragmentation.h"
#include "gpumem/forensics/moment.h"
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

struct DiffSide {
  std::string source;
  int device = 0;
  Moment moment;
  std::string verdict;
  Fragmentation fragmentation;
};

struct SnapshotDiff {
  DiffSide a, b;
  std::vector<GroupDelta> ops;    // changed ones, largest |delta| first, at most top
  std::vector<GroupDelta> sites;
  std::size_t ops_changed = 0;    // before the limit
  std::size_t sites_changed = 0;
  std::vector<SegmentRef> segments_added;    // in B, not in A (same address and size), at most top
  std::vector<SegmentRef> segments_removed;  // in A, not in B, at most top
  std::size_t segments_added_count = 0;
  std::size_t segments_removed_count = 0;
  bool any_op = false;  // either side records ops
};

struct DiffOptions {
  std::size_t top = 20;
  MomentSpec at_a;  // default: the OOM, else the peak of reserved bytes
  MomentSpec at_b;
  std::optional<int> device_a;
  std::optional<int> device_b;
};

SnapshotDiff diff_snapshots(const Snapshot& a, const Snapshot& b, const DiffOptions& options = {});

std::string render_diff_text(const SnapshotDiff& diff);
std::string render_diff_json(const SnapshotDiff& diff);

}  // namespace gpumem::forensics
