#include "gpumem/forensics/snapshot.h"

#include <fmt/format.h>

#include "gpumem/forensics/error.h"

namespace gpumem::forensics {
namespace {

bool inside_torch(const std::string& filename) {
  return filename.find("/torch/") != std::string::npos || filename.rfind("torch/", 0) == 0;
}

}  // namespace

void recompute_sizes(SnapshotSegment& seg) noexcept {
  seg.allocated_size_bytes = seg.active_size_bytes = seg.requested_size_bytes = 0;
  std::uint64_t total = 0;
  for (const auto& b : seg.blocks) {
    total += b.size_bytes;
    if (b.state == "active_allocated") {
      seg.allocated_size_bytes += b.size_bytes;
      seg.requested_size_bytes += b.requested_bytes;
    }
    if (b.state != "inactive") seg.active_size_bytes += b.size_bytes;
  }
  seg.total_size_bytes = total;
}

std::string call_site(const std::vector<SnapshotFrame>& frames) {
  for (const auto& f : frames) {
    if (f.filename.empty() || f.filename == "??" || inside_torch(f.filename)) continue;
    const auto slash = f.filename.find_last_of('/');
    std::string site = fmt::format("{}:{}:{}",
                                   slash == std::string::npos ? f.filename : f.filename.substr(slash + 1),
                                   f.line, f.name);
    for (char& c : site) {
      if (c == ',' || c == '\n' || c == '\r') c = ';';
    }
    return site;
  }
  return {};
}

std::string device_label(int device) {
  return device == kPinnedHostDevice ? std::string("pinned host") : fmt::format("device {}", device);
}

const std::vector<SnapshotTraceEntry>& trace_entries(const Snapshot& snapshot, int device) noexcept {
  static const std::vector<SnapshotTraceEntry> kEmpty;
  if (device == kPinnedHostDevice) return snapshot.host_trace;
  if (device < 0 || static_cast<std::size_t>(device) >= snapshot.device_traces.size()) return kEmpty;
  return snapshot.device_traces[static_cast<std::size_t>(device)];
}

int first_traced_device(const Snapshot& snapshot) noexcept {
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    if (!snapshot.device_traces[d].empty()) return static_cast<int>(d);
  }
  return 0;
}

Trace trace_from_snapshot(const Snapshot& snapshot, int device) {
  const bool host = device == kPinnedHostDevice && !snapshot.host_trace.empty();
  if (!host && (device < 0 || static_cast<std::size_t>(device) >= snapshot.device_traces.size())) {
    throw ForensicsError(fmt::format(
        "{}: the snapshot has no trace for {} (it has {} device trace(s){}); pick another device",
        snapshot.source, device_label(device), snapshot.device_traces.size(),
        snapshot.host_trace.empty() ? "" : " and one of pinned host memory, device -1"));
  }
  Trace trace;
  trace.source = snapshot.source;
  const auto& entries = trace_entries(snapshot, device);
  trace.entries.reserve(entries.size());
  for (const auto& s : entries) {
    TraceEntry e;
    e.action = s.action;
    e.addr = s.addr;
    e.size_bytes = s.size_bytes;
    e.stream = s.stream;
    e.time_us = s.time_us;
    e.site = trace.intern_site(call_site(s.frames));
    trace.entries.push_back(e);
  }
  return trace;
}

}  // namespace gpumem::forensics
