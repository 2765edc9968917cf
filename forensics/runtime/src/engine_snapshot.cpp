#include "gpumem/forensics/engine_snapshot.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "gpumem/alloc/config.h"
#include "gpumem/alloc/memory_source.h"
#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {
namespace {

// Stack contexts to symbolize, each once, and where their frames go.
class FrameRequests {
 public:
  // Index of `context` in the batch (added on first sight); SIZE_MAX for null.
  std::size_t add(const std::shared_ptr<void>& context) {
    if (!context) return SIZE_MAX;
    auto [it, added] = index_.emplace(context.get(), contexts_.size());
    if (added) contexts_.push_back(context);
    return it->second;
  }
  std::vector<std::vector<SnapshotFrame>> symbolize(const StackSymbolizer* symbolizer) const {
    if (symbolizer == nullptr || contexts_.empty()) return {};
    auto frames = (*symbolizer)(contexts_);
    frames.resize(contexts_.size());
    return frames;
  }

 private:
  std::unordered_map<const void*, std::size_t> index_;
  std::vector<std::shared_ptr<void>> contexts_;
};

const char* state_name(alloc::BlockState s) {
  switch (s) {
    case alloc::BlockState::allocated: return "active_allocated";
    case alloc::BlockState::pending_free: return "active_pending_free";
    default: return "inactive";
  }
}

// Alloc records for the engine's live blocks whose own record the ring overwrote (their seq is older
// than its oldest record), rebuilt from the tracker's live-block table: the trace then holds the
// allocation of every block live now, as if the ring never evicted one that is still live. Blocks
// the trace skipped by kind (a history without allocs) are not added: only evicted ones.
std::vector<TraceRecord> evicted_live_allocs(const alloc::EngineSnapshot& engine, std::span<const TraceRecord> trace,
                                             const FragmentationTracker* tracker) {
  std::vector<TraceRecord> out;
  if (tracker == nullptr || trace.empty()) return out;
  std::uint64_t oldest = UINT64_MAX;
  for (const auto& r : trace) oldest = std::min(oldest, r.event.seq);
  std::unordered_map<std::uintptr_t, LiveBlockInfo> live;
  bool fetched = false;
  for (const auto& view : engine.segments) {
    for (const auto& b : view.blocks) {
      const bool is_live = b.state == alloc::BlockState::allocated || b.state == alloc::BlockState::pending_free;
      if (!is_live || b.alloc_seq == 0 || b.alloc_seq >= oldest) continue;
      if (!fetched) {  // only when some block needs it
        live = tracker->live_blocks();
        fetched = true;
      }
      const auto it = live.find(b.addr);
      if (it == live.end() || it->second.seq != b.alloc_seq) continue;
      const LiveBlockInfo& info = it->second;
      TraceRecord r;
      r.event.kind = alloc::EventKind::alloc;
      r.event.pool = view.pool;
      r.event.device = static_cast<std::int8_t>(view.device);
      r.event.addr = b.addr;
      r.event.size_bytes = b.size_bytes;
      r.event.requested_bytes = b.requested_bytes;
      r.event.stream = view.stream;
      r.event.seq = b.alloc_seq;
      r.event.t_ns = info.t_ns;
      r.op = info.op;
      r.scope = info.scope;
      if (info.context) {
        auto notes = std::make_shared<TraceNotes>();
        notes->stack_context = info.context;
        r.notes = std::move(notes);
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace

std::optional<TraceAction> trace_action_of(alloc::EventKind kind) noexcept {
  using alloc::EventKind;
  switch (kind) {
    case EventKind::alloc: return TraceAction::alloc;
    case EventKind::free_requested: return TraceAction::free_requested;
    case EventKind::free_completed: return TraceAction::free_completed;
    case EventKind::segment_alloc: return TraceAction::segment_alloc;
    case EventKind::segment_free: return TraceAction::segment_free;
    case EventKind::segment_map: return TraceAction::segment_map;
    case EventKind::segment_unmap: return TraceAction::segment_unmap;
    case EventKind::oom: return TraceAction::oom;
    case EventKind::snapshot: return TraceAction::snapshot;
    case EventKind::empty_cache: return std::nullopt;
  }
  return std::nullopt;
}

Snapshot snapshot_from_engine(const alloc::EngineSnapshot& engine, std::span<const TraceRecord> trace,
                              const EngineSnapshotExtras& extras) {
  const OpRegistry& names = OpRegistry::global();
  Snapshot snap;
  snap.source = "gpumem engine";
  snap.gpumem.version = GpumemSnapshotInfo::kVersion;
  snap.gpumem.settings = engine.settings;
  snap.gpumem.device_total_bytes = extras.device_total_bytes;
  snap.gpumem.device_free_bytes = extras.device_free_bytes;
  snap.gpumem.cap_bytes = engine.totals.cap_bytes == alloc::kNoLimit ? 0 : engine.totals.cap_bytes;
  snap.gpumem.op_frames = true;
  snap.expandable_segments = std::any_of(engine.segments.begin(), engine.segments.end(),
                                         [](const alloc::SegmentView& s) { return s.expandable; });

  // Trace, by seq, with the alloc records of live blocks the ring no longer holds.
  const auto by_seq = [](const TraceRecord* a, const TraceRecord* b) { return a->event.seq < b->event.seq; };
  const std::vector<TraceRecord> evicted = evicted_live_allocs(engine, trace, extras.tracker);
  std::vector<const TraceRecord*> order;
  order.reserve(evicted.size() + trace.size());
  for (const auto& r : evicted) order.push_back(&r);
  for (const auto& r : trace) order.push_back(&r);
  if (!std::is_sorted(order.begin(), order.end(), by_seq)) std::sort(order.begin(), order.end(), by_seq);
  const auto steady_now = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now().time_since_epoch()).count();
  const auto unix_now = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  const std::int64_t offset_us = unix_now - steady_now;

  // Pinned host memory (device -1) has a trace of its own; a CUDA device's goes to its index.
  std::vector<SnapshotTraceEntry>* trace_out = &snap.host_trace;
  if (engine.device != kPinnedHostDevice) {
    const std::size_t device = engine.device < 0 ? 0 : static_cast<std::size_t>(engine.device);
    snap.device_traces.resize(device + 1);
    trace_out = &snap.device_traces[device];
  }
  auto& out = *trace_out;
  out.reserve(order.size());
  // The alloc record (op, stack context) of a live block, by its seq and address: a binary search
  // of `order` (sorted by seq), once per live block, rather than a hash entry per alloc record.
  // Seqs are per engine and the ring holds the private pools' events too, so a seq may repeat: the
  // address tells them apart (engines' blocks never overlap).
  const auto alloc_record = [&order](std::uint64_t seq, std::uintptr_t addr) -> const TraceRecord* {
    const TraceRecord* found = nullptr;
    auto it = std::lower_bound(order.begin(), order.end(), seq,
                               [](const TraceRecord* r, std::uint64_t s) { return r->event.seq < s; });
    for (; it != order.end() && (*it)->event.seq == seq; ++it) {
      if ((*it)->event.kind == alloc::EventKind::alloc && (*it)->event.addr == addr) found = *it;
    }
    return found;
  };
  FrameRequests requests;
  std::vector<std::size_t> entry_frames;  // per entry: index into the symbolized batch
  std::vector<std::string> name_cache;  // by id (ids are dense)
  std::vector<bool> named;
  auto name_of = [&](std::uint32_t id) -> const std::string& {
    if (id >= name_cache.size()) {
      name_cache.resize(id + 1);
      named.resize(id + 1);
    }
    if (!named[id]) {
      name_cache[id] = names.name(id);
      named[id] = true;
    }
    return name_cache[id];
  };
  std::size_t last_oom = SIZE_MAX;
  for (const TraceRecord* r : order) {
    const auto action = trace_action_of(r->event.kind);
    if (!action) continue;
    const auto& e = r->event;
    SnapshotTraceEntry s;
    s.action = *action;
    const bool block_event = *action == TraceAction::alloc || *action == TraceAction::free_requested ||
                             *action == TraceAction::free_completed || *action == TraceAction::oom;
    s.addr = *action == TraceAction::oom ? 0 : e.addr;
    s.size_bytes = block_event ? e.requested_bytes : e.size_bytes;
    s.stream = static_cast<std::uint64_t>(e.stream);
    s.time_us = static_cast<std::int64_t>(e.t_ns / 1000) + offset_us;
    s.op = name_of(r->op);
    s.user_metadata = name_of(r->scope);
    if (*action == TraceAction::oom) last_oom = out.size();
    entry_frames.push_back(*action == TraceAction::alloc || *action == TraceAction::oom ? requests.add(r->stack_context())
                                                                                       : SIZE_MAX);
    out.push_back(std::move(s));
  }
  if (last_oom != SIZE_MAX) out[last_oom].device_free_bytes = extras.oom_device_free_bytes.value_or(0);

  // Blocks whose alloc the ring no longer holds: what the tracker knows.
  std::unordered_map<std::uintptr_t, LiveBlockInfo> older;
  if (extras.tracker) older = extras.tracker->live_blocks();
  struct BlockRef {
    std::size_t segment, block, frames;
  };
  std::vector<BlockRef> block_frames;

  // Segments: classic segments whole, expandable regions split into mapped runs; the engine's
  // (pool (0, 0)), then each private pool's.
  auto add_segments = [&](const alloc::EngineSnapshot& from, std::pair<std::int64_t, std::int64_t> pool_id) {
    for (const auto& view : from.segments) {
      SnapshotSegment cur;
      bool open = false;
      auto flush = [&]() {
        if (!open) return;
        recompute_sizes(cur);
        snap.segments.push_back(std::move(cur));
        cur = SnapshotSegment{};
        open = false;
      };
      for (const auto& b : view.blocks) {
        if (b.state == alloc::BlockState::unmapped) {
          flush();
          continue;
        }
        if (!open) {
          cur.device = view.device;
          cur.address = b.addr;
          cur.stream = static_cast<std::uint64_t>(view.stream);
          cur.segment_type = view.pool == alloc::PoolKind::small ? "small" : "large";
          cur.is_expandable = view.expandable;
          cur.pool_id = pool_id;
          open = true;
        }
        SnapshotBlock sb;
        sb.address = b.addr;
        sb.size_bytes = b.size_bytes;
        sb.requested_bytes = b.state == alloc::BlockState::allocated || b.state == alloc::BlockState::pending_free
                                 ? b.requested_bytes
                                 : 0;
        sb.state = state_name(b.state);
        if (sb.state != "inactive") {
          std::uint32_t op = 0;
          std::size_t frames = SIZE_MAX;
          if (const TraceRecord* rec = alloc_record(b.alloc_seq, b.addr); rec != nullptr) {
            op = rec->op;
            frames = requests.add(rec->stack_context());
          } else if (auto old = older.find(b.addr); old != older.end()) {
            op = old->second.op;
            frames = requests.add(old->second.context);
          }
          sb.op = name_of(op);
          if (frames != SIZE_MAX) block_frames.push_back(BlockRef{snap.segments.size(), cur.blocks.size(), frames});
        }
        cur.blocks.push_back(std::move(sb));
      }
      flush();
    }
  };
  add_segments(engine, {0, 0});
  for (const auto& pool : extras.pools) add_segments(pool.engine, pool.pool_id);

  // Frames, symbolized once per distinct context.
  const auto frames = requests.symbolize(extras.symbolize);
  if (!frames.empty()) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (entry_frames[i] != SIZE_MAX) out[i].frames = frames[entry_frames[i]];
    }
    for (const auto& ref : block_frames) snap.segments[ref.segment].blocks[ref.block].frames = frames[ref.frames];
  }
  std::sort(snap.segments.begin(), snap.segments.end(),
            [](const SnapshotSegment& a, const SnapshotSegment& b) { return a.address < b.address; });
  return snap;
}

}  // namespace gpumem::forensics
