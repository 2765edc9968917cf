#include "gpumem/view/viewer_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/oom_moment.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/snapshot_reader.h"
#include "gpumem/view/active_memory.h"
#include "gpumem/view/summary.h"

namespace gpumem::view {
namespace {

using forensics::TraceAction;

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What the file holds, from its first bytes (gzip: from its name).
enum class Kind { csv, snapshot };

Kind sniff(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw forensics::ForensicsError(fmt::format(
        "{}: cannot open the file; give the path of a PyTorch snapshot (.pickle) or a CSV trace "
        "(.csv / .csv.gz)",
        path));
  }
  char head[2] = {0, 0};
  in.read(head, 2);
  const auto b0 = static_cast<unsigned char>(head[0]);
  const auto b1 = static_cast<unsigned char>(head[1]);
  if (b0 == 0x1f && b1 == 0x8b) return ends_with(path, ".csv.gz") ? Kind::csv : Kind::snapshot;
  // A CSV trace starts with its header; anything else (pickle, JSON) is a snapshot, and
  // load_snapshot names the problem if it is neither.
  return b0 == 'a' && b1 == 'c' ? Kind::csv : Kind::snapshot;
}

MemoryState final_state_of(const forensics::Snapshot& snap, int device, forensics::Trace& trace,
                           SnapshotTotals& totals, const std::vector<std::string>& op_names) {
  MemoryState state;
  for (const auto& seg : snap.segments) {
    if (seg.device != device) continue;
    ++totals.segment_count;
    totals.reserved_bytes += seg.total_size_bytes;
    totals.allocated_bytes += seg.allocated_size_bytes;
    state.add_segment(seg.address, seg.total_size_bytes, SegmentInfo{seg.total_size_bytes, seg.stream, seg.is_expandable});
    for (const auto& b : seg.blocks) {
      ++totals.block_count;
      if (b.state == "inactive") {
        totals.largest_inactive_bytes = std::max(totals.largest_inactive_bytes, b.size_bytes);
        continue;
      }
      std::uint32_t op = 0;
      if (!b.op.empty()) {
        const auto it = std::find(op_names.begin(), op_names.end(), b.op);
        if (it != op_names.end()) op = static_cast<std::uint32_t>(it - op_names.begin());
      }
      state.add_block(b.address, BlockInfo{b.size_bytes, b.requested_bytes,
                                           trace.intern_site(forensics::call_site(b.frames)), 0, 0, op});
    }
  }
  return state;
}

}  // namespace

namespace {

// The forensics OOM report of one device of a snapshot; never throws (a failure becomes a note).
ViewerModel::OomReport compute_oom_report(const forensics::Snapshot& snapshot, int device) {
  ViewerModel::OomReport out;
  try {
    forensics::ReportOptions options;
    options.top = 5;
    options.device = device;
    // The advice replays the trace under gpumem's policy; skip that on very large traces.
    std::size_t entries = 0;
    for (const auto& t : snapshot.device_traces) entries += t.size();
    options.replay = entries <= 300'000;
    forensics::MemoryReport r = forensics::build_report(snapshot, options);
    out.analysis = std::move(r.oom);
    out.notes = std::move(r.notes);
  } catch (const std::exception& e) {
    out.notes.push_back(std::string("the forensics OOM report failed: ") + e.what());
  }
  return out;
}

}  // namespace

ViewerModel ViewerModel::open(const std::string& path, std::optional<int> device) {
  if (sniff(path) == Kind::csv) {
    if (device && *device != 0) {
      throw forensics::ForensicsError(fmt::format(
          "{}: a CSV trace holds one device's history; --device {} does not apply (leave it out)", path, *device));
    }
    ViewerModel m = build(forensics::read_csv_trace(path), nullptr, 0, {""}, {});
    // The OOM report works on a Snapshot: read the file that way, in the background.
    if (m.oom_) {
      m.oom_report_ = std::async(std::launch::async, [path] {
                        try {
                          return compute_oom_report(forensics::load_snapshot(path), 0);
                        } catch (const std::exception& e) {
                          return OomReport{std::nullopt, {std::string("the forensics OOM report failed: ") + e.what()}};
                        }
                      }).share();
    }
    return m;
  }
  const auto snap = std::make_shared<const forensics::Snapshot>(forensics::load_snapshot(path));
  const int d = device.value_or(forensics::first_traced_device(*snap));
  forensics::Trace trace = forensics::trace_entries(*snap, d).empty() && (d == 0 || d == forensics::kPinnedHostDevice)
                               ? forensics::Trace{}
                               : forensics::trace_from_snapshot(*snap, d);
  // The title shows the source: name pinned host memory there, as reports do.
  trace.source = d == forensics::kPinnedHostDevice ? path + " (" + forensics::device_label(d) + ")" : path;
  std::optional<std::uint64_t> device_free;
  bool has_oom = false;
  std::vector<std::string> op_names{""};
  std::vector<std::uint32_t> entry_ops;
  if (d == forensics::kPinnedHostDevice || (d >= 0 && static_cast<std::size_t>(d) < snap->device_traces.size())) {
    const auto& entries = forensics::trace_entries(*snap, d);
    std::unordered_map<std::string, std::uint32_t> op_index;
    const auto intern = [&](const std::string& op) -> std::uint32_t {
      if (op.empty()) return 0;
      auto [it, inserted] = op_index.try_emplace(op, static_cast<std::uint32_t>(op_names.size()));
      if (inserted) op_names.push_back(op);
      return it->second;
    };
    for (const auto& seg : snap->segments) {
      for (const auto& b : seg.blocks) intern(b.op);
    }
    if (op_names.size() > 1 || std::any_of(entries.begin(), entries.end(), [](const auto& e) { return !e.op.empty(); })) {
      entry_ops.reserve(entries.size());
      for (const auto& e : entries) entry_ops.push_back(intern(e.op));
    }
    for (const auto& e : entries) {
      if (e.action == TraceAction::oom) {
        device_free = e.device_free_bytes;
        has_oom = true;
      }
    }
  }
  // The report reads the snapshot on its own thread while the model is built from it (both only
  // read it); the thread holds the snapshot until it is done.
  std::shared_future<OomReport> report;
  if (has_oom) report = std::async(std::launch::async, [snap, d] { return compute_oom_report(*snap, d); }).share();
  ViewerModel m = build(std::move(trace), snap.get(), d, std::move(op_names), std::move(entry_ops));
  m.oom_device_free_ = device_free;
  m.oom_report_ = std::move(report);
  return m;
}

ViewerModel ViewerModel::from(forensics::Trace trace, std::optional<forensics::Snapshot> snapshot, int device) {
  return build(std::move(trace), snapshot ? &*snapshot : nullptr, device, {""}, {});
}

const std::optional<forensics::OomAnalysis>& ViewerModel::oom_report() const {
  static const std::optional<forensics::OomAnalysis> kNone;
  if (!oom_report_.valid() || oom_report_pending()) return kNone;
  return oom_report_.get().analysis;
}

const std::vector<std::string>& ViewerModel::report_notes() const {
  static const std::vector<std::string> kNone;
  if (!oom_report_.valid() || oom_report_pending()) return kNone;
  return oom_report_.get().notes;
}

bool ViewerModel::oom_report_pending() const {
  return oom_report_.valid() && oom_report_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

void ViewerModel::wait_for_oom_report() const {
  if (oom_report_.valid()) oom_report_.wait();
}

ViewerModel ViewerModel::build(forensics::Trace trace, const forensics::Snapshot* snapshot, int device,
                               std::vector<std::string> op_names, std::vector<std::uint32_t> entry_ops) {
  ViewerModel m;
  m.trace_ = std::move(trace);
  m.op_names_ = std::move(op_names);
  m.entry_ops_ = std::move(entry_ops);
  const auto& entries = m.trace_.entries;
  const std::size_t n = entries.size();

  MemoryState state;
  if (snapshot) {
    SnapshotTotals totals;
    state = final_state_of(*snapshot, device, m.trace_, totals, m.op_names_);
    m.snapshot_totals_ = totals;
    m.expandable_ = snapshot->expandable_segments;
    for (const auto& seg : snapshot->segments) {
      if (seg.device == device && seg.pool_id != std::pair<std::int64_t, std::int64_t>{0, 0})
        m.pool_ranges_.push_back(PoolRange{seg.address, seg.address + seg.total_size_bytes, seg.pool_id});
    }
    std::sort(m.pool_ranges_.begin(), m.pool_ranges_.end(),
              [](const PoolRange& a, const PoolRange& b) { return a.lo < b.lo; });
    // Allocations whose address and request match a block live in the snapshot get that
    // block's exact size (PyTorch may hand out more than the rounded request).
    std::unordered_map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> live;  // addr -> requested, size
    for (const auto& seg : snapshot->segments) {
      if (seg.device != device) continue;
      for (const auto& b : seg.blocks) {
        if (b.state != "inactive") live[b.address] = {b.requested_bytes, b.size_bytes};
      }
    }
    m.block_bytes_.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      if (entries[i].action != TraceAction::alloc) continue;
      auto it = live.find(entries[i].addr);
      if (it != live.end() && it->second.first == entries[i].size_bytes) m.block_bytes_[i] = it->second.second;
    }
    for (std::size_t i = n; i-- > 0;) state.undo(entries[i]);
    state.reset_expandable_va();  // undone mappings must not show as unmapped before they happen
  } else {
    // A CSV trace records requests only: its blocks get the sizes the report's rebuilt segments
    // give them (PyTorch's split rule leaves up to 1 MiB more in a large block), so that the
    // viewer's allocated bytes and Live view are the report's.
    m.block_bytes_ = forensics::rebuilt_block_bytes(entries, device);
  }
  m.allocated_.resize(n + 1);
  m.reserved_.resize(n + 1);
  m.elapsed_us_.resize(n);
  m.active_cache_ = std::make_shared<ActiveMemoryCache>();
  m.checkpoints_.reserve(n / kCheckpointEvery + 1);
  m.allocated_[0] = state.allocated_bytes;
  m.reserved_[0] = state.reserved_bytes;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % kCheckpointEvery == 0) m.checkpoints_.push_back(state);
    const auto& e = entries[i];
    state.apply(e, i, m.block_bytes_of(i), m.op_of(i));
    if (e.action == TraceAction::oom) m.oom_ = i + 1;
    if (e.action == TraceAction::segment_map) m.expandable_ = true;
    m.elapsed_us_[i] = i == 0 ? 0 : std::max(m.elapsed_us_[i - 1], e.time_us - entries.front().time_us);
    m.allocated_[i + 1] = state.allocated_bytes;
    m.reserved_[i + 1] = state.reserved_bytes;
    if (state.reserved_bytes > m.reserved_[m.peak_reserved_]) m.peak_reserved_ = i + 1;
    if (state.allocated_bytes > m.allocated_[m.peak_allocated_]) m.peak_allocated_ = i + 1;
  }
  if (n % kCheckpointEvery == 0) m.checkpoints_.push_back(std::move(state));
  m.block_peak_.assign(n / kPeakBlock + 1, 0);
  for (std::size_t i = 0; i <= n; ++i) {
    std::size_t& best = m.block_peak_[i / kPeakBlock];
    if (i % kPeakBlock == 0 || m.allocated_[i] > m.allocated_[best]) best = i;
  }
  return m;
}

std::optional<std::pair<std::int64_t, std::int64_t>> ViewerModel::pool_of(std::uint64_t addr) const {
  auto it = std::upper_bound(pool_ranges_.begin(), pool_ranges_.end(), addr,
                             [](std::uint64_t a, const PoolRange& r) { return a < r.lo; });
  if (it == pool_ranges_.begin()) return std::nullopt;
  --it;
  if (addr < it->hi) return it->pool_id;
  return std::nullopt;
}

std::int64_t ViewerModel::time_us_at(std::size_t applied) const {
  if (trace_.entries.empty()) return 0;
  if (applied == 0) return trace_.entries.front().time_us;
  return trace_.entries[std::min(applied, entry_count()) - 1].time_us;
}

std::size_t ViewerModel::cursor_at(const forensics::MomentSpec& spec) const {
  using Kind = forensics::MomentSpec::Kind;
  switch (spec.kind) {
    case Kind::automatic: return initial_cursor();
    case Kind::oom:
      if (!oom_) throw forensics::ForensicsError(source() + ": the trace records no OOM; use --at peak, alloc-peak, entry:N or time:T");
      return *oom_;
    case Kind::peak_reserved: return peak_reserved_;
    case Kind::peak_allocated: return peak_allocated_;
    case Kind::entry:
      if (spec.entry > entry_count()) {
        throw forensics::ForensicsError(fmt::format("{}: --at entry:{} is past the trace's end (it has {} entries)", source(),
                                                    spec.entry, entry_count()));
      }
      return spec.entry;
    case Kind::time:
      if (spec.time_us >= span_us()) {
        throw forensics::ForensicsError(fmt::format("{}: --at time: +{} is past the trace's end (+{})", source(),
                                                    format_us(spec.time_us), format_us(span_us() - 1)));
      }
      return applied_before_us(spec.time_us + 1);
  }
  return initial_cursor();
}

std::size_t ViewerModel::peak_allocated_cursor_in(std::size_t lo, std::size_t hi) const {
  hi = std::min(hi, entry_count());
  std::size_t best = std::min(lo, hi);
  for (std::size_t i = best; i <= hi;) {
    if (i % kPeakBlock == 0 && i + kPeakBlock - 1 <= hi) {
      if (allocated_[block_peak_[i / kPeakBlock]] > allocated_[best]) best = block_peak_[i / kPeakBlock];
      i += kPeakBlock;
    } else {
      if (allocated_[i] > allocated_[best]) best = i;
      ++i;
    }
  }
  return best;
}

std::size_t ViewerModel::applied_before_us(std::int64_t elapsed_us) const {
  return static_cast<std::size_t>(std::lower_bound(elapsed_us_.begin(), elapsed_us_.end(), elapsed_us) - elapsed_us_.begin());
}

MemoryState ViewerModel::state_at(std::size_t applied) const {
  applied = std::min(applied, entry_count());
  const std::size_t c = std::min(applied / kCheckpointEvery, checkpoints_.size() - 1);
  MemoryState state = checkpoints_[c];
  for (std::size_t i = c * kCheckpointEvery; i < applied; ++i) state.apply(trace_.entries[i], i, block_bytes_of(i), op_of(i));
  return state;
}

}  // namespace gpumem::view
