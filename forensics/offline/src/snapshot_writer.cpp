#include "gpumem/forensics/snapshot_writer.h"

#include <algorithm>
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
  kVersion, kSettings, kDeviceTotal, kCap,
  kExpandableSegments, kMaxSplitSize, kOpFrames, kHostTrace,
  kKeyCount
};

constexpr std::array<std::string_view, kKeyCount> kKeyNames = {
    "segments", "device_traces", "allocator_settings", "external_annotations", "gpumem",
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
    "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
    "size", "state", "op",
    "action", "addr", "time_us", "device_free", "compile_context", "user_metadata",
    "name", "filename", "line",
    "version", "settings", "device_total", "cap",
    "expandable_segments", "max_split_size", "op_frames", "host_trace",
};

bool same_frames(const std::vector<SnapshotFrame>& a, const std::vector<SnapshotFrame>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].line != b[i].line || a[i].name != b[i].name || a[i].filename != b[i].filename) return false;
  }
  return true;
}

// ---- pickle protocol 2 ----
// Writes into a buffer of its own; with a file (`spill`), the buffer is a window that is written
// out whenever it fills, so a snapshot of any size goes to its file through one fixed buffer (no
// buffer the size of the file to allocate, fault in and copy). Memo indices count values, not
// bytes, so spilling changes nothing in what is written.
class PickleSink {
 public:
  explicit PickleSink(std::size_t size_hint = 1 << 20, std::FILE* spill = nullptr) : spill_(spill) {
    out_.resize(std::max<std::size_t>(size_hint, 1 << 16));
    key_memo_.fill(UINT32_MAX);
    op(0x80);  // PROTO
    op(2);
  }
  // The pickle (without a file), or "" after writing what is left to the file.
  std::string finish() {
    op('.');  // STOP
    if (spill_ != nullptr) {
      spill();
      return {};
    }
    out_.resize(pos_);
    return std::move(out_);
  }
  // With a file: whether every write to it succeeded.
  bool spill_ok() const noexcept { return spill_ok_; }

  // Writes every key and the most common values once, first, under the top-level key
  // "gpumem_keys", so that they get the lowest memo indices (2-byte BINGETs); readers ignore it.
  void preamble() {
    raw_str("gpumem_keys");
    put();
    op(']');
    op('(');
    for (int k = 0; k < kKeyCount; ++k) key(static_cast<Key>(k));
    // ... and the values that repeat in every entry or block.
    for (const char* v : {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                          "segment_unmap", "snapshot", "oom", "N/A", "", "??", "inactive", "active_allocated",
                          "active_pending_free", "large", "small"}) {
      interned(v);
    }
    op('e');
  }
  void begin_dict() { op2('}', '('); }     // EMPTY_DICT MARK
  void end_dict() { op('u'); }              // SETITEMS
  void begin_list() { op2(']', '('); }     // EMPTY_LIST MARK
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
    // A small direct-mapped cache in front of the hash map: snapshot strings repeat a lot.
    auto& slot = recent_[recent_slot(s)];
    if (slot.idx != UINT32_MAX && slot.text == s) return get(slot.idx);
    auto it = memo_.find(s);
    if (it != memo_.end()) {
      slot.text.assign(s);
      slot.idx = it->second;
      return get(it->second);
    }
    raw_str(s);
    const std::uint32_t idx = put();
    memo_.emplace(std::string(s), idx);
    slot.text.assign(s);
    slot.idx = idx;
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
      op2('K', static_cast<std::uint8_t>(v));
    } else if (v < 65536) {
      ensure(3);
      out_[pos_] = 'M';
      out_[pos_ + 1] = static_cast<char>(static_cast<std::uint8_t>(v));
      out_[pos_ + 2] = static_cast<char>(static_cast<std::uint8_t>(v >> 8));
      pos_ += 3;
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
      append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(n));
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
    append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(n));
  }

  // A frames list already written with the same content is referred to through the memo (the
  // readers then share one list object between the entries, which they only read).
  bool reuse_frames(const std::vector<SnapshotFrame>& frames) {
    if (frames.empty()) {  // not worth a memo slot
      op(']');
      return true;
    }
    const std::uint64_t h = hash_frames(frames);
    auto it = frames_memo_.find(h);
    if (it != frames_memo_.end() && same_frames(*it->second.first, frames)) {
      get(it->second.second);
      return true;
    }
    pending_frames_ = &frames;
    pending_hash_ = h;
    return false;
  }
  // The synthesized op frames of (op, scope), when written before.
  bool reuse_op_frames(std::string_view op_name, std::string_view scope) {
    const std::uint32_t a = memo_index(op_name);
    const std::uint32_t b = scope.empty() ? 0xffffffffu : memo_index(scope);
    if (a == UINT32_MAX || b == UINT32_MAX) return false;
    const std::uint64_t key = std::uint64_t{a} << 32 | b;
    if (key == last_op_frames_key_) {
      get(last_op_frames_idx_);
      return true;
    }
    auto it = op_frames_memo_.find(key);
    if (it == op_frames_memo_.end()) return false;
    last_op_frames_key_ = key;
    last_op_frames_idx_ = it->second;
    get(it->second);
    return true;
  }
  // The memo index of a string written before, or UINT32_MAX.
  std::uint32_t memo_index(std::string_view s) {
    auto& slot = recent_[recent_slot(s)];
    if (slot.idx != UINT32_MAX && slot.text == s) return slot.idx;
    auto it = memo_.find(s);
    if (it == memo_.end()) return UINT32_MAX;
    slot.text.assign(s);
    slot.idx = it->second;
    return it->second;
  }
  std::uint32_t begin_op_frames_list() {
    op(']');
    const std::uint32_t idx = put();
    op('(');
    return idx;
  }
  void remember_op_frames(std::string_view op_name, std::string_view scope, std::uint32_t list_idx) {
    const std::uint32_t a = memo_index(op_name);
    const std::uint32_t b = scope.empty() ? 0xffffffffu : memo_index(scope);
    if (a == UINT32_MAX || b == UINT32_MAX) return;
    op_frames_memo_[std::uint64_t{a} << 32 | b] = list_idx;
  }
  void begin_frames_list() {
    op(']');
    const std::uint32_t idx = put();
    if (pending_frames_) frames_memo_[pending_hash_] = {pending_frames_, idx};
    pending_frames_ = nullptr;
    op('(');
  }

 private:
  static std::uint64_t hash_frames(const std::vector<SnapshotFrame>& frames) noexcept {
    std::uint64_t h = 1469598103934665603ull ^ frames.size();
    auto mix = [&h](std::string_view s) {
      for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
      h = (h ^ 0xff) * 1099511628211ull;
    };
    for (const auto& f : frames) {
      mix(f.name);
      mix(f.filename);
      h = (h ^ static_cast<std::uint64_t>(f.line)) * 1099511628211ull;
    }
    return h;
  }
  // The byte writers are the pickler's hot path (a few per value): inlined, with the growth out of
  // line.
  [[gnu::always_inline]] void ensure(std::size_t n) {
    if (pos_ + n > out_.size()) [[unlikely]] grow(n);
  }
  [[gnu::noinline]] void grow(std::size_t n) {
    if (spill_ != nullptr) {
      spill();
      if (n <= out_.size()) return;
    }
    out_.resize(std::max(out_.size() * 2, pos_ + n));
  }
  void spill() {
    if (pos_ != 0 && std::fwrite(out_.data(), 1, pos_, spill_) != pos_) spill_ok_ = false;
    pos_ = 0;
  }
  void append(const char* p, std::size_t n) {
    ensure(n);
    std::memcpy(out_.data() + pos_, p, n);
    pos_ += n;
  }
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  [[gnu::always_inline]] void op(std::uint8_t b) {
    ensure(1);
    out_[pos_++] = static_cast<char>(b);
  }
  // Two bytes with one bounds check (an opcode and its one-byte argument).
  [[gnu::always_inline]] void op2(std::uint8_t a, std::uint8_t b) {
    ensure(2);
    out_[pos_] = static_cast<char>(a);
    out_[pos_ + 1] = static_cast<char>(b);
    pos_ += 2;
  }
  void le32(std::uint32_t v) {
    char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
    append(b, 4);
  }
  void raw_str(std::string_view s) {
    op('X');  // BINUNICODE
    le32(static_cast<std::uint32_t>(s.size()));
    append(s.data(), s.size());
  }
  std::uint32_t put() {
    const std::uint32_t idx = next_memo_++;
    if (idx < 256) { op2('q', static_cast<std::uint8_t>(idx)); }
    else { op('r'); le32(idx); }
    return idx;
  }
  void get(std::uint32_t idx) {
    if (idx < 256) { op2('h', static_cast<std::uint8_t>(idx)); }
    else { op('j'); le32(idx); }
  }

  std::string out_;
  std::size_t pos_ = 0;
  std::FILE* spill_ = nullptr;
  bool spill_ok_ = true;
  std::unordered_map<std::uint64_t, std::pair<const std::vector<SnapshotFrame>*, std::uint32_t>> frames_memo_;
  struct Recent {
    std::string text;
    std::uint32_t idx = UINT32_MAX;
  };
  static std::size_t recent_slot(std::string_view s) noexcept {
    if (s.empty()) return 0;
    const auto c = [&](std::size_t i) { return static_cast<std::size_t>(static_cast<unsigned char>(s[i])); };
    return (s.size() * 31 + c(0) + c(s.size() - 1) * 7 + c(s.size() / 2) * 13 + c(s.size() / 3) * 5) & 127;
  }
  std::array<Recent, 128> recent_{};
  std::unordered_map<std::uint64_t, std::uint32_t> op_frames_memo_;
  std::uint64_t last_op_frames_key_ = UINT64_MAX;
  std::uint32_t last_op_frames_idx_ = 0;
  const std::vector<SnapshotFrame>* pending_frames_ = nullptr;
  std::uint64_t pending_hash_ = 0;
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
  void preamble() {}
  bool reuse_frames(const std::vector<SnapshotFrame>&) { return false; }
  void begin_frames_list() { begin_list(); }
  bool reuse_op_frames(std::string_view, std::string_view) { return false; }
  std::uint32_t begin_op_frames_list() { begin_list(); return 0; }
  void remember_op_frames(std::string_view, std::string_view, std::uint32_t) {}
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
  if (s.reuse_frames(frames)) return;
  s.begin_frames_list();
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
void write_frame(Sink& s, std::string_view name) {
  s.begin_dict();
  s.key(kName); s.interned(name);
  s.key(kFilename); s.interned("??");
  s.key(kLine); s.i64(0);
  s.end_dict();
}

// Frames, or (op_frames on, no frames, an op) frames naming the op and the user scope.
template <typename Sink>
void write_frames_or_op(Sink& s, const std::vector<SnapshotFrame>& frames, bool op_frames, std::string_view op,
                        std::string_view scope) {
  if (!op_frames || !frames.empty() || op.empty()) return write_frames(s, frames);
  s.key(kFrames);
  if (s.reuse_op_frames(op, scope)) return;
  const std::uint32_t idx = s.begin_op_frames_list();
  write_frame(s, op);
  if (!scope.empty()) write_frame(s, scope);
  s.end_list();
  s.remember_op_frames(op, scope, idx);
}

template <typename Sink>
void write_segment(Sink& s, const SnapshotSegment& seg, bool op_frames) {
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
    write_frames_or_op(s, b.frames, op_frames, b.op, {});
    if (!b.op.empty()) { s.key(kOp); s.interned(b.op); }
    s.end_dict();
  }
  s.end_list();
  s.end_dict();
}

template <typename Sink>
void write_entry(Sink& s, const SnapshotTraceEntry& e, bool op_frames) {
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
  write_frames_or_op(s, e.frames, op_frames, e.op, e.user_metadata);
  if (!e.op.empty()) { s.key(kOp); s.interned(e.op); }
  s.end_dict();
}

template <typename Sink>
void write_snapshot_dict(Sink& s, const Snapshot& snap) {
  s.begin_dict();
  s.preamble();
  s.key(kSegments);
  s.begin_list();
  for (const auto& seg : snap.segments) write_segment(s, seg, snap.gpumem.op_frames);
  s.end_list();

  s.key(kDeviceTraces);
  s.begin_list();
  for (const auto& trace : snap.device_traces) {
    s.begin_list();
    for (const auto& e : trace) write_entry(s, e, snap.gpumem.op_frames);
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
  s.key(kOpFrames); s.boolean(snap.gpumem.op_frames);
  // Pinned host memory's trace (device -1): here, not in device_traces, which PyTorch's tools
  // index by CUDA device. Its segments are in 'segments', with device -1.
  if (!snap.host_trace.empty()) {
    s.key(kHostTrace);
    s.begin_list();
    for (const auto& e : snap.host_trace) write_entry(s, e, snap.gpumem.op_frames);
    s.end_list();
  }
  s.end_dict();

  s.end_dict();
}

}  // namespace

std::string snapshot_to_pickle(const Snapshot& snapshot) {
  std::size_t entries = 0, blocks = 0;
  for (const auto& t : snapshot.device_traces) entries += t.size();
  entries += snapshot.host_trace.size();
  for (const auto& seg : snapshot.segments) blocks += seg.blocks.size();
  PickleSink sink(entries * 64 + blocks * 64 + (1 << 16));  // about what an entry takes
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
  const bool json = snapshot_format_for(path) == SnapshotFormat::json;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    throw ForensicsError(fmt::format("{}: cannot write the snapshot ({}); check that the directory exists "
                                     "and is writable",
                                     path, std::strerror(errno)));
  }
  bool ok = true;
  try {
    if (json) {
      const std::string bytes = snapshot_to_json(snapshot);
      ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    } else {
      // Straight to the file through a 1 MiB window (see PickleSink).
      PickleSink sink(std::size_t{1} << 20, f);
      write_snapshot_dict(sink, snapshot);
      sink.finish();
      ok = sink.spill_ok();
    }
  } catch (...) {
    std::fclose(f);
    throw;
  }
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    throw ForensicsError(fmt::format("{}: writing the snapshot failed ({}); check free disk space", path,
                                     std::strerror(errno)));
  }
}

}  // namespace gpumem::forensics
