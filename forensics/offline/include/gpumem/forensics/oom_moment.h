// state_at_moment: one device's segments as they were at a moment of its trace (moment.h): after
// the trace's first `applied` entries; at an OOM, just before its oom entry (the failed request).
//
// PyTorch writes snapshots (and gpumem's, when taken late) after the exception unwound the stack
// and freed memory, so segments often show the state after the OOM. A snapshot with segments is
// moved back to the moment: the entries recorded after it are undone, newest first (frees become
// allocations again, allocs become free, segments created are removed and segments released come
// back). A snapshot that has a trace but no segments (a CSV trace) has its segments rebuilt
// forward from the trace up to the moment instead. Either way the result says what it did, so a
// report can say so.
// Traces record requested sizes only, so a restored or rebuilt block gets its request rounded to
// 512 bytes plus what PyTorch's split rule would have left in it; a block whose freed extent merged
// with a free neighbour can come back up to 1 MiB smaller than it was (its unsplit remainder).
//
// Thread-safety: a free function of its arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "gpumem/forensics/moment.h"
#include "gpumem/forensics/snapshot.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

struct StateAtMoment {
  int device = 0;
  std::vector<SnapshotSegment> segments;          // the device's, sorted by address
  std::optional<std::size_t> oom_entry;           // the moment's oom entry, when it is an OOM
  std::size_t moment_entries = 0;                 // trace entries applied at the moment
  std::size_t rolled_back_entries = 0;            // entries after the moment that were undone
  std::size_t rolled_back_frees = 0;              // ... of which frees (allocations restored)
  bool reconstructed = false;                     // segments rebuilt from the trace
  std::size_t skipped_entries = 0;                // entries the state could not take
};

StateAtMoment state_at_moment(const Snapshot& snapshot, int device, const Moment& moment);
// At the trace's last OOM when it records one, else at its end.
StateAtMoment state_at_moment(const Snapshot& snapshot, int device);

// For a trace without segments (a CSV trace): the block each alloc entry gets when the segments
// are rebuilt forward from the trace's segment entries, as state_at_moment rebuilds them (the
// request rounded to 512 bytes plus what PyTorch's split rule leaves in the block), by entry; 0
// for other entries and for allocations the rebuild cannot place. Empty when the trace has no
// segment entries. The viewer sizes a CSV's blocks with it, so that its allocated bytes are the
// report's.
std::vector<std::uint64_t> rebuilt_block_bytes(const std::vector<TraceEntry>& trace, int device);

}  // namespace gpumem::forensics
