#include "gpumem/forensics/replay_report.h"

#include <algorithm>

#include <fmt/format.h>

namespace gpumem::forensics {
namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_double(double v) { return fmt::format("{:.6g}", v); }

std::string percent(double share) {
  if (share <= 0) return "0%";
  if (share < 0.0001) return "<0.01%";
  return fmt::format("{:.2f}%", share * 100.0);
}

std::string duration(double seconds) {
  if (seconds >= 1.0) return fmt::format("{:.2f} s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:.1f} ms", seconds * 1e3);
  return fmt::format("{:.0f} us", seconds * 1e6);
}

// A call site's name in the table, `(not recorded)` when the trace has none.
std::string site_name(const Trace& trace, std::uint32_t site) {
  const std::string& name = trace.sites[site];
  return name.empty() ? std::string(kNotRecorded) : name;
}

}  // namespace

std::string format_table(const ReplayReport& report) {
  const ReplayScript& s = report.script;
  std::string out;
  out += fmt::format("trace {} ({}): {} entries, {} allocs, {} frees, {} skipped entries; {} traced\n",
                     report.trace.source, report.format == TraceFormat::csv ? "csv" : "snapshot", s.entries,
                     s.allocs, s.frees, s.skipped_entries(), duration(static_cast<double>(s.duration_us) * 1e-6));
  if (s.skipped_entries() > 0) {
    out += fmt::format("  skipped: {} frees of addresses the trace never allocated (its ring buffer wrapped), "
                       "{} allocs over a live address\n",
                       s.skipped_frees, s.skipped_allocs);
  }
  if (s.trace_ooms > 0) out += fmt::format("  the trace records {} out-of-memory error(s)\n", s.trace_ooms);
  if (report.measured) {
    const MeasuredPeaks& m = *report.measured;
    out += fmt::format("  PyTorch measured ({}, PYTORCH_CUDA_ALLOC_CONF='{}'): peak allocated {}, peak reserved {}\n",
                       m.json_path, m.alloc_conf, format_bytes(m.peak_allocated_bytes),
                       format_bytes(m.peak_reserved_bytes));
  }
  if (s.trace_reserved_peak_bytes > 0) {
    out += fmt::format("  the trace's own segment entries reach {} reserved\n", format_bytes(s.trace_reserved_peak_bytes));
  }
  out += "\n";

  const auto& ps = report.policies;
  std::size_t width = 14;
  for (const auto& p : ps) width = std::max(width, p.policy.size() + 2);
  auto row = [&](std::string_view label, auto&& cell) {
    out += fmt::format("{:<36}", label);
    for (const auto& p : ps) out += fmt::format("{:>{}}", cell(p), width);
    out += "\n";
  };
  row("", [](const PolicyReplay& p) { return p.policy; });
  row("peak requested", [](const PolicyReplay& p) { return format_bytes(p.peak_requested_bytes); });
  row("peak allocated", [](const PolicyReplay& p) { return format_bytes(p.peak_allocated_bytes); });
  row("peak reserved", [](const PolicyReplay& p) { return format_bytes(p.peak_reserved_bytes); });
  row("peak reserved / peak requested", [](const PolicyReplay& p) { return fmt::format("{:.3f}", p.ratio); });
  out += "at the peak-reserved moment:\n";
  row("  requested (live)", [](const PolicyReplay& p) { return format_bytes(p.at_peak.requested_bytes); });
  row("  + rounding", [](const PolicyReplay& p) { return format_bytes(p.at_peak.rounding_bytes); });
  // The report's terms (vocabulary.h): free bytes of partly used expandable pages are inactive split.
  row("  + inactive split", [](const PolicyReplay& p) {
    return format_bytes(p.at_peak.inactive_split_bytes + p.at_peak.partly_used_granule_bytes);
  });
  row("  + cached free", [](const PolicyReplay& p) { return format_bytes(p.at_peak.cached_free_bytes); });
  row("  = reserved", [](const PolicyReplay& p) { return format_bytes(p.at_peak.reserved_bytes); });
  row("segments (end of trace)", [](const PolicyReplay& p) { return fmt::format("{}", p.counters.segments); });
  row("create calls (cudaMalloc/cuMemCreate)", [](const PolicyReplay& p) { return fmt::format("{}", p.counters.creates); });
  row("map calls", [](const PolicyReplay& p) { return fmt::format("{}", p.counters.maps); });
  row("unmap calls", [](const PolicyReplay& p) { return fmt::format("{}", p.counters.unmaps); });
  row("release calls (cudaFree/cuMemRelease)", [](const PolicyReplay& p) { return fmt::format("{}", p.counters.releases); });
  row("stream syncs for recycling", [](const PolicyReplay& p) { return fmt::format("{}", p.counters.syncs); });
  row("marker waits (their lag)", [](const PolicyReplay& p) {
    return fmt::format("{} ({})", p.counters.marker_waits, duration(static_cast<double>(p.counters.marker_wait_ns) * 1e-9));
  });
  row("their time on an H200", [](const PolicyReplay& p) { return duration(p.call_seconds); });
  row("  share of the run with them", [](const PolicyReplay& p) { return percent(p.call_share); });
  row("retries (freed cache, tried again)", [](const PolicyReplay& p) { return fmt::format("{}", p.counters.alloc_retries); });
  row("failed allocations (OOM)", [](const PolicyReplay& p) { return fmt::format("{}", p.failed_allocations); });
  if (s.trace_ooms > 0) {
    row("trace OOMs it would have served", [&s](const PolicyReplay& p) {
      return fmt::format("{} of {}", p.trace_ooms_served, s.trace_ooms);
    });
  }
  row("replay time", [](const PolicyReplay& p) { return duration(p.replay_seconds); });
  for (const auto& p : ps)
    if (!p.notes.empty()) out += fmt::format("{}: {}\n", p.policy, p.notes);

  bool any_sites = false;
  for (const auto& p : ps) any_sites = any_sites || !p.top_sites.empty();
  if (any_sites) {
    out += "\ntop call sites by live requested bytes at each policy's peak:\n";
    for (const auto& p : ps) {
      const std::int64_t t0 = report.trace.entries.empty() ? 0 : report.trace.entries.front().time_us;
      out += fmt::format("  {} (peak at entry {}, {} into the trace)\n", p.policy,
                         s.steps.empty() ? 0 : s.steps[p.peak_step].entry,
                         duration(static_cast<double>(p.peak_time_us - t0) * 1e-6));
      for (const auto& site : p.top_sites) {
        out += fmt::format("    {:>12}  {:>6} blocks  {}\n", format_bytes(site.live_bytes), site.live_blocks,
                           site_name(report.trace, site.site));
      }
    }
  }

  bool any_groups = false;
  for (const auto& p : ps) any_groups = any_groups || !p.top_call_groups.empty();
  if (any_groups) {
    out += "\nrequests whose calls took the most time (by call site and requested size; a free counts for its "
           "block's request):\n";
    for (const auto& p : ps) {
      if (p.top_call_groups.empty()) {  // no call made, or the groups were not counted for it
        out += p.call_seconds > 0 ? fmt::format("  {}: {} in all, not grouped\n", p.policy, duration(p.call_seconds))
                                  : fmt::format("  {}: no calls\n", p.policy);
        continue;
      }
      out += fmt::format("  {}: {} in all, made by {} group(s)\n", p.policy, duration(p.call_seconds), p.call_groups);
      out += fmt::format("    {:>9} {:>6} {:>9} {:>8} {:>7} {:>7} {:>7} {:>5}  {:>12}  {}\n", "time", "share",
                         "2nd half", "requests", "creates", "maps", "unmaps", "syncs", "size", "call site");
      for (const CallGroup& g : p.top_call_groups) {
        out += fmt::format("    {:>9} {:>6} {:>9} {:>8} {:>7} {:>7} {:>7} {:>5}  {:>12}  {}\n", duration(g.seconds),
                           percent(p.call_seconds > 0 ? g.seconds / p.call_seconds : 0.0),
                           duration(g.second_half_seconds), g.steps, g.calls.creates, g.calls.maps, g.calls.unmaps,
                           g.calls.syncs, format_bytes(g.size_bytes), site_name(report.trace, g.site));
      }
    }
  }
  return out;
}

std::string format_json(const ReplayReport& report) {
  const ReplayScript& s = report.script;
  std::string out = "{";
  out += fmt::format("\"trace\": {}, \"format\": \"{}\", \"entries\": {}, \"allocs\": {}, \"frees\": {}, ",
                     json_string(report.trace.source), report.format == TraceFormat::csv ? "csv" : "snapshot",
                     s.entries, s.allocs, s.frees);
  out += fmt::format("\"skipped_entries\": {}, \"skipped_frees\": {}, \"skipped_allocs\": {}, \"trace_ooms\": {}, ",
                     s.skipped_entries(), s.skipped_frees, s.skipped_allocs, s.trace_ooms);
  out += fmt::format("\"duration_us\": {}, \"peak_requested_bytes\": {}, \"trace_reserved_peak_bytes\": {}, ",
                     s.duration_us, s.peak_requested_bytes, s.trace_reserved_peak_bytes);
  if (report.measured) {
    const MeasuredPeaks& m = *report.measured;
    out += fmt::format("\"measured\": {{\"json\": {}, \"alloc_conf\": {}, \"peak_allocated_bytes\": {}, "
                       "\"peak_reserved_bytes\": {}}}, ",
                       json_string(m.json_path), json_string(m.alloc_conf), m.peak_allocated_bytes,
                       m.peak_reserved_bytes);
  } else {
    out += "\"measured\": null, ";
  }
  out += "\"policies\": [";
  bool first = true;
  for (const PolicyReplay& p : report.policies) {
    if (!first) out += ", ";
    first = false;
    out += fmt::format("{{\"policy\": {}, \"peak_requested_bytes\": {}, \"peak_allocated_bytes\": {}, "
                       "\"peak_reserved_bytes\": {}, \"ratio\": {}, ",
                       json_string(p.policy), p.peak_requested_bytes, p.peak_allocated_bytes,
                       p.peak_reserved_bytes, json_double(p.ratio));
    out += fmt::format("\"segments\": {}, \"maps\": {}, \"unmaps\": {}, \"creates\": {}, \"releases\": {}, "
                       "\"syncs\": {}, \"marker_waits\": {}, \"marker_wait_ns\": {}, \"alloc_retries\": {}, "
                       "\"failed_allocations\": {}, \"trace_ooms_served\": {}, \"segments_at_peak\": {}, ",
                       p.counters.segments, p.counters.maps, p.counters.unmaps, p.counters.creates,
                       p.counters.releases, p.counters.syncs, p.counters.marker_waits, p.counters.marker_wait_ns,
                       p.counters.alloc_retries, p.failed_allocations,
                       p.trace_ooms_served, p.segments_at_peak);
    out += fmt::format("\"peak_entry\": {}, \"peak_time_us\": {}, ",
                       s.steps.empty() ? 0 : s.steps[p.peak_step].entry, p.peak_time_us);
    const WasteBreakdown& w = p.at_peak;
    out += fmt::format("\"at_peak\": {{\"requested_bytes\": {}, \"allocated_bytes\": {}, \"reserved_bytes\": {}, "
                       "\"rounding_bytes\": {}, \"inactive_split_bytes\": {}, \"cached_free_bytes\": {}}}, ",
                       w.requested_bytes, w.allocated_bytes, w.reserved_bytes, w.rounding_bytes,
                       w.inactive_split_bytes + w.partly_used_granule_bytes, w.cached_free_bytes);
    out += fmt::format("\"call_seconds\": {}, \"call_share\": {}, \"replay_seconds\": {}, \"notes\": {}, \"top_sites\": [",
                       json_double(p.call_seconds), json_double(p.call_share), json_double(p.replay_seconds),
                       json_string(p.notes));
    bool first_site = true;
    for (const auto& site : p.top_sites) {
      if (!first_site) out += ", ";
      first_site = false;
      out += fmt::format("{{\"site\": {}, \"live_bytes\": {}, \"live_blocks\": {}}}",
                         json_string(report.trace.sites[site.site]), site.live_bytes, site.live_blocks);
    }
    out += fmt::format("], \"call_groups\": {}, \"top_call_groups\": [", p.call_groups);
    bool first_group = true;
    for (const CallGroup& g : p.top_call_groups) {
      if (!first_group) out += ", ";
      first_group = false;
      out += fmt::format("{{\"site\": {}, \"size_bytes\": {}, \"steps\": {}, \"creates\": {}, \"maps\": {}, "
                         "\"unmaps\": {}, \"releases\": {}, \"syncs\": {}, \"marker_waits\": {}, "
                         "\"seconds\": {}, \"second_half_seconds\": {}}}",
                         json_string(report.trace.sites[g.site]), g.size_bytes, g.steps, g.calls.creates,
                         g.calls.maps, g.calls.unmaps, g.calls.releases, g.calls.syncs, g.calls.marker_waits,
                         json_double(g.seconds), json_double(g.second_half_seconds));
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

void write_timeline_csv(std::ostream& out, const ReplayReport& report) {
  out << "step,entry,time_us,action,requested_bytes";
  for (const auto& p : report.policies) out << ',' << p.policy << ".allocated_bytes," << p.policy << ".reserved_bytes";
  out << '\n';
  std::size_t requested = 0;
  std::string line;
  for (std::size_t i = 0; i < report.script.steps.size(); ++i) {
    const ReplayStep& st = report.script.steps[i];
    if (st.kind == StepKind::alloc) requested += st.size_bytes;
    if (st.kind == StepKind::free) requested -= st.size_bytes;
    line = fmt::format("{},{},{},{},{}", i, st.entry, report.trace.entries[st.entry].time_us,
                       st.kind == StepKind::alloc ? "alloc" : st.kind == StepKind::free ? "free" : "oom", requested);
    for (const auto& p : report.policies) {
      const bool has = i < p.timeline_allocated_bytes.size();
      line += fmt::format(",{},{}", has ? p.timeline_allocated_bytes[i] : 0, has ? p.timeline_reserved_bytes[i] : 0);
    }
    line += '\n';
    out << line;
  }
}

}  // namespace gpumem::forensics
