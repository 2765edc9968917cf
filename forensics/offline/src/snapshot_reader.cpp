#include "gpumem/forensics/snapshot_reader.h"

#include <fmt/format.h>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"

namespace gpumem::forensics {
namespace {

// Walks the pickled dict with messages that name the file and the path of a bad field.
class SnapshotDecoder {
 public:
  explicit SnapshotDecoder(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ForensicsError(fmt::format("{}: {}: {}; this does not look like a PyTorch memory snapshot "
                                     "(torch.cuda.memory._dump_snapshot)",
                                     source_, path, what));
  }

  const PickleValue& require(const PickleValue& dict, const char* key, const std::string& path) const {
    const PickleValue* v = dict.find(key);
    if (!v) fail(path, fmt::format("the key '{}' is missing", key));
    return *v;
  }

  std::uint64_t to_u64(const PickleValue& v, const std::string& path) const {
    if (v.is_bool()) return v.as_bool() ? 1 : 0;
    if (!v.is_int()) fail(path, fmt::format("is a {}, expected an int", PickleValue::kind_name(v.kind())));
    if (v.as_int() < 0) fail(path, fmt::format("is {}, expected a non-negative int", v.as_int()));
    return static_cast<std::uint64_t>(v.as_int());
  }
  std::int64_t to_i64(const PickleValue& v, const std::string& path) const {
    if (!v.is_int()) fail(path, fmt::format("is a {}, expected an int", PickleValue::kind_name(v.kind())));
    return v.as_int();
  }

  std::uint64_t u64_or(const PickleValue& dict, const char* key, std::uint64_t fallback, const std::string& path) const {
    const PickleValue* v = dict.find(key);
    if (!v || v->is_none()) return fallback;
    return to_u64(*v, path + "." + key);
  }
  std::string str_or(const PickleValue& dict, const char* key, const std::string& path) const {
    const PickleValue* v = dict.find(key);
    if (!v || v->is_none()) return {};
    if (!v->is_string()) fail(path + "." + key, fmt::format("is a {}, expected a str", PickleValue::kind_name(v->kind())));
    return v->as_string();
  }
  const PickleItems& list_of(const PickleValue& v, const std::string& path) const {
    if (!v.is_sequence()) fail(path, fmt::format("is a {}, expected a list", PickleValue::kind_name(v.kind())));
    return v.items();
  }
  void expect_dict(const PickleValue& v, const std::string& path) const {
    if (!v.is_dict()) fail(path, fmt::format("is a {}, expected a dict", PickleValue::kind_name(v.kind())));
  }

  std::vector<SnapshotFrame> frames(const PickleValue& owner, const std::string& path) const {
    std::vector<SnapshotFrame> out;
    const PickleValue* f = owner.find("frames");
    if (!f || f->is_none()) return out;
    const auto& items = list_of(*f, path + ".frames");
    out.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::string fp = fmt::format("{}.frames[{}]", path, i);
      expect_dict(items[i], fp);
      SnapshotFrame frame;
      frame.name = str_or(items[i], "name", fp);
      frame.filename = str_or(items[i], "filename", fp);
      const PickleValue* line = items[i].find("line");
      if (line && line->is_int()) frame.line = line->as_int();
      out.push_back(std::move(frame));
    }
    return out;
  }

  SnapshotBlock block(const PickleValue& v, const std::string& path, std::uint64_t next_address) const {
    expect_dict(v, path);
    SnapshotBlock b;
    b.size_bytes = to_u64(require(v, "size", path), path + ".size");
    b.address = u64_or(v, "address", next_address, path);  // the viewer recomputes it the same way
    b.requested_bytes = u64_or(v, "requested_size", b.size_bytes, path);
    b.state = str_or(v, "state", path);
    if (b.state.empty()) b.state = "inactive";
    b.frames = frames(v, path);
    return b;
  }

  SnapshotSegment segment(const PickleValue& v, const std::string& path) const {
    expect_dict(v, path);
    SnapshotSegment s;
    // A CUDA device, or -1: gpumem's pinned host memory (kPinnedHostDevice).
    if (const PickleValue* dev = v.find("device"); dev && !dev->is_none()) {
      const std::int64_t d = to_i64(*dev, path + ".device");
      if (d < kPinnedHostDevice || d > 1 << 20)
        fail(path + ".device", fmt::format("is {}, expected a device index (or -1, pinned host memory)", d));
      s.device = static_cast<int>(d);
    }
    s.address = to_u64(require(v, "address", path), path + ".address");
    s.total_size_bytes = to_u64(require(v, "total_size", path), path + ".total_size");
    s.allocated_size_bytes = u64_or(v, "allocated_size", 0, path);
    s.active_size_bytes = u64_or(v, "active_size", 0, path);
    s.requested_size_bytes = u64_or(v, "requested_size", 0, path);
    s.stream = u64_or(v, "stream", 0, path);
    s.segment_type = str_or(v, "segment_type", path);
    if (const PickleValue* pool = v.find("segment_pool_id"); pool && pool->is_sequence() && pool->items().size() == 2) {
      s.pool_id = {to_i64(pool->items()[0], path + ".segment_pool_id[0]"),
                   to_i64(pool->items()[1], path + ".segment_pool_id[1]")};
    }
    if (const PickleValue* e = v.find("is_expandable"); e && e->is_bool()) s.is_expandable = e->as_bool();
    const auto& blocks = list_of(require(v, "blocks", path), path + ".blocks");
    s.blocks.reserve(blocks.size());
    std::uint64_t next = s.address;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      s.blocks.push_back(block(blocks[i], fmt::format("{}.blocks[{}]", path, i), next));
      next = s.blocks.back().address + s.blocks.back().size_bytes;
    }
    s.frames = frames(v, path);
    return s;
  }

  SnapshotTraceEntry trace_entry(const PickleValue& v, const std::string& path) const {
    expect_dict(v, path);
    SnapshotTraceEntry e;
    const PickleValue& action = require(v, "action", path);
    if (!action.is_string()) fail(path + ".action", "is not a str");
    const auto parsed = parse_trace_action(action.as_string());
    if (!parsed) {
      fail(path + ".action", fmt::format("'{}' is not a PyTorch trace action (alloc, free_requested, "
                                         "free_completed, segment_alloc, segment_free, segment_map, "
                                         "segment_unmap, snapshot, oom)",
                                         action.as_string()));
    }
    e.action = *parsed;
    e.addr = u64_or(v, "addr", 0, path);
    e.size_bytes = u64_or(v, "size", 0, path);
    e.stream = u64_or(v, "stream", 0, path);
    if (const PickleValue* t = v.find("time_us"); t && t->is_int()) e.time_us = t->as_int();
    if (const PickleValue* f = v.find("device_free"); f && f->is_int()) e.device_free_bytes = to_u64(*f, path + ".device_free");
    e.compile_context = str_or(v, "compile_context", path);
    e.user_metadata = str_or(v, "user_metadata", path);
    e.frames = frames(v, path);
    return e;
  }

 private:
  const std::string& source_;
};

}  // namespace

Snapshot snapshot_from_pickle(const PickleValue& root, const std::string& source) {
  SnapshotDecoder d(source);
  if (!root.is_dict()) {
    throw ForensicsError(fmt::format(
        "{}: the pickle holds a {}, not the dict of a PyTorch memory snapshot (write it with "
        "torch.cuda.memory._dump_snapshot; memory_snapshot() alone lacks the trace)",
        source, PickleValue::kind_name(root.kind())));
  }
  Snapshot snap;
  snap.source = source;
  const auto& segments = d.list_of(d.require(root, "segments", "snapshot"), "segments");
  snap.segments.reserve(segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    snap.segments.push_back(d.segment(segments[i], fmt::format("segments[{}]", i)));
  }
  const auto& traces = d.list_of(d.require(root, "device_traces", "snapshot"), "device_traces");
  snap.device_traces.resize(traces.size());
  for (std::size_t dev = 0; dev < traces.size(); ++dev) {
    const auto& entries = d.list_of(traces[dev], fmt::format("device_traces[{}]", dev));
    auto& out = snap.device_traces[dev];
    out.reserve(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      out.push_back(d.trace_entry(entries[i], fmt::format("device_traces[{}][{}]", dev, i)));
    }
  }
  // gpumem's pinned host memory trace, in its own dict (snapshot_writer.cpp).
  if (const PickleValue* g = root.find("gpumem"); g && g->is_dict()) {
    if (const PickleValue* host = g->find("host_trace"); host && !host->is_none()) {
      const auto& entries = d.list_of(*host, "gpumem.host_trace");
      snap.host_trace.reserve(entries.size());
      for (std::size_t i = 0; i < entries.size(); ++i)
        snap.host_trace.push_back(d.trace_entry(entries[i], fmt::format("gpumem.host_trace[{}]", i)));
    }
  }
  if (const PickleValue* settings = root.find("allocator_settings"); settings && settings->is_dict()) {
    snap.allocator_settings = *settings;
    if (const PickleValue* e = settings->find("expandable_segments"); e && e->is_bool()) {
      snap.expandable_segments = e->as_bool();
    }
    if (const PickleValue* m = settings->find("max_split_size"); m && m->is_int()) {
      snap.max_split_size = m->as_int();
    }
  }
  return snap;
}

Snapshot read_snapshot(const std::string& path) {
  return snapshot_from_pickle(read_pickle_file(path), path);
}

}  // namespace gpumem::forensics
