// Renders replay results: a side-by-side table for people, one JSON object for scripts, and the
// per-step timeline as CSV. The table ends with the call sites holding the most memory at each
// policy's peak and the groups of requests (call site, size) whose provider calls took the most
// time (replay.h, CallGroup).
//
// JSON shape (one object):
//   {"trace": PATH, "format": "csv"|"snapshot", "entries": N, "allocs": N, "frees": N,
//    "skipped_entries": N, "skipped_frees": N, "skipped_allocs": N, "trace_ooms": N,
//    "duration_us": N, "peak_requested_bytes": N, "trace_reserved_peak_bytes": N,
//    "measured": {"json": PATH, "alloc_conf": S, "peak_allocated_bytes": N,
//                 "peak_reserved_bytes": N} | null,
//    "policies": [{"policy": NAME, "peak_requested_bytes": N, "peak_allocated_bytes": N,
//                  "peak_reserved_bytes": N, "ratio": X, "segments": N, "maps": N, "unmaps": N,
//                  "creates": N, "releases": N, "alloc_retries": N, "failed_allocations": N, "trace_ooms_served": N,
//                  "segments_at_peak": N, "peak_entry": N, "peak_time_us": N,
//                  "at_peak": {"requested_bytes", "allocated_bytes", "reserved_bytes",
//                              "rounding_bytes", "inactive_split_bytes", "cached_free_bytes"},
//                  (the terms of vocabulary.h: inactive split counts the free bytes of partly used
//                  pages of expandable segments too)
//                  "call_seconds": X, "call_share": X, "replay_seconds": X,
//                  "top_sites": [{"site": S, "live_bytes": N, "live_blocks": N}],
//                  "call_groups": N,
//                  "top_call_groups": [{"site": S, "size_bytes": N, "steps": N, "creates": N,
//                                       "maps": N, "unmaps": N, "releases": N, "syncs": N,
//                                       "marker_waits": N, "seconds": X, "second_half_seconds": X}]}]}
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gpumem/forensics/replay.h"
#include "gpumem/forensics/trace.h"
#include "gpumem/forensics/trace_loader.h"
#include "gpumem/forensics/vocabulary.h"

namespace gpumem::forensics {

struct ReplayReport {
  const Trace& trace;
  const ReplayScript& script;
  TraceFormat format = TraceFormat::csv;
  std::optional<MeasuredPeaks> measured;
  std::vector<PolicyReplay> policies;
};

std::string format_table(const ReplayReport& report);
std::string format_json(const ReplayReport& report);
// Writes `step,entry,time_us,action,requested_bytes` then `<policy>.allocated_bytes` and
// `<policy>.reserved_bytes` per policy; needs policies replayed with record_timeline.
void write_timeline_csv(std::ostream& out, const ReplayReport& report);

}  // namespace gpumem::forensics
