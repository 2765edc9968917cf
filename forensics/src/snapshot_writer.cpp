#include "gpumem/forensics/snapshot_writer.h"

#include <array>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"

namespace gpumem::forensics {
namespace {

// The dict keys a snapshot uses; each is written once per file and then referred to.
enum Key : std::uint8_t {
  kSegments, kDeviceTraces, kAllocatorSettings, kExternalAnnotations, kGpumem,
  kDevice, kAddress, kTotalSize, kAllocatedSize, kActiveSize, kRequestedSize, kStream,
  kSegmentType, kSegmentPoolId, kIsExpandable, kFrames, kBlocks,
  kSize, kState, kOp,
  kAction, kAddr, kTimeUs, kDeviceFree, kCompileContext, kUserMetadata,
  kName, kFilename, kLine,
  kVersion, kSettings, kDeviceTotal, kCap, kOps,
  kCalls, kAllocs, kAllocatedBytes, kLiveBytes, kPeakContributionBytes, kReservedGrowthBytes,
  kFragDeltaBytes, kWorstCallFragBeforeBytes, kWorstCallFragAfterBytes,
  kExpandableSegments, kMaxSplitSize,
  kKeyCount
};

constexpr std::array<std::string_view, kKeyCount> kKeyNames = {
    "segments", "device_traces", "allocator_settings", "external_annotations", "gpumem",
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
    "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
    "size", "state", "op",
    "action", "addr", "time_us", "device_free", "compile_context", "user_metadata",
    "name", "filename", "line",
    "version", "settings", "device_total", "cap", "ops",
    "calls", "allocs", "allocated_bytes", "live_bytes", "peak_contribution_bytes", "reserved_growth_bytes",
    "frag_delta_bytes", "worst_call_frag_before_bytes", "worst_call_frag_after_bytes",
    "expandable_segments", "max_split_size",
};

// ---- pickle protocol 2 ----
class PickleSink {
 public:
  PickleSink() {
    out_.reserve(1 << 20);
    key_memo_.fill(UINT32_MAX);
    op(0x80);  // PROTO
    op(2);
  }
  std::string finish() {
    op('.');  // STOP
    return std::move(out_);
  }

  void begin_dict() { op('}'); op('('); }   // EMPTY_DICT MARK
  void end_dict() { op('u'); }              // SETITEMS
  void begin_list() { op(']'); op('('); }   // EMPTY_LIST MARK
  void end_list() { op('e'); }              // APPENDS
  void pair_i64(std::int64_t a, std::int64_t b) { i64(a); i64(b); op(0x86); }  // TUPLE2

  void key(Key k) {
    if (key_memo_[k] != UINT32_MAX) return get(key_memo_[k]);
    raw_str(kKeyNames[k]);
    key_memo_[k] = put();
  }
  void str(std::string_view s) { raw_str(s); }
  void dyn_key(std::string_view s) { interned(s); }
  // Strings that repeat (op names, frame names and files) go through the memo.
  void interned(std::string_view s) {
    auto it = memo_.find(s);
    if (it != memo_.end()) return get(it->second);
    raw_str(s);
    memo_.emplace(std::string(s), put());
  }
  void none() { op('N'); }
  void boolean(bool b) { op(b ? 0x88 : 0x89); }
  void f64(double v) {
    op('G');
    const auto bits = std::bit_cast<std::uint64_t>(v);
    for (int i = 7; i >= 0; --i) op(static_cast<std::uint8_t>(bits >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    if (v < 256) {
      op('K'); op(static_cast<std::uint8_t>(v));
    } else if (v < 65536) {
      op('M'); op(static_cast<std::uint8_t>(v)); op(static_cast<std::uint8_t>(v >> 8));
    } else if (v < 0x80000000ULL) {
      op('J'); le32(static_cast<std::uint32_t>(v));
    } else {
      // LONG1: little-endian two's complement; one more byte when the top bit is set.
      std::uint8_t bytes[9];
      int n = 0;
      std::uint64_t x = v;
      while (x != 0) { bytes[n++] = static_cast<std::uint8_t>(x); x >>= 8; }
      if (bytes[n - 1] & 0x80) bytes[n++] = 0;
      op(0x8a); op(static_cast<std::uint8_t>(n));
      out_.append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(n));
    }
  }
  void i64(std::int64_t v) {
    if (v >= 0) return u64(static_cast<std::uint64_t>(v));
    if (v >= INT32_MIN) { op('J'); le32(static_cast<std::uint32_t>(static_cast<std::int32_t>(v))); return; }
    std::uint8_t bytes[8];
    auto x = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::uint8_t>(x >> (8 * i));
    int n = 8;
    while (n > 1 && bytes[n - 1] == 0xff && (bytes[n - 2] & 0x80)) --n;
    op(0x8a); op(static_cast<std::uint8_t>(n));
    out_.append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(n));
  }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  void op(std::uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void le32(std::uint32_t v) {
    char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
    out_.append(b, 4);
  }
  void raw_str(std::string_view s) {
    op('X');  // BINUNICODE
    le32(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
  }
  std::uint32_t put() {
    const std::uint32_t idx = next_memo_++;
    if (idx < 256) { op('q'); op(static_cast<std::uint8_t>(idx)); }
    else { op('r'); le32(idx); }
    return idx;
  }
  void get(std::uint32_t idx) {
    if (idx < 256) { op('h'); op(static_cast<std::uint8_t>(idx)); }
    else { op('j'); le32(idx); }
  }

  std::string out_;
  std::array<std::uint32_t, kKeyCount> key_memo_{};
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> memo_;
  std::uint32_t next_memo_ = 0;
};

// ---- JSON ----
class JsonSink {
 public:
  JsonSink() { out_.reserve(1 << 20); }
  std::string finish() { out_.push_back('\n'); return std::move(out_); }

  void begin_dict() { value(); out_.push_back('{'); first_.push_back(true); }
  void end_dict() { out_.push_back('}'); first_.pop_back(); }
  void begin_list() { value(); out_.push_back('['); first_.push_back(true); }
  void end_list() { out_.push_back(']'); first_.pop_back(); }
  void pair_i64(std::int64_t a, std::int64_t b) { begin_list(); i64(a); i64(b); end_list(); }
  void key(Key k) {
    value();
    out_.push_back('"');
    out_.append(kKeyNames[k]);
    out_.append("\":");
    after_key_ = true;
  }
  void str(std::string_view s) { value(); quoted(s); }
  void dyn_key(std::string_view s) {
    value();
    quoted(s);
    out_.push_back(':');
    after_key_ = true;
  }
  void interned(std::string_view s) { str(s); }
  void none() { value(); out_.append("null"); }
  void boolean(bool b) { value(); out_.append(b ? "true" : "false"); }
  void f64(double v) { value(); out_.append(fmt::format("{}", v)); }
  void u64(std::uint64_t v) { value(); number(v); }
  void i64(std::int64_t v) { value(); number(v); }

 private:
  template <typename T>
  void number(T v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, r.ptr);
  }
  // Separates items of the innermost container; a value right after its key takes no comma.
  void value() {
    if (after_key_) { after_key_ = false; return; }
    if (first_.empty()) return;
    if (!first_.back()) out_.push_back(',');
    first_.back() = false;
  }
  void quoted(std::string_view s) {
    out_.push_back('"');
    for (char c : s) {
      switch (c) {
        case '"': out_.append("\\\""); break;
        case '\\': out_.append("\\\\"); break;
        case '\n': out_.append("\\n"); break;
        case '\r': out_.append("\\r"); break;
        case '\t': out_.append("\\t"); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            out_.append(fmt::format("\\u{:04x}", static_cast<unsigned>(c)));
          } else {
            out_.push_back(c);
          }
      }
    }
    out_.push_back('"');
  }

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

// ---- the dict, written the same way to either sink ----
template <typename Sink>
void write_value(Sink& s, const PickleValue& v) {
  using K = PickleValue::Kind;
  switch (v.kind()) {
    case K::none: s.none(); break;
    case K::boolean: s.boolean(v.as_bool()); break;
    case K::integer: s.i64(v.as_int()); break;
    case K::floating: s.f64(v.as_float()); break;
    case K::string:
    case K::bytes: s.str(v.as_string()); break;
    case K::list:
    case K::tuple:
    case K::set:
      s.begin_list();
      for (const auto& item : v.items()) write_value(s, item);
      s.end_list();
      break;
    case K::dict:
      s.begin_dict();
      for (const auto& [k, item] : v.dict_items()) {
        s.dyn_key(k.is_string() ? k.as_string() : k.to_repr());  // JSON and the viewer want str keys
        write_value(s, item);
      }
      s.end_dict();
      break;
  }
}

template <typename Sink>
void write_frames(Sink& s, const std::vector<SnapshotFrame>& frames) {
  s.key(kFrames);
  s.begin_list();
  for (const auto& f : frames) {
    s.begin_dict();
    s.key(kName); s.interned(f.name);
    s.key(kFilename); s.interned(f.filename);
    s.key(kLine); s.i64(f.line);
    s.end_dict();
  }
  s.end_list();
}

template <typename Sink>
void write_segment(Sink& s, const SnapshotSegment& seg) {
  s.begin_dict();
  s.key(kDevice); s.i64(seg.device);
  s.key(kAddress); s.u64(seg.address);
  s.key(kTotalSize); s.u64(seg.total_size_bytes);
  s.key(kAllocatedSize); s.u64(seg.allocated_size_bytes);
  s.key(kActiveSize); s.u64(seg.active_size_bytes);
  s.key(kRequestedSize); s.u64(seg.requested_size_bytes);
  s.key(kStream); s.u64(seg.stream);
  s.key(kSegmentType); s.interned(seg.segment_type.empty() ? std::string_view("large") : seg.segment_type);
  s.key(kSegmentPoolId); s.pair_i64(seg.pool_id.first, seg.pool_id.second);
  s.key(kIsExpandable); s.boolean(seg.is_expandable);
  write_frames(s, seg.frames);
  s.key(kBlocks);
  s.begin_list();
  for (const auto& b : seg.blocks) {
    s.begin_dict();
    s.key(kAddress); s.u64(b.address);
    s.key(kSize); s.u64(b.size_bytes);
    s.key(kRequestedSize); s.u64(b.requested_bytes);
    s.key(kState); s.interned(b.state);
    write_frames(s, b.frames);
    if (!b.op.empty()) { s.key(kOp); s.interned(b.op); }
    s.end_dict();
  }
  s.end_list();
  s.end_dict();
}

template <typename Sink>
void write_entry(Sink& s, const SnapshotTraceEntry& e) {
  s.begin_dict();
  s.key(kAction); s.interned(to_string(e.action));
  if (e.action == TraceAction::oom) {
    s.key(kDeviceFree); s.u64(e.device_free_bytes.value_or(0));
  } else {
    s.key(kAddr); s.u64(e.addr);
  }
  s.key(kSize); s.u64(e.size_bytes);
  s.key(kStream); s.u64(e.stream);
  s.key(kTimeUs); s.i64(e.time_us);
  s.key(kCompileContext); s.interned(e.compile_context.empty() ? std::string_view("N/A") : e.compile_context);
  s.key(kUserMetadata); s.interned(e.user_metadata);
  write_frames(s, e.frames);
  if (!e.op.empty()) { s.key(kOp); s.interned(e.op); }
  s.end_dict();
}

template <typename Sink>
void write_op_row(Sink& s, const OpRow& r) {
  s.begin_dict();
  s.key(kName); s.interned(r.name);
  s.key(kCalls); s.u64(r.calls);
  s.key(kAllocs); s.u64(r.allocs);
  s.key(kAllocatedBytes); s.u64(r.allocated_bytes);
  s.key(kLiveBytes); s.u64(r.live_bytes);
  s.key(kPeakContributionBytes); s.u64(r.peak_contribution_bytes);
  s.key(kReservedGrowthBytes); s.u64(r.reserved_growth_bytes);
  s.key(kFragDeltaBytes); s.i64(r.frag_delta_bytes);
  s.key(kWorstCallFragBeforeBytes); s.i64(r.worst_call_frag_before_bytes);
  s.key(kWorstCallFragAfterBytes); s.i64(r.worst_call_frag_after_bytes);
  s.end_dict();
}

template <typename Sink>
void write_snapshot_dict(Sink& s, const Snapshot& snap) {
  s.begin_dict();
  s.key(kSegments);
  s.begin_list();
  for (const auto& seg : snap.segments) write_segment(s, seg);
  s.end_list();

  s.key(kDeviceTraces);
  s.begin_list();
  for (const auto& trace : snap.device_traces) {
    s.begin_list();
    for (const auto& e : trace) write_entry(s, e);
    s.end_list();
  }
  s.end_list();

  s.key(kAllocatorSettings);
  if (snap.allocator_settings.is_dict()) {
    write_value(s, snap.allocator_settings);
  } else {
    s.begin_dict();
    s.key(kExpandableSegments); s.boolean(snap.expandable_segments);
    s.key(kMaxSplitSize); s.i64(snap.max_split_size);
    s.end_dict();
  }
  s.key(kExternalAnnotations);
  s.begin_list();
  s.end_list();

  s.key(kGpumem);
  s.begin_dict();
  s.key(kVersion); s.i64(GpumemSnapshotInfo::kVersion);
  s.key(kSettings); s.str(snap.gpumem.settings);
  s.key(kDeviceTotal); s.u64(snap.gpumem.device_total_bytes);
  s.key(kDeviceFree); s.u64(snap.gpumem.device_free_bytes);
  s.key(kCap); s.u64(snap.gpumem.cap_bytes);
  s.key(kOps);
  s.begin_list();
  for (const auto& r : snap.gpumem.ops) write_op_row(s, r);
  s.end_list();
  s.end_dict();

  s.end_dict();
}

}  // namespace

std::string snapshot_to_pickle(const Snapshot& snapshot) {
  PickleSink sink;
  write_snapshot_dict(sink, snapshot);
  return sink.finish();
}

std::string snapshot_to_json(const Snapshot& snapshot) {
  JsonSink sink;
  write_snapshot_dict(sink, snapshot);
  return sink.finish();
}

SnapshotFormat snapshot_format_for(const std::string& path) noexcept {
  constexpr std::string_view ext = ".json";
  if (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    return SnapshotFormat::json;
  }
  return SnapshotFormat::pickle;
}

void write_snapshot(const Snapshot& snapshot, const std::string& path) {
  const std::string bytes = snapshot_format_for(path) == SnapshotFormat::json ? snapshot_to_json(snapshot)
                                                                               : snapshot_to_pickle(snapshot);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    throw ForensicsError(fmt::format("{}: cannot write the snapshot ({}); check that the directory exists "
                                     "and is writable",
                                     path, std::strerror(errno)));
  }
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    throw ForensicsError(fmt::format("{}: writing the snapshot failed ({}); check free disk space", path,
                                     std::strerror(errno)));
  }
}

}  // namespace gpumem::forensics
