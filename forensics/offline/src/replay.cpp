#include "gpumem/forensics/replay.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/forensics/call_costs.h"
#include "gpumem/forensics/error.h"

namespace gpumem::forensics {
namespace {

constexpr std::uint64_t kNoAddress = std::numeric_limits<std::uint64_t>::max();

// The traced time of a step, from the trace's first entry, within [0, duration] (time stamps of a
// Trace built by hand may be anything).
std::int64_t step_time_us(const Trace& trace, const ReplayStep& s) noexcept {
  const std::int64_t t0 = trace.entries.front().time_us, t = trace.entries[s.entry].time_us;
  std::int64_t d = 0;
  if (t <= t0 || __builtin_sub_overflow(t, t0, &d)) return t <= t0 ? 0 : trace.duration_us();
  return std::min(d, trace.duration_us());
}

bool made_calls(const PolicyCounters& d) noexcept {
  return d.creates + d.releases + d.maps + d.unmaps + d.syncs + d.marker_waits > 0;
}

// The call groups of one replay, keyed by (site, size).
class CallGroups {
 public:
  void charge(const ReplayStep& s, const PolicyCounters& d, const CallCosts& costs, bool second_half) {
    CallGroup& g = groups_[Key{s.site, s.size_bytes}];
    g.site = s.site;
    g.size_bytes = s.size_bytes;
    ++g.steps;
    g.calls += d;
    const double t = call_seconds(d, costs);
    g.seconds += t;
    if (second_half) g.second_half_seconds += t;
  }
  std::size_t size() const noexcept { return groups_.size(); }
  // The `limit` groups with the most time, most first; ties: the lower site, the smaller size.
  std::vector<CallGroup> top(std::size_t limit) const {
    std::vector<CallGroup> out;
    out.reserve(groups_.size());
    for (const auto& [key, g] : groups_) out.push_back(g);
    std::sort(out.begin(), out.end(), [](const CallGroup& a, const CallGroup& b) {
      if (a.seconds != b.seconds) return a.seconds > b.seconds;
      return a.site != b.site ? a.site < b.site : a.size_bytes < b.size_bytes;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
  }

 private:
  struct Key {
    std::uint32_t site;
    std::uint64_t size;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return std::hash<std::uint64_t>{}(k.size * 0x9e3779b97f4a7c15ull ^ k.site);
    }
  };
  std::unordered_map<Key, CallGroup, KeyHash> groups_;
};

}  // namespace

PolicyCounters operator-(const PolicyCounters& after, const PolicyCounters& before) noexcept {
  PolicyCounters d;
  d.creates = after.creates - before.creates;
  d.releases = after.releases - before.releases;
  d.maps = after.maps - before.maps;
  d.unmaps = after.unmaps - before.unmaps;
  d.syncs = after.syncs - before.syncs;
  d.marker_waits = after.marker_waits - before.marker_waits;
  d.marker_wait_ns = after.marker_wait_ns - before.marker_wait_ns;
  d.alloc_retries = after.alloc_retries - before.alloc_retries;
  return d;
}

PolicyCounters& operator+=(PolicyCounters& sum, const PolicyCounters& more) noexcept {
  sum.creates += more.creates;
  sum.releases += more.releases;
  sum.maps += more.maps;
  sum.unmaps += more.unmaps;
  sum.syncs += more.syncs;
  sum.marker_waits += more.marker_waits;
  sum.marker_wait_ns += more.marker_wait_ns;
  sum.alloc_retries += more.alloc_retries;
  return sum;
}

ReplayScript compile_replay(const Trace& trace) {
  ReplayScript s;
  s.entries = trace.entries.size();
  s.duration_us = trace.duration_us();
  s.steps.reserve(trace.entries.size() / 2 + 1);
  struct Live {
    std::uint32_t slot;
    std::uint64_t size;
    std::uint64_t stream;
    std::uint32_t site;
    bool free_requested;
  };
  std::unordered_map<std::uint64_t, Live> live;
  live.reserve(1024);
  std::size_t requested = 0;
  std::int64_t trace_reserved = 0;
  std::int64_t trace_reserved_peak = 0;
  auto emit_free = [&](const Live& l, std::uint32_t entry) {
    ReplayStep step;
    step.size_bytes = l.size;
    step.stream = l.stream;
    step.slot = l.slot;
    step.entry = entry;
    step.site = l.site;
    step.kind = StepKind::free;
    s.steps.push_back(step);
    requested -= l.size;
    ++s.frees;
  };
  for (std::size_t i = 0; i < trace.entries.size(); ++i) {
    const TraceEntry& e = trace.entries[i];
    const auto entry = static_cast<std::uint32_t>(i);
    switch (e.action) {
      case TraceAction::alloc: {
        if (auto it = live.find(e.addr); it != live.end()) {
          emit_free(it->second, entry);  // its free was lost: free it before reusing the address
          live.erase(it);
          ++s.skipped_allocs;
        }
        Live l{s.slots++, e.size_bytes, e.stream, e.site, false};
        live.emplace(e.addr, l);
        ReplayStep step;
        step.size_bytes = e.size_bytes;
        step.stream = e.stream;
        step.slot = l.slot;
        step.entry = entry;
        step.site = e.site;
        step.kind = StepKind::alloc;
        s.steps.push_back(step);
        ++s.allocs;
        requested += e.size_bytes;
        if (requested > s.peak_requested_bytes) {
          s.peak_requested_bytes = requested;
          s.peak_requested_step = s.steps.size() - 1;
        }
        break;
      }
      case TraceAction::free_requested: {
        auto it = live.find(e.addr);
        if (it == live.end() || it->second.free_requested) {
          ++s.skipped_frees;
        } else {
          it->second.free_requested = true;
        }
        break;
      }
      case TraceAction::free_completed: {
        auto it = live.find(e.addr);
        if (it == live.end()) {
          ++s.skipped_frees;
          break;
        }
        emit_free(it->second, entry);
        live.erase(it);
        break;
      }
      case TraceAction::segment_alloc:
      case TraceAction::segment_map:
        trace_reserved += static_cast<std::int64_t>(e.size_bytes);
        trace_reserved_peak = std::max(trace_reserved_peak, trace_reserved);
        break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap:
        trace_reserved -= static_cast<std::int64_t>(e.size_bytes);
        break;
      case TraceAction::oom: {
        ++s.trace_ooms;
        ReplayStep step;
        step.size_bytes = e.size_bytes;
        step.stream = e.stream;
        step.entry = entry;
        step.site = e.site;
        step.kind = StepKind::oom_probe;
        if (e.size_bytes > 0) {
          s.steps.push_back(step);
          // The failed request was live for its moment: a policy that serves it needs the room.
          if (requested + e.size_bytes > s.peak_requested_bytes) {
            s.peak_requested_bytes = requested + e.size_bytes;
            s.peak_requested_step = s.steps.size() - 1;
          }
        }
        break;
      }
      case TraceAction::snapshot: break;
    }
  }
  s.trace_reserved_peak_bytes = static_cast<std::size_t>(trace_reserved_peak);
  return s;
}

std::size_t mark_steps(ReplayScript& script, std::uint64_t marker_bytes, std::size_t per_step) {
  if (marker_bytes == 0 || per_step == 0)
    throw ForensicsError(fmt::format("step marker: the marker size ({}) and the requests of that size per step ({}) must "
                                     "be positive",
                                     marker_bytes, per_step));
  std::size_t seen = 0, marked = 0;
  for (ReplayStep& s : script.steps) {
    s.step_start = false;
    if (s.kind != StepKind::alloc || s.size_bytes != marker_bytes) continue;
    if (seen++ % per_step == 0) {
      s.step_start = true;
      ++marked;
    }
  }
  return marked;
}

std::vector<SiteBytes> live_sites_at(const ReplayScript& script, std::size_t step, std::size_t limit) {
  std::unordered_map<std::uint32_t, SiteBytes> by_site;
  const std::size_t end = std::min(step + 1, script.steps.size());
  for (std::size_t i = 0; i < end; ++i) {
    const ReplayStep& s = script.steps[i];
    if (s.kind == StepKind::oom_probe) continue;
    SiteBytes& b = by_site[s.site];
    b.site = s.site;
    if (s.kind == StepKind::alloc) {
      b.live_bytes += s.size_bytes;
      ++b.live_blocks;
    } else {
      b.live_bytes -= s.size_bytes;
      --b.live_blocks;
    }
  }
  std::vector<SiteBytes> out;
  for (const auto& [site, b] : by_site) {
    if (b.live_bytes > 0) out.push_back(b);
  }
  std::sort(out.begin(), out.end(), [](const SiteBytes& a, const SiteBytes& b) {
    return a.live_bytes != b.live_bytes ? a.live_bytes > b.live_bytes : a.site < b.site;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

PolicyReplay replay_policy(const Trace& trace, const ReplayScript& script, const std::string& policy_name,
                           const PolicyFactory& make_policy, const ReplayOptions& options) {
  PolicyReplay r;
  r.policy = policy_name;
  r.peak_requested_bytes = script.peak_requested_bytes;
  const std::size_t n = script.steps.size();
  if (options.record_timeline) {
    r.timeline_allocated_bytes.resize(n);
    r.timeline_reserved_bytes.resize(n);
  }

  // Pass 1: measure.
  std::vector<std::uint64_t> address(script.slots, kNoAddress);
  {
    std::unique_ptr<ReplayPolicy> policy = make_policy();
    policy->prepare(trace);
    const auto t0 = std::chrono::steady_clock::now();
    constexpr std::size_t kProgressEvery = std::size_t{1} << 15;
    std::size_t requested = 0;
    std::size_t requested_at_peak = 0;
    const bool group_calls = options.top_call_groups > 0;
    CallGroups groups;
    const CallCosts costs = policy->call_costs();
    PolicyCounters before = group_calls ? policy->calls() : PolicyCounters{};
    for (std::size_t i = 0; i < n; ++i) {
      const ReplayStep& s = script.steps[i];
      const std::int64_t t_us = step_time_us(trace, s);
      policy->set_time_us(t_us);
      if (s.step_start) policy->mark_step();
      if (s.kind == StepKind::alloc) {
        const auto got = policy->allocate(s.size_bytes, s.stream);
        if (got) {
          address[s.slot] = *got;
        } else {
          ++r.failed_allocations;
        }
      } else if (s.kind == StepKind::free) {
        if (const std::uint64_t a = address[s.slot]; a != kNoAddress) {
          policy->free(a);
          address[s.slot] = kNoAddress;
        }
      } else if (const auto got = policy->allocate(s.size_bytes, s.stream)) {
        policy->free(*got);
        ++r.trace_ooms_served;
      }
      if (group_calls) {
        const PolicyCounters after = policy->calls();
        const PolicyCounters d = after - before;
        if (made_calls(d)) groups.charge(s, d, costs, 2 * t_us >= script.duration_us && script.duration_us > 0);
        before = after;
      }
      if (s.kind == StepKind::alloc) requested += s.size_bytes;
      if (s.kind == StepKind::free) requested -= s.size_bytes;
      const std::size_t allocated = policy->allocated_bytes();
      const std::size_t reserved = policy->reserved_bytes();
      // The peak moment: reserved at its highest and, while it stays there, the most requested
      // (the breakdown then shows what the busiest moment still leaves unused).
      if (reserved > r.peak_reserved_bytes || (reserved == r.peak_reserved_bytes && requested > requested_at_peak)) {
        r.peak_reserved_bytes = reserved;
        r.peak_step = i;
        requested_at_peak = requested;
      }
      r.peak_allocated_bytes = std::max(r.peak_allocated_bytes, allocated);
      if (options.record_timeline) {
        r.timeline_allocated_bytes[i] = allocated;
        r.timeline_reserved_bytes[i] = reserved;
      }
      if (options.progress && (i % kProgressEvery) == 0) options.progress(i, n);
    }
    r.replay_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (options.progress) options.progress(n, n);
    r.counters = policy->counters();
    r.notes = policy->notes();
    r.call_seconds = call_seconds(r.counters, costs);
    if (group_calls) {
      r.top_call_groups = groups.top(options.top_call_groups);
      r.call_groups = groups.size();
    }
  }
  // The calls' share of the run they would be part of: the traced run lengthened by them (a share
  // of the traced run alone passes 100% when a policy's calls take longer than the whole trace).
  if (script.duration_us > 0)
    r.call_share = r.call_seconds / (static_cast<double>(script.duration_us) * 1e-6 + r.call_seconds);
  r.ratio = r.peak_requested_bytes > 0
                ? static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(r.peak_requested_bytes)
                : 0.0;

  // Pass 2: the state at the peak. A fresh policy replays up to the peak step (policies are
  // deterministic), so the measuring pass pays nothing for this.
  if (n > 0) {
    std::unique_ptr<ReplayPolicy> policy = make_policy();
    policy->prepare(trace);
    std::fill(address.begin(), address.end(), kNoAddress);
    for (std::size_t i = 0; i <= r.peak_step; ++i) {
      const ReplayStep& s = script.steps[i];
      policy->set_time_us(step_time_us(trace, s));
      if (s.step_start) policy->mark_step();
      if (s.kind == StepKind::alloc) {
        if (const auto got = policy->allocate(s.size_bytes, s.stream)) address[s.slot] = *got;
      } else if (s.kind == StepKind::free) {
        if (const std::uint64_t a = address[s.slot]; a != kNoAddress) {
          policy->free(a);
          address[s.slot] = kNoAddress;
        }
      } else if (const auto got = policy->allocate(s.size_bytes, s.stream)) {
        policy->free(*got);
      }
    }
    r.at_peak = policy->breakdown();
    r.segments_at_peak = policy->counters().segments;
    r.peak_time_us = trace.entries[script.steps[r.peak_step].entry].time_us;
    r.top_sites = live_sites_at(script, r.peak_step, options.top_sites);
  }
  return r;
}

}  // namespace gpumem::forensics
