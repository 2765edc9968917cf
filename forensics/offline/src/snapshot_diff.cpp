#include "gpumem/forensics/snapshot_diff.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include <fmt/format.h>

#include "gpumem/forensics/memory_report.h"
#include "json_out.h"

namespace gpumem::forensics {
namespace {

using detail::human_bytes;
using detail::human_signed;

std::vector<GroupDelta> diff_groups(const std::vector<LiveGroup>& a, const std::vector<LiveGroup>& b, std::size_t top) {
  std::map<std::string, GroupDelta> m;
  for (const auto& g : a) {
    m[g.name].name = g.name;
    m[g.name].a_bytes = g.live_bytes;
  }
  for (const auto& g : b) {
    m[g.name].name = g.name;
    m[g.name].b_bytes = g.live_bytes;
  }
  std::vector<GroupDelta> out;
  for (auto& [k, d] : m) {
    if (d.delta_bytes() != 0) out.push_back(d);
  }
  std::stable_sort(out.begin(), out.end(), [](const GroupDelta& x, const GroupDelta& y) {
    return std::llabs(x.delta_bytes()) > std::llabs(y.delta_bytes());
  });
  if (out.size() > top) out.resize(top);
  return out;
}

std::vector<SegmentRef> missing_from(const std::vector<SnapshotSegment>& from, const std::vector<SnapshotSegment>& in) {
  std::set<std::pair<std::uint64_t, std::uint64_t>> have;
  for (const auto& s : in) have.emplace(s.address, s.total_size_bytes);
  std::vector<SegmentRef> out;
  for (const auto& s : from) {
    if (!have.count({s.address, s.total_size_bytes})) out.push_back({s.address, s.total_size_bytes, s.segment_type});
  }
  return out;
}

}  // namespace

SnapshotDiff diff_snapshots(const Snapshot& a, const Snapshot& b, std::size_t top) {
  ReportOptions options;
  options.top = SIZE_MAX;
  options.replay_advice = false;
  const MemoryReport ra = build_report(a, options);
  const MemoryReport rb = build_report(b, options);
  SnapshotDiff d;
  d.a_source = a.source;
  d.b_source = b.source;
  d.ops = diff_groups(ra.top_ops, rb.top_ops, top);
  d.sites = diff_groups(ra.top_sites, rb.top_sites, top);
  d.segments_added = missing_from(rb.moment.segments, ra.moment.segments);
  d.segments_removed = missing_from(ra.moment.segments, rb.moment.segments);
  d.a = ra.fragmentation;
  d.b = rb.fragmentation;
  return d;
}

std::string render_diff_text(const SnapshotDiff& d) {
  std::string s = fmt::format("gpumem diff\n  A: {}\n  B: {}\n", d.a_source, d.b_source);
  auto row = [&](const char* name, std::uint64_t a, std::uint64_t b) {
    s += fmt::format("  {:<28} {:>12} -> {:>12}  ({})\n", name, human_bytes(a), human_bytes(b),
                     human_signed(static_cast<std::int64_t>(b) - static_cast<std::int64_t>(a)));
  };
  s += "\nmemory:\n";
  row("reserved", d.a.reserved_bytes, d.b.reserved_bytes);
  row("allocated", d.a.allocated_bytes, d.b.allocated_bytes);
  row("reserved-unallocated", d.a.reserved_unallocated_bytes(), d.b.reserved_unallocated_bytes());
  row("inactive split", d.a.inactive_split_bytes, d.b.inactive_split_bytes);
  row("cached free", d.a.cached_free_bytes, d.b.cached_free_bytes);
  row("largest free extent", d.a.largest_free_extent_bytes, d.b.largest_free_extent_bytes);
  s += fmt::format("  {:<28} {:>12.3f} -> {:>12.3f}  ({:+.3f})\n", "external fragmentation", d.a.external_fragmentation,
                   d.b.external_fragmentation, d.b.external_fragmentation - d.a.external_fragmentation);
  auto groups = [&](const char* title, const std::vector<GroupDelta>& gs) {
    s += fmt::format("\nlive bytes by {} (changed):\n", title);
    if (gs.empty()) s += "  (no change)\n";
    for (const auto& g : gs) {
      s += fmt::format("  {:>12} -> {:>12}  ({:>12})  {}\n", human_bytes(g.a_bytes), human_bytes(g.b_bytes),
                       human_signed(g.delta_bytes()), g.name);
    }
  };
  groups("op", d.ops);
  groups("call site", d.sites);
  auto segs = [&](const char* title, const std::vector<SegmentRef>& v) {
    s += fmt::format("\nsegments {} ({}):\n", title, v.size());
    for (const auto& r : v) s += fmt::format("  0x{:x}  {:>12}  {}\n", r.address, human_bytes(r.total_size_bytes), r.segment_type);
  };
  segs("added", d.segments_added);
  segs("removed", d.segments_removed);
  return s;
}

std::string render_diff_json(const SnapshotDiff& d) {
  detail::JsonOut j;
  j.obj();
  j.key("a").str(d.a_source).key("b").str(d.b_source);
  auto frag = [&](const char* key, const Fragmentation& f) {
    j.key(key).obj();
    j.key("reserved_bytes").num(f.reserved_bytes).key("allocated_bytes").num(f.allocated_bytes);
    j.key("reserved_unallocated_bytes").num(f.reserved_unallocated_bytes());
    j.key("inactive_split_bytes").num(f.inactive_split_bytes).key("cached_free_bytes").num(f.cached_free_bytes);
    j.key("largest_free_extent_bytes").num(f.largest_free_extent_bytes);
    j.key("external_fragmentation").real(f.external_fragmentation);
    j.end_obj();
  };
  frag("fragmentation_a", d.a);
  frag("fragmentation_b", d.b);
  j.key("external_fragmentation_change").real(d.b.external_fragmentation - d.a.external_fragmentation);
  j.key("reserved_unallocated_change_bytes")
      .num(static_cast<std::int64_t>(d.b.reserved_unallocated_bytes()) - static_cast<std::int64_t>(d.a.reserved_unallocated_bytes()));
  auto groups = [&](const char* key, const std::vector<GroupDelta>& gs) {
    j.key(key).arr();
    for (const auto& g : gs) {
      j.obj().key("name").str(g.name).key("a_bytes").num(g.a_bytes).key("b_bytes").num(g.b_bytes);
      j.key("delta_bytes").num(g.delta_bytes()).end_obj();
    }
    j.end_arr();
  };
  groups("ops", d.ops);
  groups("sites", d.sites);
  auto segs = [&](const char* key, const std::vector<SegmentRef>& v) {
    j.key(key).arr();
    for (const auto& r : v) {
      j.obj().key("address").num(r.address).key("total_size_bytes").num(r.total_size_bytes);
      j.key("segment_type").str(r.segment_type).end_obj();
    }
    j.end_arr();
  };
  segs("segments_added", d.segments_added);
  segs("segments_removed", d.segments_removed);
  j.end_obj();
  return j.take();
}

}  // namespace gpumem::forensics
