// Replays of a file's trace up to a moment (moment.h) under allocator policies: what another
// policy would have reserved there, and at an OOM whether it would have served the request. Used
// by `gpumem report` (the fragmentation verdict's comparison, the OOM advice).
//
// A replay only answers for the memory it holds, so it starts from the live set of the trace's
// first entry: blocks live before the trace began are placed first (as allocations), then the
// trace runs. Those blocks are known where the file has segments (a snapshot: the blocks live at
// the moment whose allocation the trace does not hold) plus the blocks the trace frees without
// having allocated them; a file without segments (a CSV trace) that frees blocks it never
// allocated started after the program did, and what else was live then is unknown: no replay
// is offered for it (ReplayInput::live_set_known is false, and why_unknown says so).
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpumem/forensics/moment.h"
#include "gpumem/forensics/oom_moment.h"
#include "gpumem/forensics/snapshot.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

struct ReplayInput {
  Trace trace;                       // the seeds, then the entries up to the moment (its oom entry included)
  std::size_t seeded_blocks = 0;     // blocks live before the trace's first entry, placed first
  std::uint64_t seeded_bytes = 0;    // their requested bytes
  std::size_t orphan_frees = 0;      // frees of blocks the trace did not allocate
  bool live_set_known = true;
  std::string why_unknown;           // when !live_set_known: one sentence
};

ReplayInput replay_input(const Snapshot& snapshot, int device, const Moment& moment, const StateAtMoment& state);

struct MomentReplay {
  std::string policy;
  std::uint64_t reserved_at_moment_bytes = 0;  // after the last replayed entry
  std::uint64_t peak_reserved_bytes = 0;       // up to the moment
  std::size_t failed_allocations = 0;          // allocations it could not serve within the limit
  bool oom_served = false;                     // at an OOM moment: the failed request was served
};

// Replays input under `policy` (policy_factory.h's names) with reserved memory capped at
// limit_bytes (SIZE_MAX: none). nullopt when the policy cannot be made (a name this build lacks).
std::optional<MomentReplay> replay_to_moment(const ReplayInput& input, std::string_view policy,
                                             std::uint64_t limit_bytes);

}  // namespace gpumem::forensics
