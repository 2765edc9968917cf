// GroupTable: a moment's memory per op or per call site (`gpumem report`'s tables, `gpumem diff`'s
// deltas), from the segments at the moment (state_at_moment) and the trace up to it:
//   live_bytes, live_blocks     allocated bytes and blocks live at the moment (exact block sizes
//                               where the file has them): they sum to the moment's allocated
//   trace_allocs,               allocations the trace records up to the moment under the group,
//   trace_alloc_bytes           and the bytes they requested
//   reserved_growth_bytes       segment_alloc / segment_map bytes the trace records up to the
//                               moment while the group was current (the request that grew memory)
//   reserved_unallocated_bytes  reserved-unallocated bytes at the moment (free and pending free)
//                               in the memory the group's requests reserved: they sum to the
//                               moment's reserved - allocated; memory reserved before the trace
//                               began goes to the row kBeforeTrace
// A block's group is its own op / call site when the file records one on the block, else that of
// the last alloc entry of its address up to the moment; kNotRecorded when neither says.
//
// Thread-safety: a free function of its arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

struct GroupRow {
  std::string name;
  std::uint64_t live_bytes = 0;
  std::uint64_t live_blocks = 0;
  std::uint64_t trace_allocs = 0;
  std::uint64_t trace_alloc_bytes = 0;
  std::uint64_t reserved_growth_bytes = 0;
  std::uint64_t reserved_unallocated_bytes = 0;
};

enum class GroupBy : std::uint8_t { op, call_site };

// Rows by live bytes, then reserved-unallocated bytes, largest first; rows with nothing to say
// are left out. `applied`: the trace entries up to the moment.
std::vector<GroupRow> group_table(const std::vector<SnapshotSegment>& segments,
                                  const std::vector<SnapshotTraceEntry>& trace, std::size_t applied, GroupBy by);

}  // namespace gpumem::forensics
