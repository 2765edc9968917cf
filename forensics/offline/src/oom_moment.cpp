#include "gpumem/forensics/oom_moment.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "segment_map.h"

namespace gpumem::forensics {
namespace {

// Applies entries [0, upto) of a trace to `map` (segments rebuilt forward from the trace's segment
// entries); with `block_bytes`, stores each alloc entry's block size there (0 if not placed).
template <class Entry>
void rebuild_forward(detail::SegmentMap& map, const std::vector<Entry>& trace, std::size_t upto,
                     std::vector<std::uint64_t>* block_bytes) {
  static const std::string kNoOp;
  static const std::vector<SnapshotFrame> kNoFrames;
  for (std::size_t i = 0; i < upto; ++i) {
    const auto& e = trace[i];
    switch (e.action) {
      case TraceAction::segment_alloc:
        map.add_range(e.addr, e.size_bytes, e.stream, false, e.size_bytes == (2u << 20));  // 2 MiB = small pool
        break;
      case TraceAction::segment_map: map.add_range(e.addr, e.size_bytes, e.stream, true, false); break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap: map.remove_range(e.addr, e.size_bytes); break;
      case TraceAction::alloc: {
        std::uint64_t size = 0;
        if constexpr (std::is_same_v<Entry, SnapshotTraceEntry>) {
          size = map.carve(e.addr, e.size_bytes, e.op, e.frames);
        } else {
          size = map.carve(e.addr, e.size_bytes, kNoOp, kNoFrames);
        }
        if (block_bytes) (*block_bytes)[i] = size;
        break;
      }
      case TraceAction::free_requested: map.set_state(e.addr, "active_allocated", "active_pending_free"); break;
      case TraceAction::free_completed: map.release(e.addr); break;
      default: break;
    }
  }
}

}  // namespace

std::vector<std::uint64_t> rebuilt_block_bytes(const std::vector<TraceEntry>& trace, int device) {
  const bool has_segment_entries = std::any_of(trace.begin(), trace.end(), [](const TraceEntry& e) {
    return e.action == TraceAction::segment_alloc || e.action == TraceAction::segment_map;
  });
  if (!has_segment_entries) return {};
  std::vector<std::uint64_t> sizes(trace.size(), 0);
  detail::SegmentMap map(device, {});
  rebuild_forward(map, trace, trace.size(), &sizes);
  return sizes;
}

StateAtMoment state_at_moment(const Snapshot& snapshot, int device, const Moment& moment) {
  StateAtMoment out;
  out.device = device;
  const auto& trace = trace_entries(snapshot, device);
  out.oom_entry = moment.oom_entry;
  out.moment_entries = std::min(moment.applied, trace.size());

  bool has_segments = false;
  for (const auto& s : snapshot.segments) has_segments |= s.device == device;
  bool trace_has_segment_entries = false;
  for (const auto& e : trace) {
    trace_has_segment_entries |= e.action == TraceAction::segment_alloc || e.action == TraceAction::segment_map;
  }

  if (!has_segments && trace_has_segment_entries) {
    detail::SegmentMap map(device, {});
    rebuild_forward(map, trace, out.moment_entries, nullptr);
    out.segments = map.segments();
    out.reconstructed = true;
    out.skipped_entries = map.skipped;
    return out;
  }

  if (!has_segments) {
    // Neither segments nor segment entries: the trace's allocations lie in no memory the file
    // describes. Count them, so that the report says so instead of showing 0 B allocated.
    for (std::size_t i = 0; i < out.moment_entries; ++i) out.skipped_entries += trace[i].action == TraceAction::alloc;
  }
  // Undo, newest first, what was recorded after the moment.
  detail::SegmentMap map(device, snapshot.segments);
  for (std::size_t i = trace.size(); i-- > out.moment_entries;) {
    const auto& e = trace[i];
    if (e.action == TraceAction::snapshot || e.action == TraceAction::oom) continue;  // change nothing
    ++out.rolled_back_entries;
    switch (e.action) {
      case TraceAction::free_completed:
        // The block was allocated at the moment (its free_requested, if any, is undone next).
        if (map.carve(e.addr, e.size_bytes, e.op, e.frames)) ++out.rolled_back_frees;
        break;
      case TraceAction::free_requested:
        // Still pending at the snapshot: allocated again. (If it completed, carve restored it.)
        if (map.set_state(e.addr, "active_pending_free", "active_allocated")) ++out.rolled_back_frees;
        break;
      case TraceAction::alloc: map.release(e.addr); break;
      case TraceAction::segment_alloc:
      case TraceAction::segment_map: map.remove_range(e.addr, e.size_bytes); break;
      case TraceAction::segment_free:
        map.add_range(e.addr, e.size_bytes, e.stream, false, e.size_bytes == (2u << 20));
        break;
      case TraceAction::segment_unmap: map.add_range(e.addr, e.size_bytes, e.stream, true, false); break;
      default: break;
    }
  }
  out.segments = map.segments();
  out.skipped_entries += map.skipped;
  return out;
}

StateAtMoment state_at_moment(const Snapshot& snapshot, int device) {
  const auto& trace = trace_entries(snapshot, device);
  bool has_oom = false;
  for (const auto& e : trace) has_oom |= e.action == TraceAction::oom;
  if (has_oom) return state_at_moment(snapshot, device, resolve_moment(snapshot, device, MomentSpec{MomentSpec::Kind::oom}));
  MomentSpec end;
  end.kind = MomentSpec::Kind::entry;
  end.entry = trace.size();
  return state_at_moment(snapshot, device, resolve_moment(snapshot, device, end));
}

}  // namespace gpumem::forensics
