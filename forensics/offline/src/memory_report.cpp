#include "gpumem/forensics/memory_report.h"

#include <algorithm>
#include <span>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/vocabulary.h"
#include "json_out.h"

namespace gpumem::forensics {
namespace {

int pick_device(const Snapshot& snap, const ReportOptions& options) {
  const std::vector<int> devices = recorded_devices(snap);
  if (options.device) {
    if (std::find(devices.begin(), devices.end(), *options.device) == devices.end()) {
      std::string have;
      for (int d : devices) have += fmt::format("{}{}", have.empty() ? "" : ", ", d);
      throw ForensicsError(fmt::format("{}: the file records nothing for device {} ({}); give --device {}",
                                       snap.source, *options.device,
                                       devices.empty() ? std::string("it records no device at all")
                                                       : fmt::format("it records device{} {}",
                                                                     devices.size() > 1 ? "s" : "", have),
                                       devices.empty() ? 0 : devices.front()));
    }
    return *options.device;
  }
  for (std::size_t d = 0; d < snap.device_traces.size(); ++d) {
    for (const auto& e : snap.device_traces[d]) {
      if (e.action == TraceAction::oom) return static_cast<int>(d);
    }
  }
  return devices.empty() ? 0 : devices.front();
}

bool any_op(const Snapshot& snap, int device) {
  for (const auto& e : trace_entries(snap, device))
    if (!e.op.empty()) return true;
  for (const auto& seg : snap.segments)
    if (seg.device == device)
      for (const auto& b : seg.blocks)
        if (!b.op.empty()) return true;
  return false;
}

std::string or_not_recorded(const std::string& s) { return s.empty() ? std::string(kNotRecorded) : s; }

// "free 692.00 MiB (inactive split 692.00 MiB, cached free 0 B)"
std::string free_split(const Fragmentation& f) {
  return fmt::format("{} {} ({} {}, {} {})", term::free, format_bytes(f.free_bytes), term::inactive_split,
                     format_bytes(f.inactive_split_bytes), term::cached_free, format_bytes(f.cached_free_bytes));
}

std::string pins_advice(const Fragmentation& f) {
  std::uint64_t freed = 0, blocks = 0, held = 0;
  for (const auto& p : f.pinned) {
    freed += p.free_bytes;
    held += p.active_bytes;
    blocks += p.blocks.size();
  }
  return fmt::format("{} small live block(s) ({} in all) pin {} segment(s) holding {} free; allocating them "
                     "earlier or together (or freeing them) would let {} be released",
                     blocks, format_bytes(held), f.pinned.size(), format_bytes(freed), format_bytes(freed));
}

std::string top_sites_advice(const std::vector<GroupRow>& sites) {
  std::uint64_t top3 = 0;
  std::string names;
  std::size_t n = 0;
  for (const auto& g : sites) {
    if (n == 3) break;
    if (g.live_bytes == 0 || g.name == kNotRecorded) continue;
    top3 += g.live_bytes;
    names += fmt::format("{}{}", n ? ", " : "", g.name);
    ++n;
  }
  if (n == 0) return {};
  return fmt::format("the {} call site(s) holding the most live memory ({}) hold {}; recomputing those "
                     "activations (activation checkpointing) or freeing those tensors earlier would free about that",
                     n, names, format_bytes(top3));
}

std::string coverage_text(const ReplayInput& in) {
  if (!in.live_set_known) return in.why_unknown;
  if (in.seeded_blocks == 0) return "the trace holds the allocation of every block live at the moment";
  return fmt::format("{} block(s) ({}) live before the trace's first entry are placed first, so the replay holds "
                     "every block live at the moment",
                     in.seeded_blocks, format_bytes(in.seeded_bytes));
}

void analyze_oom(const Snapshot& snap, MemoryReport& r, const ReportOptions& options) {
  const auto& trace = trace_entries(snap, r.device);
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
  a.largest_usable_extent_bytes = largest_usable_extent(r.state.segments, a.stream, a.rounded_request_bytes);
  a.replay_limit_bytes = oom_replay_limit(snap, r.device).value_or(f.reserved_bytes);
  const std::uint64_t need = a.rounded_request_bytes;

  a.evidence.push_back(fmt::format("requested {}, rounded to {}", format_bytes(a.request_bytes), format_bytes(need)));
  a.evidence.push_back(fmt::format("{} {}, {} {}, {} {}; {}", term::reserved, format_bytes(f.reserved_bytes),
                                   term::allocated, format_bytes(f.allocated_bytes), term::reserved_unallocated,
                                   format_bytes(f.reserved_unallocated_bytes()), free_split(f)));
  a.evidence.push_back(fmt::format("{} {}; on the request's stream and pool {}", term::largest_free_extent,
                                   format_bytes(f.largest_free_extent_bytes),
                                   format_bytes(a.largest_usable_extent_bytes)));

  // The request can use only the default pool: a private pool's free memory (a CUDA graph's, a
  // MemPool's) serves only its own allocations, so the verdict's free totals leave it out.
  Fragmentation default_pool;
  const bool has_private = std::any_of(r.state.segments.begin(), r.state.segments.end(), [](const SnapshotSegment& s) {
    return s.pool_id != std::pair<std::int64_t, std::int64_t>{0, 0};
  });
  if (has_private) {
    std::vector<SnapshotSegment> shared;
    for (const auto& seg : r.state.segments)
      if (seg.pool_id == std::pair<std::int64_t, std::int64_t>{0, 0}) shared.push_back(seg);
    default_pool = analyze_fragmentation(shared);
    const std::uint64_t all_free = f.free_bytes + f.pending_free_bytes;
    const std::uint64_t pool_free = default_pool.free_bytes + default_pool.pending_free_bytes;
    a.evidence.push_back(fmt::format("{} of {} and {} memory is in private pools (CUDA graphs, MemPool), which "
                                     "serve only their own allocations; the verdict leaves it out",
                                     format_bytes(all_free > pool_free ? all_free - pool_free : 0), term::free,
                                     term::pending_free));
  }
  const Fragmentation& u = has_private ? default_pool : f;

  if (a.largest_usable_extent_bytes < need && u.pending_free_bytes > 0 && u.free_bytes + u.pending_free_bytes >= need &&
      u.free_bytes < need) {
    a.verdict = "pending_frees";
    a.evidence.push_back(fmt::format("{} is {} (freed, still in use on other streams); with it, {} {} would hold "
                                     "the request",
                                     format_bytes(u.pending_free_bytes), term::pending_free,
                                     format_bytes(u.free_bytes + u.pending_free_bytes), term::free));
    a.advice.push_back("synchronize the streams that use the freed tensors (or drop record_stream calls) before "
                       "the large allocation, so their blocks return to the cache");
  } else if (a.largest_usable_extent_bytes < need && u.free_bytes >= need) {
    a.verdict = "fragmentation";
    a.evidence.push_back(fmt::format("{} is {}, {:.1f}x the request, but in pieces: the largest usable one is {} "
                                     "short of the request ({} {:.3f})",
                                     format_bytes(u.free_bytes), term::free,
                                     static_cast<double>(u.free_bytes) / static_cast<double>(need),
                                     format_bytes(need - a.largest_usable_extent_bytes), term::external_fragmentation,
                                     u.external_fragmentation));
  } else if (a.outside_bytes && *a.outside_bytes >= need && (!a.cap_bytes || f.reserved_bytes + need <= *a.cap_bytes)) {
    a.verdict = "outside_memory";
    a.evidence.push_back(fmt::format("{} of the device is held outside the allocator (total {} - device free {} - "
                                     "{} {})",
                                     format_bytes(*a.outside_bytes), format_bytes(*a.device_total_bytes),
                                     format_bytes(*a.device_free_bytes), term::reserved, format_bytes(f.reserved_bytes)));
    a.advice.push_back("find what else holds device memory (other processes in nvidia-smi, other allocators "
                       "such as cuBLAS workspaces or NCCL buffers, cudaMalloc calls outside torch)");
  } else {
    a.verdict = "capacity";
    const std::uint64_t want = f.allocated_bytes + f.pending_free_bytes + need;
    if (a.cap_bytes) {
      a.evidence.push_back(fmt::format("{} {} + {} {} + the request {} = {}, more than the cap {} by {}",
                                       term::allocated, format_bytes(f.allocated_bytes), term::pending_free,
                                       format_bytes(f.pending_free_bytes), format_bytes(need), format_bytes(want),
                                       format_bytes(*a.cap_bytes),
                                       format_bytes(want > *a.cap_bytes ? want - *a.cap_bytes : 0)));
    } else if (a.device_free_bytes && *a.device_free_bytes < need) {
      a.evidence.push_back(fmt::format("the device had {} free, less than the request; the allocator held {}",
                                       format_bytes(*a.device_free_bytes), free_split(f)));
    } else {
      a.evidence.push_back(fmt::format("{} {} + {} {} + the request {} = {}, more than the {} it could reserve (a cap "
                                       "the file does not record: set_per_process_memory_fraction or a limit)",
                                       term::allocated, format_bytes(f.allocated_bytes), term::pending_free,
                                       format_bytes(f.pending_free_bytes), format_bytes(need), format_bytes(want),
                                       format_bytes(a.replay_limit_bytes)));
    }
    a.advice.push_back("the live memory itself must shrink: no allocator policy can serve this request within this "
                       "memory, so gpumem replays no trace for it");
  }

  // Advice that follows from the verdict.
  if ((a.verdict == "fragmentation" || a.verdict == "pending_frees") && options.replay && r.replay_coverage) {
    const ReplayInput& in = *r.replay_coverage;
    if (!in.live_set_known) {
      a.advice.push_back(fmt::format("no replay under gpumem's policy: {}", in.why_unknown));
    } else if (auto rep = replay_to_moment(in, "gpumem", a.replay_limit_bytes)) {
      if (rep->oom_served) {
        a.advice.push_back(fmt::format("gpumem's default policy (expandable segments, page recycling) replaying "
                                       "this trace with the same {} served the {} request; it reserves {} at that "
                                       "point ({})",
                                       format_bytes(a.replay_limit_bytes), format_bytes(a.request_bytes),
                                       format_bytes(rep->reserved_at_moment_bytes), coverage_text(in)));
      } else {
        a.advice.push_back(fmt::format("gpumem's default policy replaying this trace with the same {} also fails "
                                       "the request ({}): the live memory itself must shrink",
                                       format_bytes(a.replay_limit_bytes), coverage_text(in)));
      }
    }
  }
  if (a.verdict == "fragmentation" && !snap.expandable_segments) {
    a.advice.push_back(fmt::format("with PyTorch's allocator, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                                   "maps new memory next to old so free pages can merge; the {} {} is {} more than "
                                   "the request needs",
                                   format_bytes(u.free_bytes), term::free, format_bytes(u.free_bytes - need)));
  }
  if ((a.verdict == "fragmentation" || a.verdict == "pending_frees") && !f.pinned.empty()) {
    a.advice.push_back(pins_advice(f));
  }
  if (a.verdict == "fragmentation" || a.verdict == "capacity") {
    if (std::string s = top_sites_advice(r.sites); !s.empty()) a.advice.push_back(s);
  }
  r.oom = std::move(a);
}

void analyze_moment(MemoryReport& r, const ReportOptions& options) {
  const Fragmentation& f = r.fragmentation;
  FragmentationVerdict v;
  const std::uint64_t over = f.reserved_bytes > f.requested_bytes ? f.reserved_bytes - f.requested_bytes : 0;
  struct Part {
    std::string_view name;
    std::uint64_t bytes;
    const char* verdict;
  };
  const Part parts[] = {{term::inactive_split, f.inactive_split_bytes, "fragmentation"},
                        {term::cached_free, f.cached_free_bytes, "caching"},
                        {term::rounding, f.rounding_bytes, "rounding"},
                        {term::pending_free, f.pending_free_bytes, "pending_frees"}};
  const Part* top = &parts[0];
  for (const Part& p : parts)
    if (p.bytes > top->bytes) top = &p;
  if (f.reserved_bytes == 0) {
    v.verdict = "empty";
    v.evidence.push_back("nothing is reserved at this moment");
  } else {
    v.verdict = f.reserved_bytes * 10 <= f.requested_bytes * 11 ? "compact" : top->verdict;
    v.evidence.push_back(fmt::format("{} {} is {:.2f}x {} {} ({} {})", term::reserved, format_bytes(f.reserved_bytes),
                                     f.requested_bytes ? static_cast<double>(f.reserved_bytes) /
                                                             static_cast<double>(f.requested_bytes)
                                                       : 0.0,
                                     term::requested, format_bytes(f.requested_bytes), term::allocated,
                                     format_bytes(f.allocated_bytes)));
    std::string split = fmt::format("of the {} above {}:", format_bytes(over), term::requested);
    for (std::size_t i = 0; i < std::size(parts); ++i) {
      split += fmt::format("{} {} {} ({})", i ? "," : "", parts[i].name, format_bytes(parts[i].bytes),
                           format_share(parts[i].bytes, over));
    }
    v.evidence.push_back(split);
    v.evidence.push_back(fmt::format("{} {} of {} {} ({} {:.3f})", term::largest_free_extent,
                                     format_bytes(f.largest_free_extent_bytes), format_bytes(f.free_bytes), term::free,
                                     term::external_fragmentation, f.external_fragmentation));
  }
  if (options.replay && r.replay_coverage && f.reserved_bytes > 0) {
    const ReplayInput& in = *r.replay_coverage;
    if (!in.live_set_known) {
      v.evidence.push_back(fmt::format("no replay: {}", in.why_unknown));
    } else {
      for (const char* policy : {"pytorch", "pytorch:expandable", "gpumem"}) {
        if (auto rep = replay_to_moment(in, policy, SIZE_MAX)) v.replays.push_back(*rep);
      }
    }
  }
  auto replay_of = [&](std::string_view name) -> const MomentReplay* {
    for (const auto& rep : v.replays)
      if (rep.policy == name) return &rep;
    return nullptr;
  };
  const MomentReplay* expandable = replay_of("pytorch:expandable");
  const MomentReplay* gpumem = replay_of("gpumem");
  if (v.verdict == "fragmentation") {
    if (expandable && gpumem) {
      v.advice.push_back(fmt::format("the same allocations would reserve {} here with PyTorch's "
                                     "expandable_segments:True and {} with gpumem (replays), against {} reserved",
                                     format_bytes(expandable->reserved_at_moment_bytes),
                                     format_bytes(gpumem->reserved_at_moment_bytes), format_bytes(f.reserved_bytes)));
    } else if (!r.state.segments.empty() && !r.state.segments.front().is_expandable) {
      v.advice.push_back("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps new memory next to old so that "
                         "free pages can merge");
    }
    if (!f.pinned.empty()) v.advice.push_back(pins_advice(f));
  } else if (v.verdict == "caching") {
    v.advice.push_back(fmt::format("the {} {} could be returned to the device as it is (torch.cuda.empty_cache(), or "
                                   "garbage_collection_threshold to release it under pressure); it only costs "
                                   "memory other processes could use",
                                   format_bytes(f.cached_free_bytes), term::cached_free));
  } else if (v.verdict == "rounding") {
    v.advice.push_back(fmt::format("{} is lost to {}: requests are rounded up to block sizes (512 B, and by "
                                   "roundup_power2_divisions when it is set); many requests just above a rounding "
                                   "step cost the most",
                                   format_bytes(f.rounding_bytes), term::rounding));
  } else if (v.verdict == "pending_frees") {
    v.advice.push_back("synchronize the streams that use freed tensors (or drop record_stream calls) so that their "
                       "blocks return to the cache sooner");
  }
  r.at_moment = std::move(v);
}

std::vector<PoolTotals> pool_totals(const std::vector<SnapshotSegment>& segments) {
  std::vector<PoolTotals> pools{PoolTotals{}};  // the default pool, even when empty
  for (const auto& seg : segments) {
    auto it = std::find_if(pools.begin(), pools.end(), [&](const PoolTotals& p) { return p.pool_id == seg.pool_id; });
    if (it == pools.end()) it = pools.insert(pools.end(), PoolTotals{seg.pool_id});
    ++it->segments;
    it->reserved_bytes += seg.total_size_bytes;
    it->allocated_bytes += seg.allocated_size_bytes;
    it->requested_bytes += seg.requested_size_bytes;
  }
  std::sort(pools.begin() + 1, pools.end(),
            [](const PoolTotals& a, const PoolTotals& b) { return a.pool_id < b.pool_id; });
  return pools;
}

}  // namespace

std::string pool_label(std::pair<std::int64_t, std::int64_t> pool_id) {
  if (pool_id == std::pair<std::int64_t, std::int64_t>{0, 0}) return "default pool";
  return fmt::format("private pool ({}, {})", pool_id.first, pool_id.second);
}

const std::string& MemoryReport::verdict() const {
  static const std::string kNone;
  if (oom) return oom->verdict;
  if (at_moment) return at_moment->verdict;
  return kNone;
}

std::uint64_t rounded_request(std::uint64_t requested_bytes) noexcept {
  if (requested_bytes < 512) return 512;
  return (requested_bytes + 511) / 512 * 512;
}

std::vector<int> recorded_devices(const Snapshot& snap) {
  std::vector<int> out;
  for (std::size_t d = 0; d < snap.device_traces.size(); ++d)
    if (!snap.device_traces[d].empty()) out.push_back(static_cast<int>(d));
  if (!snap.host_trace.empty()) out.push_back(kPinnedHostDevice);
  for (const auto& seg : snap.segments)
    if (std::find(out.begin(), out.end(), seg.device) == out.end()) out.push_back(seg.device);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::uint64_t> oom_replay_limit(const Snapshot& snap, int device) {
  const auto& trace = trace_entries(snap, device);
  bool has_oom = false;
  for (const auto& e : trace) has_oom |= e.action == TraceAction::oom;
  if (!has_oom) return std::nullopt;
  if (snap.gpumem.cap_bytes) return snap.gpumem.cap_bytes;
  const Moment m = resolve_moment(snap, device, MomentSpec{MomentSpec::Kind::oom});
  const StateAtMoment state = state_at_moment(snap, device, m);
  std::uint64_t reserved = 0;
  for (const auto& seg : state.segments) reserved += seg.total_size_bytes;
  const auto& oom = trace[*m.oom_entry];
  std::optional<std::uint64_t> device_free = oom.device_free_bytes;
  if (!device_free && snap.gpumem.device_free_bytes) device_free = snap.gpumem.device_free_bytes;
  if (device_free && *device_free < rounded_request(oom.size_bytes)) return reserved + *device_free;
  return reserved;
}

MemoryReport build_report(const Snapshot& snap, const ReportOptions& options) {
  MemoryReport r;
  r.source = snap.source;
  r.device = pick_device(snap, options);
  const auto& trace = trace_entries(snap, r.device);
  r.trace_entries = trace.size();
  r.top = options.top;
  r.moment = resolve_moment(snap, r.device, options.at);
  r.state = state_at_moment(snap, r.device, r.moment);

  FragmentationOptions fo;
  fo.trace = &trace;
  fo.trace_entries = r.moment.applied;
  if (!trace.empty()) fo.moment_us = r.moment.time_us;
  r.fragmentation = analyze_fragmentation(r.state.segments, fo);
  r.pools = pool_totals(r.state.segments);

  if (r.state.reconstructed) {
    r.notes.push_back(fmt::format("the file has no segments: they were rebuilt from the trace's {} entries up to "
                                  "the moment (block sizes rounded to 512 B; {} entries could not be applied)",
                                  r.state.moment_entries, r.state.skipped_entries));
  }
  if (!r.state.reconstructed && r.state.skipped_entries > 0) {
    r.notes.push_back(fmt::format("{} trace entries could not be applied to the file's segments (allocations "
                                  "outside every segment, frees of unknown blocks): the memory numbers below leave "
                                  "them out",
                                  r.state.skipped_entries));
  }
  if (r.state.rolled_back_entries > 0) {
    r.notes.push_back(fmt::format("the file's segments are from after the moment: the {} trace entries recorded "
                                  "after it were undone ({} frees) so that segments and numbers are those of the "
                                  "moment",
                                  r.state.rolled_back_entries, r.state.rolled_back_frees));
  }

  std::vector<GroupRow> ops, sites = group_table(r.state.segments, trace, r.moment.applied, GroupBy::call_site);
  if (any_op(snap, r.device)) {
    ops = group_table(r.state.segments, trace, r.moment.applied, GroupBy::op);
  } else {
    r.notes.push_back("the file records no ops (gpumem records them with record_ops:True)");
  }
  if (ops.size() > options.top) ops.resize(options.top);
  if (sites.size() > options.top) sites.resize(options.top);
  r.ops = std::move(ops);
  r.sites = std::move(sites);

  if (options.replay && !trace.empty()) r.replay_coverage = replay_input(snap, r.device, r.moment, r.state);
  if (r.moment.oom_entry) {
    analyze_oom(snap, r, options);
  } else {
    analyze_moment(r, options);
  }
  return r;
}

std::string render_report_text(const MemoryReport& r) {
  std::string s;
  const Fragmentation& f = r.fragmentation;
  s += fmt::format("gpumem report: {} ({}, {} trace entries)\n", r.source, device_label(r.device), r.trace_entries);
  for (const auto& n : r.notes) s += fmt::format("note: {}\n", n);
  if (r.trace_entries > 0) s += fmt::format("moment: {}\n", r.moment.describe());
  auto list = [&](const char* title, const std::vector<std::string>& items) {
    if (items.empty()) return;
    s += fmt::format("  {}:\n", title);
    for (const auto& e : items) s += fmt::format("    - {}\n", e);
  };
  if (r.oom) {
    const OomAnalysis& a = *r.oom;
    s += fmt::format("\nOUT OF MEMORY: verdict {}\n", a.verdict);
    s += fmt::format("  request              {} ({} B), rounded {}\n", format_bytes(a.request_bytes), a.request_bytes,
                     format_bytes(a.rounded_request_bytes));
    s += fmt::format("  requested at         {}\n", or_not_recorded(a.site));
    s += fmt::format("  in op                {}\n", or_not_recorded(a.op));
    s += fmt::format("  {:<20} {}; usable for the request {}\n", term::largest_free_extent,
                     format_bytes(f.largest_free_extent_bytes), format_bytes(a.largest_usable_extent_bytes));
    if (a.device_free_bytes) s += fmt::format("  device free          {}\n", format_bytes(*a.device_free_bytes));
    if (a.device_total_bytes) s += fmt::format("  device total         {}\n", format_bytes(*a.device_total_bytes));
    if (a.outside_bytes) s += fmt::format("  outside the allocator {}\n", format_bytes(*a.outside_bytes));
    s += fmt::format("  cap                  {}\n", a.cap_bytes ? format_bytes(*a.cap_bytes) : std::string(kNotRecorded));
    list("evidence", a.evidence);
    list("advice", a.advice);
  } else if (r.at_moment) {
    const FragmentationVerdict& v = *r.at_moment;
    s += fmt::format("\nMEMORY AT THE MOMENT: verdict {}\n", v.verdict);
    list("evidence", v.evidence);
    if (!v.replays.empty()) {
      s += "  the same allocations replayed to this moment (reserved here / peak up to here):\n";
      s += fmt::format("    {:<20} {:>12}   (the file)\n", "this run", format_bytes(f.reserved_bytes));
      for (const auto& rep : v.replays) {
        s += fmt::format("    {:<20} {:>12} / {}\n", rep.policy, format_bytes(rep.reserved_at_moment_bytes),
                         format_bytes(rep.peak_reserved_bytes));
      }
      s += fmt::format("    ({})\n", coverage_text(*r.replay_coverage));
    }
    list("advice", v.advice);
  }
  s += fmt::format("\nmemory{}: {} segments, {} live blocks\n", r.oom ? " at the OOM" : " at the moment", f.segments,
                   f.live_blocks);
  s += fmt::format("  {} {} = {} {} + {} {} + {} {} + {} {} + {} {}\n", term::reserved, format_bytes(f.reserved_bytes),
                   term::requested, format_bytes(f.requested_bytes), term::rounding, format_bytes(f.rounding_bytes),
                   term::pending_free, format_bytes(f.pending_free_bytes), term::inactive_split,
                   format_bytes(f.inactive_split_bytes), term::cached_free, format_bytes(f.cached_free_bytes));
  s += fmt::format("  {} {}, {} {}\n", term::allocated, format_bytes(f.allocated_bytes), term::reserved_unallocated,
                   format_bytes(f.reserved_unallocated_bytes()));
  s += fmt::format("  {} {} of {} {} ({} {:.3f})\n", term::largest_free_extent, format_bytes(f.largest_free_extent_bytes),
                   format_bytes(f.free_bytes), term::free, term::external_fragmentation, f.external_fragmentation);
  if (r.pools.size() > 1) {
    s += "\nmemory by pool (a private pool's memory serves only its CUDA graphs or MemPool):\n";
    s += fmt::format("  {:<28} {:>8} {:>12} {:>12} {:>20}\n", "pool", "segments", term::reserved, term::allocated,
                     term::reserved_unallocated);
    for (const auto& p : r.pools) {
      s += fmt::format("  {:<28} {:>8} {:>12} {:>12} {:>20}\n", pool_label(p.pool_id), p.segments,
                       format_bytes(p.reserved_bytes), format_bytes(p.allocated_bytes),
                       format_bytes(p.reserved_bytes - std::min(p.reserved_bytes, p.allocated_bytes)));
    }
  }
  if (!f.pinned.empty()) {
    s += f.pinned.size() > r.top
             ? fmt::format("\nsegments pinned by a few small live blocks ({} of {}):\n", r.top, f.pinned.size())
             : std::string("\nsegments pinned by a few small live blocks:\n");
    for (const auto& p : std::span(f.pinned).first(std::min(r.top, f.pinned.size()))) {
      s += fmt::format("  segment 0x{:x}: {} of which {} free, held by\n", p.address, format_bytes(p.total_size_bytes),
                       format_bytes(p.free_bytes));
      for (const auto& b : p.blocks) {
        s += fmt::format("    {:>10} at 0x{:x}  op {}  site {}  age {}\n", format_bytes(b.size_bytes), b.address,
                         or_not_recorded(b.op), or_not_recorded(b.site),
                         b.age_us ? fmt::format("{:.3f} s", static_cast<double>(*b.age_us) / 1e6) : std::string("?"));
      }
    }
  }
  auto table = [&](const char* title, const std::vector<GroupRow>& rows) {
    if (rows.empty()) return;
    s += fmt::format("\n{} at the moment (trace columns: up to the moment):\n", title);
    s += fmt::format("  {:>12} {:>7} {:>7} {:>12} {:>12} {:>12}  {}\n", "live", "blocks", "allocs", "alloc bytes",
                     "grew resv", "resv-unalloc", "name");
    for (const auto& g : rows) {
      s += fmt::format("  {:>12} {:>7} {:>7} {:>12} {:>12} {:>12}  {}\n", format_bytes(g.live_bytes), g.live_blocks,
                       g.trace_allocs, format_bytes(g.trace_alloc_bytes), format_bytes(g.reserved_growth_bytes),
                       format_bytes(g.reserved_unallocated_bytes), g.name);
    }
  };
  table("memory by op", r.ops);
  table("memory by call site", r.sites);
  if (!r.ops.empty() || !r.sites.empty()) {
    s += "  live: allocated bytes of live blocks; allocs, alloc bytes: allocations and their requested bytes;\n"
         "  grew resv: memory its requests reserved; resv-unalloc: reserved-unallocated bytes now in that memory\n";
  }
  return s;
}

std::string render_report_json(const MemoryReport& r) {
  detail::JsonOut j;
  const Fragmentation& f = r.fragmentation;
  j.obj();
  j.key("source").str(r.source);
  j.key("device").num(r.device);
  j.key("trace_entries").num(static_cast<std::uint64_t>(r.trace_entries));
  j.key("moment").obj();
  j.key("kind").str(r.moment.kind_name());
  j.key("entries_applied").num(static_cast<std::uint64_t>(r.moment.applied));
  j.key("oom_entry");
  r.moment.oom_entry ? j.num(static_cast<std::uint64_t>(*r.moment.oom_entry)) : j.null();
  j.key("time_us").num(r.moment.time_us);
  j.key("elapsed_us").num(r.moment.elapsed_us);
  j.key("description").str(r.moment.describe());
  j.end_obj();
  j.key("oom").boolean(r.oom.has_value());
  j.key("verdict").str(r.verdict());
  auto strings = [&](const char* key, const std::vector<std::string>& v) {
    j.key(key).arr();
    for (const auto& e : v) j.str(e);
    j.end_arr();
  };
  if (r.oom) {
    const OomAnalysis& a = *r.oom;
    j.key("request_bytes").num(a.request_bytes);
    j.key("rounded_request_bytes").num(a.rounded_request_bytes);
    j.key("largest_usable_extent_bytes").num(a.largest_usable_extent_bytes);
    j.key("request_site").str(or_not_recorded(a.site));
    j.key("request_op").str(or_not_recorded(a.op));
    j.key("device_free_bytes");
    a.device_free_bytes ? j.num(*a.device_free_bytes) : j.null();
    j.key("device_total_bytes");
    a.device_total_bytes ? j.num(*a.device_total_bytes) : j.null();
    j.key("cap_bytes");
    a.cap_bytes ? j.num(*a.cap_bytes) : j.null();
    j.key("outside_bytes");
    a.outside_bytes ? j.num(*a.outside_bytes) : j.null();
    j.key("replay_limit_bytes").num(a.replay_limit_bytes);
    strings("evidence", a.evidence);
    strings("advice", a.advice);
  } else if (r.at_moment) {
    strings("evidence", r.at_moment->evidence);
    strings("advice", r.at_moment->advice);
    j.key("replays").arr();
    for (const auto& rep : r.at_moment->replays) {
      j.obj().key("policy").str(rep.policy).key("reserved_at_moment_bytes").num(rep.reserved_at_moment_bytes);
      j.key("peak_reserved_bytes").num(rep.peak_reserved_bytes).end_obj();
    }
    j.end_arr();
  }
  j.key("replay_coverage");
  if (r.replay_coverage) {
    j.obj().key("live_set_known").boolean(r.replay_coverage->live_set_known);
    j.key("seeded_blocks").num(static_cast<std::uint64_t>(r.replay_coverage->seeded_blocks));
    j.key("seeded_bytes").num(r.replay_coverage->seeded_bytes);
    j.key("orphan_frees").num(static_cast<std::uint64_t>(r.replay_coverage->orphan_frees));
    j.key("text").str(coverage_text(*r.replay_coverage)).end_obj();
  } else {
    j.null();
  }
  j.key("rolled_back_entries").num(static_cast<std::uint64_t>(r.state.rolled_back_entries));
  j.key("rolled_back_frees").num(static_cast<std::uint64_t>(r.state.rolled_back_frees));
  j.key("segments_reconstructed").boolean(r.state.reconstructed);
  strings("notes", r.notes);
  j.key("largest_free_extent_bytes").num(f.largest_free_extent_bytes);
  j.key("allocated_bytes").num(f.allocated_bytes);
  j.key("reserved_bytes").num(f.reserved_bytes);
  j.key("requested_bytes").num(f.requested_bytes);
  j.key("reserved_unallocated_bytes").num(f.reserved_unallocated_bytes());
  j.key("fragmentation").obj();
  j.key("reserved_unallocated_bytes").num(f.reserved_unallocated_bytes());
  j.key("rounding_bytes").num(f.rounding_bytes);
  j.key("pending_free_bytes").num(f.pending_free_bytes);
  j.key("free_bytes").num(f.free_bytes);
  j.key("inactive_split_bytes").num(f.inactive_split_bytes);
  j.key("cached_free_bytes").num(f.cached_free_bytes);
  j.key("external_fragmentation").real(f.external_fragmentation);
  j.key("segments").num(static_cast<std::uint64_t>(f.segments));
  j.key("live_blocks").num(static_cast<std::uint64_t>(f.live_blocks));
  j.end_obj();
  auto tops = [&](const char* key, const std::vector<GroupRow>& rows) {
    j.key(key).arr();
    for (const auto& g : rows) {
      if (g.live_bytes == 0) continue;
      j.obj().key("name").str(g.name).key("live_bytes").num(g.live_bytes).key("blocks").num(g.live_blocks).end_obj();
    }
    j.end_arr();
  };
  tops("top_ops", r.ops);
  tops("top_sites", r.sites);
  j.key("pools").arr();
  for (const auto& p : r.pools) {
    j.obj().key("pool_id").arr().num(p.pool_id.first).num(p.pool_id.second).end_arr();
    j.key("label").str(pool_label(p.pool_id));
    j.key("segments").num(static_cast<std::uint64_t>(p.segments)).key("reserved_bytes").num(p.reserved_bytes);
    j.key("allocated_bytes").num(p.allocated_bytes).key("requested_bytes").num(p.requested_bytes).end_obj();
  }
  j.end_arr();
  j.key("pinned_segments_count").num(static_cast<std::uint64_t>(f.pinned.size()));
  j.key("pinned_segments").arr();
  for (const auto& p : std::span(f.pinned).first(std::min(r.top, f.pinned.size()))) {
    j.obj().key("address").num(p.address).key("total_size_bytes").num(p.total_size_bytes);
    j.key("active_bytes").num(p.active_bytes).key("free_bytes").num(p.free_bytes).key("blocks").arr();
    for (const auto& b : p.blocks) {
      j.obj().key("address").num(b.address).key("size_bytes").num(b.size_bytes).key("op").str(or_not_recorded(b.op));
      j.key("site").str(or_not_recorded(b.site)).key("age_us");
      b.age_us ? j.num(*b.age_us) : j.null();
      j.end_obj();
    }
    j.end_arr().end_obj();
  }
  j.end_arr();
  auto table = [&](const char* key, const std::vector<GroupRow>& rows) {
    j.key(key).arr();
    for (const auto& g : rows) {
      j.obj().key("name").str(g.name).key("live_bytes").num(g.live_bytes).key("live_blocks").num(g.live_blocks);
      j.key("trace_allocs").num(g.trace_allocs).key("trace_alloc_bytes").num(g.trace_alloc_bytes);
      j.key("reserved_growth_bytes").num(g.reserved_growth_bytes);
      j.key("reserved_unallocated_bytes").num(g.reserved_unallocated_bytes);
      j.end_obj();
    }
    j.end_arr();
  };
  table("op_table", r.ops);
  table("site_table", r.sites);
  j.end_obj();
  return j.take();
}

}  // namespace gpumem::forensics
