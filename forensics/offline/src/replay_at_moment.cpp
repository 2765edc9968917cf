#include "gpumem/forensics/replay_at_moment.h"

#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "gpumem/forensics/policy_factory.h"
#include "gpumem/forensics/replay.h"

namespace gpumem::forensics {

ReplayInput replay_input(const Snapshot& snap, int device, const Moment& moment, const StateAtMoment& state) {
  ReplayInput in;
  Trace all = trace_from_snapshot(snap, device);
  const std::size_t n = all.entries.size();
  // Entries up to the moment; at an OOM, its oom entry too (the replay probes the request).
  const std::size_t last = moment.oom_entry ? std::min(n, *moment.oom_entry + 1) : std::min(n, moment.applied);

  // Blocks live before the first entry: freed without an alloc, or live at the moment without one.
  std::unordered_map<std::uint64_t, bool> live;  // addr -> allocated inside the window and not freed
  std::vector<TraceEntry> seeds;
  std::unordered_set<std::uint64_t> seeded;
  const std::int64_t t0 = n > 0 ? all.entries.front().time_us : 0;
  for (std::size_t i = 0; i < last; ++i) {
    const TraceEntry& e = all.entries[i];
    if (e.action == TraceAction::alloc) {
      live[e.addr] = true;
    } else if (e.action == TraceAction::free_completed || e.action == TraceAction::free_requested) {
      auto it = live.find(e.addr);
      if (it == live.end() || !it->second) {
        if (it == live.end() && seeded.insert(e.addr).second) {
          seeds.push_back(TraceEntry{TraceAction::alloc, e.site, e.addr, e.size_bytes, e.stream, t0});
          ++in.orphan_frees;
        }
        live[e.addr] = false;
      }
      if (e.action == TraceAction::free_completed) live.erase(e.addr);
      else if (it != live.end()) it->second = false;
    }
  }
  bool has_segments = false;
  for (const auto& seg : snap.segments) has_segments |= seg.device == device;
  if (has_segments) {
    for (const auto& seg : state.segments) {
      for (const auto& b : seg.blocks) {
        if (b.state == "inactive") continue;
        auto it = live.find(b.address);
        if (it != live.end()) continue;  // allocated inside the window (or its free is pending)
        if (!seeded.insert(b.address).second) continue;
        const std::uint64_t request = b.requested_bytes ? b.requested_bytes : b.size_bytes;
        seeds.push_back(TraceEntry{TraceAction::alloc, all.intern_site(call_site(b.frames)), b.address, request,
                                   seg.stream, t0});
      }
    }
  } else if (in.orphan_frees > 0) {
    in.live_set_known = false;
    in.why_unknown = fmt::format("the trace frees {} block(s) it never allocated, so it began after the program did, "
                                 "and the file has no segments to say what else was live then",
                                 in.orphan_frees);
  }
  in.seeded_blocks = seeds.size();
  for (const auto& s : seeds) in.seeded_bytes += s.size_bytes;

  in.trace.source = all.source;
  in.trace.sites = all.sites;
  in.trace.entries.reserve(seeds.size() + last);
  in.trace.entries.insert(in.trace.entries.end(), seeds.begin(), seeds.end());
  in.trace.entries.insert(in.trace.entries.end(), all.entries.begin(),
                          all.entries.begin() + static_cast<std::ptrdiff_t>(last));
  return in;
}

std::optional<MomentReplay> replay_to_moment(const ReplayInput& input, std::string_view policy,
                                             std::uint64_t limit_bytes) {
  try {
    ReplayEnvironment env;
    env.memory_limit_bytes = limit_bytes;
    const PolicySpec spec = parse_policy_spec(policy, env);
    const ReplayScript script = compile_replay(input.trace);
    ReplayOptions options;
    options.top_sites = 0;
    options.top_call_groups = 0;
    options.record_timeline = true;
    const PolicyReplay r = replay_policy(input.trace, script, spec.name, spec.make, options);
    MomentReplay out;
    out.policy = spec.name;
    out.reserved_at_moment_bytes = r.timeline_reserved_bytes.empty() ? 0 : r.timeline_reserved_bytes.back();
    out.peak_reserved_bytes = r.peak_reserved_bytes;
    out.failed_allocations = r.failed_allocations;
    out.oom_served = r.trace_ooms_served > 0;
    return out;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace gpumem::forensics
