#include "gpumem/forensics/snapshot_diff.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include <fmt/format.h>

#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/vocabulary.h"
#include "json_out.h"

namespace gpumem::forensics {
namespace {

std::vector<GroupDelta> diff_groups(const std::vector<GroupRow>& a, const std::vector<GroupRow>& b) {
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
  return out;
}

std::vector<SegmentRef> missing_from(const std::vector<SnapshotSegment>& from, const std::vector<SnapshotSegment>& in) {
  std::set<std::pair<std::uint64_t, std::uint64_t>> have;
  for (const auto& s : in) have.emplace(s.address, s.total_size_bytes);
  std::vector<SegmentRef> out;
  for (const auto& s : from) {
    if (!have.count({s.address, s.total_size_bytes})) out.push_back({s.address, s.total_size_bytes, s.segment_type});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const SegmentRef& x, const SegmentRef& y) { return x.total_size_bytes > y.total_size_bytes; });
  return out;
}

template <class T>
std::size_t limit(std::vector<T>& v, std::size_t top) {
  const std::size_t n = v.size();
  if (v.size() > top) v.resize(top);
  return n;
}

DiffSide side_of(const MemoryReport& r) {
  return DiffSide{r.source, r.device, r.moment, r.verdict(), r.fragmentation};
}

}  // namespace

SnapshotDiff diff_snapshots(const Snapshot& a, const Snapshot& b, const DiffOptions& options) {
  ReportOptions oa;
  oa.top = SIZE_MAX;
  oa.replay = false;
  oa.at = options.at_a;
  oa.device = options.device_a;
  ReportOptions ob = oa;
  ob.at = options.at_b;
  ob.device = options.device_b;
  const MemoryReport ra = build_report(a, oa);
  const MemoryReport rb = build_report(b, ob);
  SnapshotDiff d;
  d.a = side_of(ra);
  d.b = side_of(rb);
  d.any_op = !ra.ops.empty() || !rb.ops.empty();
  d.ops = diff_groups(ra.ops, rb.ops);
  d.sites = diff_groups(ra.sites, rb.sites);
  d.segments_added = missing_from(rb.state.segments, ra.state.segments);
  d.segments_removed = missing_from(ra.state.segments, rb.state.segments);
  d.ops_changed = limit(d.ops, options.top);
  d.sites_changed = limit(d.sites, options.top);
  d.segments_added_count = limit(d.segments_added, options.top);
  d.segments_removed_count = limit(d.segments_removed, options.top);
  return d;
}

std::string render_diff_text(const SnapshotDiff& d) {
  std::string s = fmt::format("gpumem diff\n  A: {} (device {}), {}: verdict {}\n  B: {} (device {}), {}: verdict {}\n",
                              d.a.source, d.a.device, d.a.moment.describe(), d.a.verdict, d.b.source, d.b.device,
                              d.b.moment.describe(), d.b.verdict);
  auto row = [&](std::string_view name, std::uint64_t a, std::uint64_t b) {
    s += fmt::format("  {:<24} {:>12} -> {:>12}  ({})\n", name, format_bytes(a), format_bytes(b),
                     format_signed_bytes(static_cast<std::int64_t>(b) - static_cast<std::int64_t>(a)));
  };
  const Fragmentation& fa = d.a.fragmentation;
  const Fragmentation& fb = d.b.fragmentation;
  s += "\nmemory:\n";
  row(term::reserved, fa.reserved_bytes, fb.reserved_bytes);
  row(term::allocated, fa.allocated_bytes, fb.allocated_bytes);
  row(term::requested, fa.requested_bytes, fb.requested_bytes);
  row(term::reserved_unallocated, fa.reserved_unallocated_bytes(), fb.reserved_unallocated_bytes());
  row(term::rounding, fa.rounding_bytes, fb.rounding_bytes);
  row(term::pending_free, fa.pending_free_bytes, fb.pending_free_bytes);
  row(term::inactive_split, fa.inactive_split_bytes, fb.inactive_split_bytes);
  row(term::cached_free, fa.cached_free_bytes, fb.cached_free_bytes);
  row(term::largest_free_extent, fa.largest_free_extent_bytes, fb.largest_free_extent_bytes);
  s += fmt::format("  {:<24} {:>12.3f} -> {:>12.3f}  ({:+.3f})\n", term::external_fragmentation,
                   fa.external_fragmentation, fb.external_fragmentation,
                   fb.external_fragmentation - fa.external_fragmentation);
  auto groups = [&](const char* title, const std::vector<GroupDelta>& gs, std::size_t changed) {
    s += fmt::format("\nlive bytes by {} ({} changed{}):\n", title, changed,
                     changed > gs.size() ? fmt::format(", the {} largest shown", gs.size()) : std::string());
    if (gs.empty()) s += "  (no change)\n";
    for (const auto& g : gs) {
      s += fmt::format("  {:>12} -> {:>12}  ({:>12})  {}\n", format_bytes(g.a_bytes), format_bytes(g.b_bytes),
                       format_signed_bytes(g.delta_bytes()), g.name);
    }
  };
  if (d.any_op) {
    groups("op", d.ops, d.ops_changed);
  } else {
    s += "\nlive bytes by op: neither file records ops\n";
  }
  groups("call site", d.sites, d.sites_changed);
  auto segs = [&](const char* title, const std::vector<SegmentRef>& v, std::size_t count) {
    s += fmt::format("\nsegments {} ({}{}):\n", title, count,
                     count > v.size() ? fmt::format(", the {} largest shown", v.size()) : std::string());
    for (const auto& r : v) s += fmt::format("  0x{:x}  {:>12}  {}\n", r.address, format_bytes(r.total_size_bytes), r.segment_type);
  };
  segs("added", d.segments_added, d.segments_added_count);
  segs("removed", d.segments_removed, d.segments_removed_count);
  return s;
}

std::string render_diff_json(const SnapshotDiff& d) {
  detail::JsonOut j;
  j.obj();
  j.key("a").str(d.a.source).key("b").str(d.b.source);
  auto side = [&](const char* key, const DiffSide& x) {
    j.key(key).obj();
    j.key("source").str(x.source).key("device").num(x.device).key("verdict").str(x.verdict);
    j.key("moment").obj().key("kind").str(x.moment.kind_name());
    j.key("entries_applied").num(static_cast<std::uint64_t>(x.moment.applied));
    j.key("description").str(x.moment.describe()).end_obj();
    const Fragmentation& f = x.fragmentation;
    j.key("reserved_bytes").num(f.reserved_bytes).key("allocated_bytes").num(f.allocated_bytes);
    j.key("requested_bytes").num(f.requested_bytes);
    j.key("reserved_unallocated_bytes").num(f.reserved_unallocated_bytes());
    j.key("rounding_bytes").num(f.rounding_bytes).key("pending_free_bytes").num(f.pending_free_bytes);
    j.key("inactive_split_bytes").num(f.inactive_split_bytes).key("cached_free_bytes").num(f.cached_free_bytes);
    j.key("largest_free_extent_bytes").num(f.largest_free_extent_bytes);
    j.key("external_fragmentation").real(f.external_fragmentation);
    j.end_obj();
  };
  side("side_a", d.a);
  side("side_b", d.b);
  j.key("external_fragmentation_change").real(d.b.fragmentation.external_fragmentation - d.a.fragmentation.external_fragmentation);
  j.key("reserved_unallocated_change_bytes")
      .num(static_cast<std::int64_t>(d.b.fragmentation.reserved_unallocated_bytes()) -
           static_cast<std::int64_t>(d.a.fragmentation.reserved_unallocated_bytes()));
  auto groups = [&](const char* key, const std::vector<GroupDelta>& gs) {
    j.key(key).arr();
    for (const auto& g : gs) {
      j.obj().key("name").str(g.name).key("a_bytes").num(g.a_bytes).key("b_bytes").num(g.b_bytes);
      j.key("delta_bytes").num(g.delta_bytes()).end_obj();
    }
    j.end_arr();
  };
  groups("ops", d.ops);
  j.key("ops_changed").num(static_cast<std::uint64_t>(d.ops_changed));
  groups("sites", d.sites);
  j.key("sites_changed").num(static_cast<std::uint64_t>(d.sites_changed));
  auto segs = [&](const char* key, const std::vector<SegmentRef>& v) {
    j.key(key).arr();
    for (const auto& r : v) {
      j.obj().key("address").num(r.address).key("total_size_bytes").num(r.total_size_bytes);
      j.key("segment_type").str(r.segment_type).end_obj();
    }
    j.end_arr();
  };
  segs("segments_added", d.segments_added);
  j.key("segments_added_count").num(static_cast<std::uint64_t>(d.segments_added_count));
  segs("segments_removed", d.segments_removed);
  j.key("segments_removed_count").num(static_cast<std::uint64_t>(d.segments_removed_count));
  j.end_obj();
  return j.take();
}

}  // namespace gpumem::forensics
