// state_at_moment: one device's segments as they were at the moment a report describes: the last
// `oom` entry of its trace (the failed request), or the end of the trace when it has none.
//
// PyTorch writes snapshots (and gpumem's, when taken late) after the exception unwound the stack
// and freed memory, so segments often show the state after the OOM. Where the trace records
// entries after the oom entry, they are undone newest first: frees become allocations again, allocs
// become free, segments created are removed and segments released come back. A snapshot that has
// a trace but no segments (a CSV trace) has its segments rebuilt forward from the trace up to
// the moment instead. Either way the result says what it did, so a report can say so.
// Traces record requested sizes only, so a restored or rebuilt block gets its request rounded to
// 512 bytes plus what PyTorch's split rule would have left in it; a block whose freed extent merged
// with a free neighbour can come back up to 1 MiB smaller than it was (its unsplit remainder).
//
// Thread-safety: a free function of its arguments.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

struct StateAtMoment {
  int device = 0;
  std::vector<SnapshotSegment> segments;          // the device's, sorted by address
  std::optional<std::size_t> oom_entry;           // index of the oom entry in the device's trace
  std::size_t moment_entries = 0;                 // trace entries up to the moment (exclusive)
  std::size_t rolled_back_entries = 0;            // entries after the oom that were undone
  std::size_t rolled_back_frees = 0;              // ... of which frees (allocations restored)
  bool reconstructed = false;                     // segments rebuilt from the trace
  std::size_t skipped_entries = 0;                // entries the state could not take
};

StateAtMoment state_at_moment(const Snapshot& snapshot, int device);

}  // namespace gpumem::forensics
