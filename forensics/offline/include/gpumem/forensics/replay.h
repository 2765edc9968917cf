// Trace replay: drives allocator policies with a trace's requests, in order, and measures what
// each would reserve.
//
// A trace is first compiled into a ReplayScript (policy-independent): `alloc` entries become
// allocation steps, `free_completed` entries become free steps matched to their allocation by the
// trace's address (the policy returns addresses of its own). Entries that cannot be matched are
// skipped and counted: frees of addresses the trace never allocated (the recorder's ring buffer
// wrapped and lost the alloc), and allocs of an address that is still live (its free was lost;
// the earlier block is freed first). Segment, snapshot and oom entries drive nothing; the
// segment entries tell what PyTorch itself reserved (ReplayScript::trace_reserved_peak_bytes).
// An `oom` entry (a request PyTorch could not serve) becomes a probe: the policy tries the same
// size; if it succeeds the block is freed at once (the program never got it), and the replay
// counts which trace OOMs the policy would have served.
//
// replay_policy() then runs one policy over the script: after every step it reads the policy's
// allocated and reserved bytes; it finds the peak moment (reserved at its peak and, among the
// steps where it is, the most live requested bytes), and replays a fresh policy up to that moment
// to explain it (WasteBreakdown, the call sites holding the most live bytes). The measuring pass
// also charges the provider calls each step makes to its request's call site and size (CallGroup).
//
// Thread-safety: functions of their arguments; a ReplayScript can be replayed from several
// threads at once (each with its own policy).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/forensics/replay_policy.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

enum class StepKind : std::uint8_t { alloc, free, oom_probe };

struct ReplayStep {
  std::uint64_t size_bytes = 0;  // requested bytes (of the allocation, for a free too)
  std::uint64_t stream = 0;
  std::uint32_t slot = 0;        // allocation identity, dense from 0
  std::uint32_t entry = 0;       // index of the trace entry
  std::uint32_t site = 0;        // the allocation's call site (index into Trace::sites)
  StepKind kind = StepKind::alloc;
  bool step_start = false;       // a training step starts here (mark_steps)
};

struct ReplayScript {
  std::vector<ReplayStep> steps;
  std::uint32_t slots = 0;
  std::size_t entries = 0;                  // trace entries in all
  std::size_t allocs = 0;                   // alloc steps
  std::size_t frees = 0;                    // free steps
  std::size_t skipped_frees = 0;            // free_requested/free_completed of unknown addresses
  std::size_t skipped_allocs = 0;           // allocs over a live address
  std::size_t trace_ooms = 0;               // oom entries in the trace
  std::size_t peak_requested_bytes = 0;     // peak of live requested bytes (an oom probe counts
                                            // as live at its moment)
  std::size_t peak_requested_step = 0;
  std::size_t trace_reserved_peak_bytes = 0;  // what the trace's segment_* entries add up to
  std::int64_t duration_us = 0;

  std::size_t skipped_entries() const noexcept { return skipped_frees + skipped_allocs; }
};

ReplayScript compile_replay(const Trace& trace);

// Marks where training steps start, as the program would if it told the allocator (a planner
// learns them: gpumem+plan): at the first allocation of `marker_bytes` and at every
// `per_step`-th one after it (a step that makes per_step requests of that size, such as a
// language model's logits and their gradients). Returns how many steps it marked; 0 if the script
// has no request of that size. marker_bytes and per_step must be positive (else ForensicsError).
std::size_t mark_steps(ReplayScript& script, std::uint64_t marker_bytes, std::size_t per_step);

using PolicyFactory = std::function<std::unique_ptr<ReplayPolicy>()>;

struct SiteBytes {
  std::uint32_t site = 0;
  std::size_t live_bytes = 0;   // requested bytes live at the moment
  std::size_t live_blocks = 0;
};

// The provider calls made while replaying the requests of one call site and one size: which
// requests pay the driver time (a large tensor whose place is backed again at every step, a
// build-up of the footprint). A free is charged to its block's site and size, an OOM probe to its
// own.
struct CallGroup {
  std::uint32_t site = 0;
  std::uint64_t size_bytes = 0;      // requested bytes of each of the group's requests
  std::size_t steps = 0;             // its allocations, frees and probes that made a call
  PolicyCounters calls;              // the calls they made (segments: 0)
  double seconds = 0.0;              // their time on an H200 (call_costs.h)
  double second_half_seconds = 0.0;  // the part made in the trace's second half (by trace time)
};

struct PolicyReplay {
  std::string policy;
  std::size_t peak_requested_bytes = 0;
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  double ratio = 0.0;                  // peak reserved / peak requested
  std::size_t peak_step = 0;           // the step with peak reserved and, among those, most requested
  std::int64_t peak_time_us = 0;
  WasteBreakdown at_peak;              // the state at peak_step
  PolicyCounters counters;             // at the end of the replay
  std::uint64_t segments_at_peak = 0;  // segments (or regions) existing at peak_step
  std::size_t failed_allocations = 0;  // alloc steps the policy could not serve (OOM)
  std::size_t trace_ooms_served = 0;   // oom probes the policy served
  double call_seconds = 0.0;           // estimated time of the counted provider calls on an H200
  // call_seconds / (trace duration + call_seconds): the calls' share of the traced run lengthened
  // by them, in [0, 1) (0 if no duration)
  double call_share = 0.0;
  std::vector<SiteBytes> top_sites;    // by live bytes at peak_step, largest first
  // With ReplayOptions::top_call_groups: the groups whose calls took the most time, most first
  // (ties: the lower site, then the smaller size), and how many groups made a call in all.
  std::vector<CallGroup> top_call_groups;
  std::size_t call_groups = 0;
  double replay_seconds = 0.0;         // wall time of the measuring pass
  // Per step (only with ReplayOptions::record_timeline): allocated and reserved bytes after it.
  std::vector<std::size_t> timeline_allocated_bytes;
  std::vector<std::size_t> timeline_reserved_bytes;
  std::string notes;                   // ReplayPolicy::notes() at the end of the replay
};

struct ReplayOptions {
  bool record_timeline = false;
  std::size_t top_sites = 5;
  // How many groups of requests (call site and size) to list by the time of the calls they made
  // (PolicyReplay::top_call_groups); 0: none, and the replay reads no counters per step.
  std::size_t top_call_groups = 5;
  // Called now and then with (steps done, steps in all) during the measuring pass.
  std::function<void(std::size_t, std::size_t)> progress;
};

PolicyReplay replay_policy(const Trace& trace, const ReplayScript& script, const std::string& policy_name,
                           const PolicyFactory& make_policy, const ReplayOptions& options = {});

// Live requested bytes per call site after `step` (inclusive), largest first, at most `limit`.
std::vector<SiteBytes> live_sites_at(const ReplayScript& script, std::size_t step, std::size_t limit);

}  // namespace gpumem::forensics
