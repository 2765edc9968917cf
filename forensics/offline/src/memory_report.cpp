#include "gpumem/forensics/memory_report.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/forensics/policy_factory.h"
#include "gpumem/forensics/replay.h"
#include "json_out.h"

namespace gpumem::forensics {
namespace {

using detail::human_bytes;

constexpr const char* kUnknown = "(unknown)";

int pick_device(const Snapshot& snap, const ReportOptions& options) {
  if (options.device) return *options.device;
  for (std::size_t d = 0; d < snap.device_traces.size(); ++d) {
    for (const auto& e : snap.device_traces[d]) {
      if (e.action == TraceAction::oom) return static_cast<int>(d);
    }
  }
  if (!snap.device_traces.empty() && !snap.device_traces[static_cast<std::size_t>(first_traced_device(snap))].empty()) {
    return first_traced_device(snap);
  }
  return snap.segments.empty() ? 0 : snap.segments.front().device;
}

std::vector<LiveGroup> top_groups(std::unordered_map<std::string, LiveGroup>& groups, std::size_t top) {
  std::vector<LiveGroup> out;
  out.reserve(groups.size());
  for (auto& [k, g] : groups) out.push_back(std::move(g));
  std::sort(out.begin(), out.end(), [](const LiveGroup& a, const LiveGroup& b) {
    return a.live_bytes != b.live_bytes ? a.live_bytes > b.live_bytes : a.name < b.name;
  });
  if (out.size() > top) out.resize(top);
  return out;
}

// Replays the trace up to and including the oom entry under `policy` with `limit` bytes.
std::optional<PolicyReplay> replay_to_oom(const Snapshot& snap, int device, std::size_t oom_entry,
                                          const std::string& policy, std::uint64_t limit) {
  try {
    Trace trace = trace_from_snapshot(snap, device);
    trace.entries.resize(std::min(trace.entries.size(), oom_entry + 1));
    const ReplayScript script = compile_replay(trace);
    ReplayEnvironment env;
    env.memory_limit_bytes = limit;
    const PolicySpec spec = parse_policy_spec(policy, env);
    ReplayOptions opts;
    opts.top_sites = 0;
    return replay_policy(trace, script, spec.name, spec.make, opts);
  } catch (const std::exception&) {
    return std::nullopt;  // a policy this build lacks: no replay advice
  }
}

void analyze_oom(const Snapshot& snap, MemoryReport& r, const ReportOptions& options) {
  const auto& trace = snap.device_traces[static_cast<std::size_t>(r.device)];
  const auto& e = trace[*r.moment.oom_entry];
  const Fragmentation& f = r.fragmentation;
  OomAnalysis a;
  a.request_bytes = e.size_bytes;
  a.rounded_request_bytes = rounded_request(e.size_bytes);
  a.stream = e.stream;
  a.time_us = e.time_us;
  a.site = call_site(e.frames);
  a.op = e.op;
  a.device_free_bytes = e.device_free_bytes;
  if (!a.device_free_bytes && snap.gpumem.device_free_bytes) a.device_free_bytes = snap.gpumem.device_free_bytes;
  if (snap.gpumem.device_total_bytes) a.device_total_bytes = snap.gpumem.device_total_bytes;
  if (snap.gpumem.cap_bytes) a.cap_bytes = snap.gpumem.cap_bytes;
  if (a.device_total_bytes && a.device_free_bytes && *a.device_total_bytes >= *a.device_free_bytes + f.reserved_bytes) {
    a.outside_bytes = *a.device_total_bytes - *a.device_free_bytes - f.reserved_bytes;
  }
  a.largest_usable_extent_bytes = largest_usable_extent(r.moment.segments, a.stream, a.rounded_request_bytes);
  const std::uint64_t need = a.rounded_request_bytes;
  const std::uint64_t unallocated = f.reserved_unallocated_bytes();

  a.evidence.push_back(fmt::format("requested {} ({} B), rounded to {} ({} B)", human_bytes(a.request_bytes),
                                   a.request_bytes, human_bytes(need), need));
  a.evidence.push_back(fmt::format("largest free extent {} (on the request's stream and pool: {}); free in all {}",
                                   human_bytes(f.largest_free_extent_bytes),
                                   human_bytes(a.largest_usable_extent_bytes), human_bytes(f.free_bytes)));
  a.evidence.push_back(fmt::format("allocated {}, reserved {}, reserved but unallocated {} ({} B)",
                                   human_bytes(f.allocated_bytes), human_bytes(f.reserved_bytes),
                                   human_bytes(unallocated), unallocated));

  if (a.largest_usable_extent_bytes < need && f.pending_free_bytes > 0 && f.free_bytes + f.pending_free_bytes >= need &&
      f.free_bytes < need) {
    a.verdict = "pending_frees";
    a.evidence.push_back(fmt::format("{} is freed but still in use on other streams; with it the {} free would "
                                     "hold the request",
                                     human_bytes(f.pending_free_bytes), human_bytes(f.free_bytes + f.pending_free_bytes)));
    a.advice.push_back("synchronize the streams that use the freed tensors (or drop record_stream calls) before "
                       "the large allocation, so their blocks return to the cache");
  } else if (a.largest_usable_extent_bytes < need && f.free_bytes >= need) {
    a.verdict = "fragmentation";
    a.evidence.push_back(fmt::format("{} is cached free, {:.1f}x the request, but it is split into pieces; the "
                                     "largest usable is {} short of the request (external fragmentation {:.2f})",
                                     human_bytes(f.free_bytes), static_cast<double>(f.free_bytes) / static_cast<double>(need),
                                     human_bytes(need - a.largest_usable_extent_bytes), f.external_fragmentation));
  } else if (a.outside_bytes && *a.outside_bytes >= need && (!a.cap_bytes || f.reserved_bytes + need <= *a.cap_bytes)) {
    a.verdict = "outside_memory";
    a.evidence.push_back(fmt::format("{} of the device is held outside the allocator (total {} - free {} - "
                                     "reserved {})",
                                     human_bytes(*a.outside_bytes), human_bytes(*a.device_total_bytes),
                                     human_bytes(*a.device_free_bytes), human_bytes(f.reserved_bytes)));
    a.advice.push_back("find what else holds device memory (other processes in nvidia-smi, other allocators "
                       "such as cuBLAS workspaces or NCCL buffers, cudaMalloc calls outside torch)");
  } else {
    a.verdict = "capacity";
    if (a.cap_bytes) {
      a.evidence.push_back(fmt::format("allocated {} + request {} exceeds the cap {} by {}", human_bytes(f.allocated_bytes),
                                       human_bytes(need), human_bytes(*a.cap_bytes),
                                       human_bytes(f.allocated_bytes + need > *a.cap_bytes ? f.allocated_bytes + need - *a.cap_bytes : 0)));
    } else if (a.device_free_bytes) {
      a.evidence.push_back(fmt::format("the device had {} free: {}", human_bytes(*a.device_free_bytes),
                                       *a.device_free_bytes >= need ? "a memory cap (set_per_process_memory_fraction "
                                                                      "or a limit) refused the growth"
                                                                    : "less than the request"));
    }
  }

  // Advice computed from the data.
  if (a.verdict == "fragmentation" || a.verdict == "capacity") {
    const std::uint64_t limit = a.cap_bytes ? *a.cap_bytes : f.reserved_bytes;
    if (options.replay_advice) {
      if (auto rep = replay_to_oom(snap, r.device, *r.moment.oom_entry, "gpumem", limit)) {
        if (rep->trace_ooms_served > 0) {
          a.advice.push_back(fmt::format(
              "gpumem's default policy (expandable ranges, page recycling) replaying this trace with the same "
              "{} served the {} request: its reserved memory peaks at {} up to that point",
              human_bytes(limit), human_bytes(a.request_bytes), human_bytes(rep->peak_reserved_bytes)));
        } else {
          a.advice.push_back(fmt::format(
              "gpumem's default policy replaying this trace with the same {} also fails the request (peak "
              "requested {}): the live memory itself must shrink",
              human_bytes(limit), human_bytes(rep->peak_requested_bytes)));
        }
      }
    }
    if (a.verdict == "fragmentation") {
      a.advice.push_back(fmt::format("with PyTorch's allocator, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                                     "maps new memory next to old so free pages can merge; the {} free is {} "
                                     "more than the request needs",
                                     human_bytes(f.free_bytes), human_bytes(f.free_bytes - need)));
    }
  }
  if (!f.pinned.empty()) {
    std::uint64_t freed = 0, blocks = 0, held = 0;
    for (const auto& p : f.pinned) {
      freed += p.free_bytes;
      held += p.active_bytes;
      blocks += p.blocks.size();
    }
    a.advice.push_back(fmt::format("{} small live block(s) ({} in all) pin {} segment(s) holding {} free; "
                                   "allocating them earlier or together (or freeing them) would let {} be released",
                                   blocks, human_bytes(held), f.pinned.size(), human_bytes(freed), human_bytes(freed)));
  }
  if (!r.top_sites.empty()) {
    std::uint64_t top3 = 0;
    std::string names;
    for (std::size_t i = 0; i < r.top_sites.size() && i < 3; ++i) {
      top3 += r.top_sites[i].live_bytes;
      names += fmt::format("{}{}", i ? ", " : "", r.top_sites[i].name);
    }
    a.advice.push_back(fmt::format("the {} call site(s) holding the most live memory ({}) hold {}; recomputing "
                                   "those activations (activation checkpointing) would free about that much",
                                   std::min<std::size_t>(3, r.top_sites.size()), names, human_bytes(top3)));
  }
  r.oom = std::move(a);
}

}  // namespace

std::uint64_t rounded_request(std::uint64_t requested_bytes) noexcept {
  if (requested_bytes < 512) return 512;
  return (requested_bytes + 511) / 512 * 512;
}

MemoryReport build_report(const Snapshot& snap, const ReportOptions& options) {
  MemoryReport r;
  r.source = snap.source;
  r.device = pick_device(snap, options);
  static const std::vector<SnapshotTraceEntry> kEmpty;
  const bool has_trace = r.device >= 0 && static_cast<std::size_t>(r.device) < snap.device_traces.size();
  const auto& trace = has_trace ? snap.device_traces[static_cast<std::size_t>(r.device)] : kEmpty;
  r.trace_entries = trace.size();
  r.moment = state_at_moment(snap, r.device);

  FragmentationOptions fo;
  fo.trace = &trace;
  fo.trace_entries = r.moment.moment_entries;
  if (r.moment.oom_entry) {
    fo.moment_us = trace[*r.moment.oom_entry].time_us;
  } else if (!trace.empty()) {
    fo.moment_us = trace.back().time_us;
  }
  r.fragmentation = analyze_fragmentation(r.moment.segments, fo);

  if (r.moment.reconstructed) {
    r.notes.push_back(fmt::format("the file has no segments: they were rebuilt from the trace's {} entries up to "
                                  "the moment (block sizes rounded to 512 B; {} entries could not be applied)",
                                  r.moment.moment_entries, r.moment.skipped_entries));
  }
  if (!r.moment.reconstructed && r.moment.skipped_entries > 0) {
    r.notes.push_back(fmt::format("{} trace entries could not be applied to the file's segments (allocations "
                                  "outside every segment, frees of unknown blocks): the memory numbers below leave "
                                  "them out",
                                  r.moment.skipped_entries));
  }
  if (r.moment.rolled_back_entries > 0) {
    r.notes.push_back(fmt::format("the snapshot was taken after the OOM: {} trace entries recorded after the oom "
                                  "entry were rolled back ({} frees undone) so segments and numbers are those the "
                                  "failed request saw",
                                  r.moment.rolled_back_entries, r.moment.rolled_back_frees));
  }

  // Live memory by op and by call site at the moment.
  std::unordered_map<std::uint64_t, const SnapshotTraceEntry*> last_alloc;
  for (std::size_t i = 0; i < r.moment.moment_entries && i < trace.size(); ++i) {
    if (trace[i].action == TraceAction::alloc) last_alloc[trace[i].addr] = &trace[i];
  }
  std::unordered_map<std::string, LiveGroup> by_op, by_site;
  for (const auto& seg : r.moment.segments) {
    for (const auto& b : seg.blocks) {
      if (b.state != "active_allocated") continue;
      std::string op = b.op, site = call_site(b.frames);
      if (auto it = last_alloc.find(b.address); it != last_alloc.end()) {
        if (op.empty()) op = it->second->op;
        if (site.empty()) site = call_site(it->second->frames);
      }
      if (op.empty()) op = kUnknown;
      if (site.empty()) site = kUnknown;
      auto& g1 = by_op[op];
      g1.name = op;
      g1.live_bytes += b.size_bytes;
      ++g1.blocks;
      auto& g2 = by_site[site];
      g2.name = site;
      g2.live_bytes += b.size_bytes;
      ++g2.blocks;
    }
  }
  r.top_ops = top_groups(by_op, options.top);
  r.top_sites = top_groups(by_site, options.top);

  // Per-op and per-site tables over the whole trace.
  bool any_op = false;
  for (const auto& e : trace) {
    if (!e.op.empty()) { any_op = true; break; }
  }
  OpTableBuilder ops, sites;
  for (const auto& e : trace) {
    if (any_op && snap.gpumem.ops.empty()) ops.add(e.action, e.op, e.addr, e.size_bytes);
    sites.add(e.action, call_site(e.frames), e.addr, e.size_bytes);
  }
  r.op_table = !snap.gpumem.ops.empty() ? snap.gpumem.ops : ops.rows();
  r.site_table = sites.rows();
  if (r.op_table.size() > options.top) r.op_table.resize(options.top);
  if (r.site_table.size() > options.top) r.site_table.resize(options.top);

  if (r.moment.oom_entry) analyze_oom(snap, r, options);
  return r;
}

std::string render_report_text(const MemoryReport& r) {
  std::string s;
  const Fragmentation& f = r.fragmentation;
  s += fmt::format("gpumem report: {} (device {}, {} trace entries)\n", r.source, r.device, r.trace_entries);
  for (const auto& n : r.notes) s += fmt::format("note: {}\n", n);
  if (r.oom) {
    const OomAnalysis& a = *r.oom;
    s += fmt::format("\nOUT OF MEMORY: verdict {}\n", a.verdict);
    s += fmt::format("  request              {} ({} B), rounded {} ({} B)\n", human_bytes(a.request_bytes), a.request_bytes,
                     human_bytes(a.rounded_request_bytes), a.rounded_request_bytes);
    if (!a.site.empty()) s += fmt::format("  requested at         {}\n", a.site);
    if (!a.op.empty()) s += fmt::format("  in op                {}\n", a.op);
    s += fmt::format("  largest free extent  {} ({} B); usable for the request {}\n", human_bytes(f.largest_free_extent_bytes),
                     f.largest_free_extent_bytes, human_bytes(a.largest_usable_extent_bytes));
    s += fmt::format("  allocated            {} ({} B)\n", human_bytes(f.allocated_bytes), f.allocated_bytes);
    s += fmt::format("  reserved             {} ({} B)\n", human_bytes(f.reserved_bytes), f.reserved_bytes);
    s += fmt::format("  reserved-unallocated {} ({} B)\n", human_bytes(f.reserved_unallocated_bytes()),
                     f.reserved_unallocated_bytes());
    s += fmt::format("  cached free          {} in whole free segments, {} in split segments\n",
                     human_bytes(f.cached_free_bytes), human_bytes(f.inactive_split_bytes));
    if (a.device_free_bytes) s += fmt::format("  device free          {}\n", human_bytes(*a.device_free_bytes));
    if (a.device_total_bytes) s += fmt::format("  device total         {}\n", human_bytes(*a.device_total_bytes));
    if (a.outside_bytes) s += fmt::format("  outside the allocator {}\n", human_bytes(*a.outside_bytes));
    s += fmt::format("  cap                  {}\n", a.cap_bytes ? human_bytes(*a.cap_bytes) : std::string("not recorded"));
    s += "  evidence:\n";
    for (const auto& e : a.evidence) s += fmt::format("    - {}\n", e);
    s += "  advice:\n";
    for (const auto& e : a.advice) s += fmt::format("    - {}\n", e);
  }
  s += fmt::format("\nmemory{}: reserved {}, allocated {}, requested {}, {} segments, {} live blocks\n",
                   r.oom ? " at the OOM" : "", human_bytes(f.reserved_bytes), human_bytes(f.allocated_bytes),
                   human_bytes(f.requested_bytes), f.segments, f.live_blocks);
  s += fmt::format("reserved - requested = {}: rounding {}, pending free {}, inactive split {}, cached free {} "
                   "(of the free, {} sits in partly used 2 MiB granules)\n",
                   human_bytes(f.reserved_bytes - f.requested_bytes), human_bytes(f.rounding_bytes),
                   human_bytes(f.pending_free_bytes), human_bytes(f.inactive_split_bytes),
                   human_bytes(f.cached_free_bytes), human_bytes(f.partly_used_granule_bytes));
  s += fmt::format("external fragmentation {:.3f} (largest free extent {} of {} free)\n", f.external_fragmentation,
                   human_bytes(f.largest_free_extent_bytes), human_bytes(f.free_bytes));
  auto groups = [&](const char* title, const std::vector<LiveGroup>& gs) {
    s += fmt::format("\ntop live memory by {}:\n", title);
    for (const auto& g : gs) s += fmt::format("  {:>12}  {:>6} blocks  {}\n", human_bytes(g.live_bytes), g.blocks, g.name);
  };
  groups("op", r.top_ops);
  groups("call site", r.top_sites);
  if (!f.pinned.empty()) {
    s += "\nsegments pinned by a few small live blocks:\n";
    for (const auto& p : f.pinned) {
      s += fmt::format("  segment 0x{:x}: {} of which {} free, held by\n", p.address, human_bytes(p.total_size_bytes),
                       human_bytes(p.free_bytes));
      for (const auto& b : p.blocks) {
        s += fmt::format("    {:>10} at 0x{:x}  op {}  site {}  age {}\n", human_bytes(b.size_bytes), b.address,
                         b.op.empty() ? kUnknown : b.op, b.site.empty() ? kUnknown : b.site,
                         b.age_us ? fmt::format("{:.3f} s", static_cast<double>(*b.age_us) / 1e6) : std::string("?"));
      }
    }
  }
  auto table = [&](const char* title, const std::vector<OpRow>& rows) {
    if (rows.empty()) return;
    s += fmt::format("\n{}:\n  {:>8} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", title, "calls", "allocs",
                     "allocated", "live", "at peak", "grew resv", "frag delta", "name");
    for (const auto& o : rows) {
      s += fmt::format("  {:>8} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", o.calls, o.allocs,
                       human_bytes(o.allocated_bytes), human_bytes(o.live_bytes), human_bytes(o.peak_contribution_bytes),
                       human_bytes(o.reserved_growth_bytes), detail::human_signed(o.frag_delta_bytes),
                       o.name.empty() ? kUnknown : o.name);
    }
  };
  table("per-op table (whole trace)", r.op_table);
  table("per-call-site table (whole trace)", r.site_table);
  return s;
}

std::string render_report_json(const MemoryReport& r) {
  detail::JsonOut j;
  const Fragmentation& f = r.fragmentation;
  j.obj();
  j.key("source").str(r.source);
  j.key("device").num(r.device);
  j.key("trace_entries").num(static_cast<std::uint64_t>(r.trace_entries));
  j.key("oom").boolean(r.oom.has_value());
  j.key("verdict");
  r.oom ? j.str(r.oom->verdict) : j.null();
  if (r.oom) {
    const OomAnalysis& a = *r.oom;
    j.key("request_bytes").num(a.request_bytes);
    j.key("rounded_request_bytes").num(a.rounded_request_bytes);
    j.key("largest_usable_extent_bytes").num(a.largest_usable_extent_bytes);
    j.key("reserved_unallocated_bytes").num(f.reserved_unallocated_bytes());
    j.key("request_site").str(a.site);
    j.key("request_op").str(a.op);
    j.key("device_free_bytes");
    a.device_free_bytes ? j.num(*a.device_free_bytes) : j.null();
    j.key("device_total_bytes");
    a.device_total_bytes ? j.num(*a.device_total_bytes) : j.null();
    j.key("cap_bytes");
    a.cap_bytes ? j.num(*a.cap_bytes) : j.null();
    j.key("outside_bytes");
    a.outside_bytes ? j.num(*a.outside_bytes) : j.null();
    j.key("evidence").arr();
    for (const auto& e : a.evidence) j.str(e);
    j.end_arr();
    j.key("advice").arr();
    for (const auto& e : a.advice) j.str(e);
    j.end_arr();
  }
  j.key("rolled_back_entries").num(static_cast<std::uint64_t>(r.moment.rolled_back_entries));
  j.key("rolled_back_frees").num(static_cast<std::uint64_t>(r.moment.rolled_back_frees));
  j.key("segments_reconstructed").boolean(r.moment.reconstructed);
  j.key("notes").arr();
  for (const auto& n : r.notes) j.str(n);
  j.end_arr();
  j.key("largest_free_extent_bytes").num(f.largest_free_extent_bytes);
  j.key("allocated_bytes").num(f.allocated_bytes);
  j.key("reserved_bytes").num(f.reserved_bytes);
  j.key("requested_bytes").num(f.requested_bytes);
  j.key("fragmentation").obj();
  j.key("reserved_unallocated_bytes").num(f.reserved_unallocated_bytes());
  j.key("rounding_bytes").num(f.rounding_bytes);
  j.key("pending_free_bytes").num(f.pending_free_bytes);
  j.key("inactive_split_bytes").num(f.inactive_split_bytes);
  j.key("cached_free_bytes").num(f.cached_free_bytes);
  j.key("partly_used_granule_bytes").num(f.partly_used_granule_bytes);
  j.key("free_bytes").num(f.free_bytes);
  j.key("external_fragmentation").real(f.external_fragmentation);
  j.key("segments").num(static_cast<std::uint64_t>(f.segments));
  j.key("live_blocks").num(static_cast<std::uint64_t>(f.live_blocks));
  j.end_obj();
  auto groups = [&](const char* key, const std::vector<LiveGroup>& gs) {
    j.key(key).arr();
    for (const auto& g : gs) {
      j.obj().key("name").str(g.name).key("live_bytes").num(g.live_bytes).key("blocks").num(g.blocks).end_obj();
    }
    j.end_arr();
  };
  groups("top_ops", r.top_ops);
  groups("top_sites", r.top_sites);
  j.key("pinned_segments").arr();
  for (const auto& p : f.pinned) {
    j.obj().key("address").num(p.address).key("total_size_bytes").num(p.total_size_bytes);
    j.key("active_bytes").num(p.active_bytes).key("free_bytes").num(p.free_bytes).key("blocks").arr();
    for (const auto& b : p.blocks) {
      j.obj().key("address").num(b.address).key("size_bytes").num(b.size_bytes).key("op").str(b.op);
      j.key("site").str(b.site).key("age_us");
      b.age_us ? j.num(*b.age_us) : j.null();
      j.end_obj();
    }
    j.end_arr().end_obj();
  }
  j.end_arr();
  auto table = [&](const char* key, const std::vector<OpRow>& rows) {
    j.key(key).arr();
    for (const auto& o : rows) {
      j.obj().key("name").str(o.name).key("calls").num(o.calls).key("allocs").num(o.allocs);
      j.key("allocated_bytes").num(o.allocated_bytes).key("live_bytes").num(o.live_bytes);
      j.key("peak_contribution_bytes").num(o.peak_contribution_bytes);
      j.key("reserved_growth_bytes").num(o.reserved_growth_bytes);
      j.key("frag_delta_bytes").num(o.frag_delta_bytes);
      j.key("worst_call_frag_before_bytes").num(o.worst_call_frag_before_bytes);
      j.key("worst_call_frag_after_bytes").num(o.worst_call_frag_after_bytes);
      j.end_obj();
    }
    j.end_arr();
  };
  table("op_table", r.op_table);
  table("site_table", r.site_table);
  j.end_obj();
  return j.take();
}

}  // namespace gpumem::forensics
