#include "gpumem/forensics/snapshot_reader.h"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"
#include "plausibility.h"

namespace gpumem::forensics {
namespace {

// Where a field is ("device_traces[0][12].frames[3].name"), built only when a message needs it:
// a snapshot has millions of fields and nearly all are fine.
struct FieldPath {
  const FieldPath* parent = nullptr;
  const char* key = nullptr;  // ".key", or [index] when null
  std::size_t index = 0;

  // A path points at its parent: never derive one from a temporary (it would dangle).
  FieldPath operator/(const char* k) const& { return {this, k, 0}; }
  FieldPath operator[](std::size_t i) const& { return {this, nullptr, i}; }
  FieldPath operator/(const char* k) const&& = delete;
  FieldPath operator[](std::size_t i) const&& = delete;
  std::string str() const {
    if (!parent && !key) return {};  // the root: the snapshot itself
    std::string head = parent ? parent->str() : std::string();
    if (key) return head.empty() ? std::string(key) : head + "." + key;
    return fmt::format("{}[{}]", head, index);
  }
};

// Walks the pickled dict with messages that name the file and the path of a bad field.
class SnapshotDecoder {
 public:
  SnapshotDecoder(const std::string& source, const ReadLimits& limits) : source_(source), limits_(limits) {}

  [[noreturn]] void fail(const FieldPath& path, const std::string& what) const {
    throw ForensicsError(fmt::format("{}: {}: {}; this does not look like a PyTorch memory snapshot "
                                     "(torch.cuda.memory._dump_snapshot)",
                                     source_, path.str(), what));
  }
  [[noreturn]] void fail_damaged(const FieldPath& path, const std::string& what) const {
    throw ForensicsError(fmt::format("{}: {}: {}; the snapshot is damaged (write it again)", source_, path.str(),
                                     what));
  }

  // One more record (segment, block, trace entry, frame) decoded.
  void count(const FieldPath& path, std::size_t n = 1) {
    records_ += n;
    if (records_ > limits_.max_records) {
      throw ForensicsError(fmt::format("{}: {}: the snapshot holds more than {} records (segments, blocks, trace "
                                       "entries and stack frames); {}",
                                       source_, path.str(), limits_.max_records,
                                       read_limit_hint("GPUMEM_MAX_RECORDS", limits_.max_records)));
    }
  }

  const PickleValue& require(const PickleValue& dict, const char* key, const FieldPath& path) const {
    const PickleValue* v = dict.find(key);
    if (!v) fail(path, fmt::format("the key '{}' is missing", key));
    return *v;
  }

  std::uint64_t to_u64(const PickleValue& v, const FieldPath& path) const {
    if (v.is_bool()) return v.as_bool() ? 1 : 0;
    if (!v.is_int()) fail(path, fmt::format("is a {}, expected an int", PickleValue::kind_name(v.kind())));
    if (v.as_int() < 0) fail(path, fmt::format("is {}, expected a non-negative int", v.as_int()));
    return static_cast<std::uint64_t>(v.as_int());
  }
  std::int64_t to_i64(const PickleValue& v, const FieldPath& path) const {
    if (!v.is_int()) fail(path, fmt::format("is a {}, expected an int", PickleValue::kind_name(v.kind())));
    return v.as_int();
  }
  std::uint64_t u64_or(const PickleValue& dict, const char* key, std::uint64_t fallback, const FieldPath& path) const {
    const PickleValue* v = dict.find(key);
    if (!v || v->is_none()) return fallback;
    return to_u64(*v, path / key);
  }
  // A size: plausible (read_limits.h).
  std::uint64_t size_or(const PickleValue& dict, const char* key, std::uint64_t fallback, const FieldPath& path) const {
    const std::uint64_t v = u64_or(dict, key, fallback, path);
    if (v > kMaxPlausibleBytes) fail_damaged(path / key, fmt::format("{} bytes is larger than any memory", v));
    return v;
  }
  std::string str_or(const PickleValue& dict, const char* key, const FieldPath& path) const {
    const PickleValue* v = dict.find(key);
    if (!v || v->is_none()) return {};
    if (!v->is_string()) fail(path / key, fmt::format("is a {}, expected a str", PickleValue::kind_name(v->kind())));
    return v->as_string();
  }
  const PickleItems& list_of(const PickleValue& v, const FieldPath& path) const {
    if (!v.is_sequence()) fail(path, fmt::format("is a {}, expected a list", PickleValue::kind_name(v.kind())));
    return v.items();
  }
  void expect_dict(const PickleValue& v, const FieldPath& path) const {
    if (!v.is_dict()) fail(path, fmt::format("is a {}, expected a dict", PickleValue::kind_name(v.kind())));
  }

  std::vector<SnapshotFrame> frames(const PickleValue& owner, const FieldPath& path) {
    std::vector<SnapshotFrame> out;
    const PickleValue* f = owner.find("frames");
    if (!f || f->is_none()) return out;
    const FieldPath fp = path / "frames";
    const auto& items = list_of(*f, fp);
    count(fp, items.size());
    out.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const FieldPath at = fp[i];
      expect_dict(items[i], at);
      SnapshotFrame frame;
      frame.name = str_or(items[i], "name", at);
      frame.filename = str_or(items[i], "filename", at);
      const PickleValue* line = items[i].find("line");
      if (line && line->is_int()) frame.line = line->as_int();
      out.push_back(std::move(frame));
    }
    return out;
  }

  SnapshotBlock block(const PickleValue& v, const FieldPath& path, std::uint64_t next_address) {
    expect_dict(v, path);
    count(path);
    SnapshotBlock b;
    b.size_bytes = to_u64(require(v, "size", path), path / "size");
    if (b.size_bytes > kMaxPlausibleBytes) fail_damaged(path / "size", fmt::format("{} bytes is larger than any memory", b.size_bytes));
    b.address = u64_or(v, "address", next_address, path);  // the viewer recomputes it the same way
    b.requested_bytes = size_or(v, "requested_size", b.size_bytes, path);
    b.state = str_or(v, "state", path);
    if (b.state.empty()) b.state = "inactive";
    b.frames = frames(v, path);
    return b;
  }

  SnapshotSegment segment(const PickleValue& v, const FieldPath& path) {
    expect_dict(v, path);
    count(path);
    SnapshotSegment s;
    // A CUDA device, or -1: gpumem's pinned host memory (kPinnedHostDevice).
    if (const PickleValue* dev = v.find("device"); dev && !dev->is_none()) {
      const std::int64_t device = to_i64(*dev, path / "device");
      if (device < kPinnedHostDevice || device >= static_cast<std::int64_t>(kMaxDevices)) {
        fail_damaged(path / "device",
                     fmt::format("device {} is not a device index (or -1, pinned host memory)", device));
      }
      s.device = static_cast<int>(device);
    }
    s.address = to_u64(require(v, "address", path), path / "address");
    s.total_size_bytes = to_u64(require(v, "total_size", path), path / "total_size");
    if (const std::string why = detail::implausible_numbers(s.address, s.total_size_bytes, 0); !why.empty()) {
      fail_damaged(path, why);
    }
    s.allocated_size_bytes = size_or(v, "allocated_size", 0, path);
    s.active_size_bytes = size_or(v, "active_size", 0, path);
    s.requested_size_bytes = size_or(v, "requested_size", 0, path);
    s.stream = u64_or(v, "stream", 0, path);
    s.segment_type = str_or(v, "segment_type", path);
    if (const PickleValue* pool = v.find("segment_pool_id"); pool && pool->is_sequence() && pool->items().size() == 2) {
      s.pool_id = {to_i64(pool->items()[0], path / "segment_pool_id"),
                   to_i64(pool->items()[1], path / "segment_pool_id")};
    }
    if (const PickleValue* e = v.find("is_expandable"); e && e->is_bool()) s.is_expandable = e->as_bool();
    const FieldPath bp = path / "blocks";
    const auto& blocks = list_of(require(v, "blocks", path), bp);
    s.blocks.reserve(std::min<std::size_t>(blocks.size(), limits_.max_records));
    // Blocks lie inside their segment, in address order, without overlapping: a block that does
    // not would be counted twice or outside any memory by every report.
    const std::uint64_t end = s.address + s.total_size_bytes;
    std::uint64_t next = s.address;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const FieldPath at = bp[i];
      SnapshotBlock b = block(blocks[i], at, next);
      if (b.address < next || b.address > end || b.size_bytes > end - b.address) {
        fail_damaged(at, fmt::format("the block [{:#x}, +{} B) is not inside its segment [{:#x}, +{} B) after the "
                                     "blocks before it",
                                     b.address, b.size_bytes, s.address, s.total_size_bytes));
      }
      next = b.address + b.size_bytes;
      s.blocks.push_back(std::move(b));
    }
    s.frames = frames(v, path);
    return s;
  }

  SnapshotTraceEntry trace_entry(const PickleValue& v, const FieldPath& path) {
    expect_dict(v, path);
    count(path);
    SnapshotTraceEntry e;
    const PickleValue& action = require(v, "action", path);
    if (!action.is_string()) fail(path / "action", "is not a str");
    const auto parsed = parse_trace_action(action.as_string());
    if (!parsed) {
      fail(path / "action", fmt::format("'{}' is not a PyTorch trace action (alloc, free_requested, "
                                        "free_completed, segment_alloc, segment_free, segment_map, "
                                        "segment_unmap, snapshot, oom)",
                                        action.as_string().substr(0, 60)));
    }
    e.action = *parsed;
    e.addr = u64_or(v, "addr", 0, path);
    e.size_bytes = u64_or(v, "size", 0, path);
    e.stream = u64_or(v, "stream", 0, path);
    if (const PickleValue* t = v.find("time_us"); t && t->is_int()) e.time_us = t->as_int();
    if (const std::string why = detail::implausible_numbers(e.addr, e.size_bytes, e.time_us); !why.empty()) {
      fail_damaged(path, why);
    }
    if (!trace_sizes_.add(e.size_bytes)) fail_damaged(path, detail::total_too_large("trace entries up to here"));
    if (const PickleValue* f = v.find("device_free"); f && f->is_int()) {
      e.device_free_bytes = to_u64(*f, path / "device_free");
      if (*e.device_free_bytes > kMaxPlausibleBytes) {
        fail_damaged(path / "device_free", fmt::format("{} bytes is larger than any memory", *e.device_free_bytes));
      }
    }
    e.compile_context = str_or(v, "compile_context", path);
    e.user_metadata = str_or(v, "user_metadata", path);
    e.frames = frames(v, path);
    return e;
  }

  // Segments of one device do not overlap (each byte of device memory is in one segment at most).
  void check_segments_disjoint(const std::vector<SnapshotSegment>& segments) const {
    std::vector<std::size_t> order(segments.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::tie(segments[a].device, segments[a].address) < std::tie(segments[b].device, segments[b].address);
    });
    detail::SizeSum total;
    const FieldPath top;
    const FieldPath root = top / "segments";
    for (std::size_t k = 0; k < order.size(); ++k) {
      const SnapshotSegment& s = segments[order[k]];
      if (!total.add(s.total_size_bytes)) fail_damaged(root, detail::total_too_large("segments"));
      if (k == 0) continue;
      const SnapshotSegment& prev = segments[order[k - 1]];
      if (prev.device == s.device && prev.address + prev.total_size_bytes > s.address) {
        fail_damaged(root[order[k]], fmt::format("the segment [{:#x}, +{} B) overlaps segments[{}] [{:#x}, +{} B) on "
                                                 "device {}",
                                                 s.address, s.total_size_bytes, order[k - 1], prev.address,
                                                 prev.total_size_bytes, s.device));
      }
    }
  }

  static constexpr std::uint64_t kMaxDevices = 1u << 16;

 private:
  const std::string& source_;
  const ReadLimits& limits_;
  std::uint64_t records_ = 0;
  detail::SizeSum trace_sizes_;
};

}  // namespace

Snapshot snapshot_from_pickle(const PickleValue& root, const std::string& source, const ReadLimits& limits) {
  SnapshotDecoder d(source, limits);
  if (!root.is_dict()) {
    throw ForensicsError(fmt::format(
        "{}: the pickle holds a {}, not the dict of a PyTorch memory snapshot (write it with "
        "torch.cuda.memory._dump_snapshot; memory_snapshot() alone lacks the trace)",
        source, PickleValue::kind_name(root.kind())));
  }
  Snapshot snap;
  snap.source = source;
  const FieldPath top;
  const FieldPath segments_path = top / "segments";
  const auto& segments = d.list_of(d.require(root, "segments", top / "snapshot"), segments_path);
  snap.segments.reserve(std::min<std::size_t>(segments.size(), limits.max_records));
  for (std::size_t i = 0; i < segments.size(); ++i) {
    snap.segments.push_back(d.segment(segments[i], segments_path[i]));
  }
  d.check_segments_disjoint(snap.segments);
  const FieldPath traces_path = top / "device_traces";
  const auto& traces = d.list_of(d.require(root, "device_traces", top / "snapshot"), traces_path);
  if (traces.size() > SnapshotDecoder::kMaxDevices) {
    d.fail_damaged(traces_path, fmt::format("{} device traces is more devices than a machine has", traces.size()));
  }
  snap.device_traces.resize(traces.size());
  for (std::size_t dev = 0; dev < traces.size(); ++dev) {
    const FieldPath dp = traces_path[dev];
    const auto& entries = d.list_of(traces[dev], dp);
    auto& out = snap.device_traces[dev];
    out.reserve(std::min<std::size_t>(entries.size(), limits.max_records));
    for (std::size_t i = 0; i < entries.size(); ++i) out.push_back(d.trace_entry(entries[i], dp[i]));
  }
  // gpumem's pinned host memory trace, in its own dict (snapshot_writer.cpp).
  if (const PickleValue* g = root.find("gpumem"); g && g->is_dict()) {
    if (const PickleValue* host = g->find("host_trace"); host && !host->is_none()) {
      const FieldPath gp = top / "gpumem";
      const FieldPath hp = gp / "host_trace";
      const auto& entries = d.list_of(*host, hp);
      snap.host_trace.reserve(std::min<std::size_t>(entries.size(), limits.max_records));
      for (std::size_t i = 0; i < entries.size(); ++i) snap.host_trace.push_back(d.trace_entry(entries[i], hp[i]));
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

Snapshot read_snapshot(const std::string& path, const ReadLimits& limits) {
  return snapshot_from_pickle(read_pickle_file(path, limits), path, limits);
}

}  // namespace gpumem::forensics
