#include "gpumem/forensics/snapshot_io.h"

#include <charconv>

#include <fmt/format.h>

#include "file_bytes.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"
#include "gpumem/forensics/snapshot_reader.h"
#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/trace_loader.h"
#include "json_reader.h"

namespace gpumem::forensics {
namespace {

std::uint64_t u64_of(const PickleValue* v) {
  return v && v->is_int() && v->as_int() > 0 ? static_cast<std::uint64_t>(v->as_int()) : 0;
}
std::int64_t i64_of(const PickleValue* v) { return v && v->is_int() ? v->as_int() : 0; }

// A byte count of gpumem's additions: at most kMaxTotalBytes in magnitude (a sum over a trace).
std::uint64_t bytes_of(const PickleValue* v, const Snapshot& snap, const char* what) {
  const std::uint64_t b = u64_of(v);
  if (b > kMaxTotalBytes) {
    throw ForensicsError(fmt::format("{}: gpumem.{} is {} bytes, more than any trace holds; the snapshot is damaged "
                                     "(write it again)",
                                     snap.source, what, b));
  }
  return b;
}
std::string str_of(const PickleValue* v) { return v && v->is_string() ? v->as_string() : std::string(); }

// "file.py:12:function" -> one frame (the CSV traces' `where`).
SnapshotFrame frame_from_site(const std::string& site) {
  SnapshotFrame f;
  const auto first = site.find(':');
  const auto second = first == std::string::npos ? std::string::npos : site.find(':', first + 1);
  if (second == std::string::npos) {
    f.name = site;
    f.filename = "??";
    return f;
  }
  f.filename = site.substr(0, first);
  std::from_chars(site.data() + first + 1, site.data() + second, f.line);
  f.name = site.substr(second + 1);
  return f;
}

Snapshot snapshot_from_trace(const Trace& trace) {
  Snapshot snap;
  snap.source = trace.source;
  snap.device_traces.resize(1);
  auto& out = snap.device_traces[0];
  out.reserve(trace.entries.size());
  std::vector<std::vector<SnapshotFrame>> site_frames(trace.sites.size());
  for (std::size_t i = 1; i < trace.sites.size(); ++i) site_frames[i] = {frame_from_site(trace.sites[i])};
  for (const auto& e : trace.entries) {
    SnapshotTraceEntry s;
    s.action = e.action;
    s.addr = e.action == TraceAction::oom ? 0 : e.addr;
    s.size_bytes = e.size_bytes;
    s.stream = e.stream;
    s.time_us = e.time_us;
    if (e.site < site_frames.size()) s.frames = site_frames[e.site];
    out.push_back(std::move(s));
  }
  return snap;
}

bool is_op_frame(const SnapshotFrame& f, const std::string& name) {
  return f.name == name && f.filename == "??" && f.line == 0;
}

// Every trace of the snapshot: the devices', then pinned host memory's.
std::vector<std::vector<SnapshotTraceEntry>*> traces_of(Snapshot& snap) {
  std::vector<std::vector<SnapshotTraceEntry>*> out;
  for (auto& t : snap.device_traces) out.push_back(&t);
  out.push_back(&snap.host_trace);
  return out;
}

// Removes the frames the writer synthesized from ops (GpumemSnapshotInfo::op_frames).
void strip_op_frames(Snapshot& snap) {
  for (auto& seg : snap.segments) {
    for (auto& b : seg.blocks) {
      if (!b.op.empty() && b.frames.size() == 1 && is_op_frame(b.frames[0], b.op)) b.frames.clear();
    }
  }
  for (auto* trace : traces_of(snap)) {
    for (auto& e : *trace) {
      if (e.op.empty()) continue;
      const bool scope = !e.user_metadata.empty();
      if (e.frames.size() == (scope ? 2u : 1u) && is_op_frame(e.frames[0], e.op) &&
          (!scope || is_op_frame(e.frames[1], e.user_metadata))) {
        e.frames.clear();
      }
    }
  }
}

}  // namespace

void read_gpumem_additions(const PickleValue& root, Snapshot& snap) {
  if (const PickleValue* segs = root.find("segments"); segs && segs->is_sequence()) {
    const auto& items = segs->items();
    for (std::size_t i = 0; i < items.size() && i < snap.segments.size(); ++i) {
      const PickleValue* blocks = items[i].find("blocks");
      if (!blocks || !blocks->is_sequence()) continue;
      auto& out = snap.segments[i].blocks;
      for (std::size_t b = 0; b < blocks->items().size() && b < out.size(); ++b) {
        out[b].op = str_of(blocks->items()[b].find("op"));
      }
    }
  }
  if (const PickleValue* traces = root.find("device_traces"); traces && traces->is_sequence()) {
    for (std::size_t d = 0; d < traces->items().size() && d < snap.device_traces.size(); ++d) {
      const auto& entries = traces->items()[d];
      if (!entries.is_sequence()) continue;
      auto& out = snap.device_traces[d];
      for (std::size_t i = 0; i < entries.items().size() && i < out.size(); ++i) {
        out[i].op = str_of(entries.items()[i].find("op"));
      }
    }
  }
  const PickleValue* g = root.find("gpumem");
  if (!g || !g->is_dict()) return;
  if (const PickleValue* host = g->find("host_trace"); host && host->is_sequence()) {
    for (std::size_t i = 0; i < host->items().size() && i < snap.host_trace.size(); ++i) {
      snap.host_trace[i].op = str_of(host->items()[i].find("op"));
    }
  }
  auto& info = snap.gpumem;
  const std::int64_t version = i64_of(g->find("version"));
  if (version <= 0) {
    throw ForensicsError(fmt::format("{}: the 'gpumem' dict has no positive 'version'; the file was not written "
                                     "by gpumem or is damaged (write it again with gpumem)",
                                     snap.source));
  }
  if (version > GpumemSnapshotInfo::kVersion) {
    throw ForensicsError(fmt::format("{}: written by a newer gpumem (snapshot version {}, this gpumem reads up "
                                     "to {}); update gpumem",
                                     snap.source, version, GpumemSnapshotInfo::kVersion));
  }
  info.version = static_cast<int>(version);
  info.settings = str_of(g->find("settings"));
  info.device_total_bytes = bytes_of(g->find("device_total"), snap, "device_total");
  info.device_free_bytes = bytes_of(g->find("device_free"), snap, "device_free");
  info.cap_bytes = bytes_of(g->find("cap"), snap, "cap");
  if (const PickleValue* f = g->find("op_frames"); f && f->is_bool()) info.op_frames = f->as_bool();
  if (info.op_frames) strip_op_frames(snap);
}

Snapshot parse_snapshot(std::string_view bytes, const std::string& source, const ReadLimits& limits) {
  std::size_t i = 0;
  while (i < bytes.size() && (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\r' || bytes[i] == '\t')) ++i;
  if (i < bytes.size() && bytes[i] == '{') {
    const PickleValue root = detail::parse_json(bytes, source, limits);
    Snapshot snap = snapshot_from_pickle(root, source, limits);
    read_gpumem_additions(root, snap);
    return snap;
  }
  const PickleValue root = parse_pickle(bytes, source, limits);
  Snapshot snap = snapshot_from_pickle(root, source, limits);
  read_gpumem_additions(root, snap);
  return snap;
}

Snapshot load_snapshot(const std::string& path, const ReadLimits& limits) {
  const auto file = detail::read_file_bytes(path, limits);
  return parse_snapshot_file_bytes(file.bytes, path, limits);
}

Snapshot parse_snapshot_file_bytes(std::string_view b, const std::string& source, const ReadLimits& limits) {
  std::size_t i = 0;
  while (i < b.size() && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) ++i;
  if (i < b.size() && (b[i] == '{' || static_cast<unsigned char>(b[i]) == 0x80)) return parse_snapshot(b, source, limits);
  // Not a pickle nor JSON: a CSV trace (its reader names the problem if it is not one either).
  return snapshot_from_trace(parse_csv_trace(b, source, limits));
}

}  // namespace gpumem::forensics
