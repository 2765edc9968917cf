// StreamFences: what the engine knows, without waiting, of how far the GPU has got on each stream,
// in the engine's own order of changes (RegionMap::tick). Recycling uses it to move only pieces
// whose memory is known idle (recycle_wait:fence; Note [Physical page recycling], "Fences instead of
// waits").
//
// A fence is a StreamEvents marker recorded on a stream at engine tick T. Every block that became
// free at a tick <= T was freed by the host after the work using it was queued on its stream (the
// caching allocator's contract: a block's last uses on its own stream are queued before its free;
// uses on other streams keep it pending until their markers complete), so once the fence completes,
// that memory is idle. Blocks carry the tick they last became free (Block::free_seq; a merged or
// reshaped block carries the newest tick of its parts, never an older one), so "idle" is one
// comparison: free_seq <= completed tick of the block's stream.
//
// Invariants: per stream, outstanding fences are in recording order with increasing ticks, all
// newer than completed_tick; at most kMaxOutstanding each. Every recorded marker is released once
// (when seen complete, or by release_all).
// Thread-safety: none of its own; the engine calls it under its lock (StreamEvents::record and
// query do not block, see stream_events.h). Never used while capturing (no query then).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc::detail {

class StreamFences {
 public:
  // Fences kept outstanding per stream at most: past it, no new fence is recorded until one
  // completes (what is freed meanwhile is known idle a little later), so a GPU far behind the CPU
  // costs a bounded number of events.
  static constexpr std::size_t kMaxOutstanding = 16;

  // Queries the outstanding fences of every stream, oldest first, and releases the completed ones
  // (a stream's markers complete in order, so the first one not complete ends the stream's scan).
  void poll(StreamEvents& events) {
    for (Stream& s : streams_) {
      std::size_t done = 0;
      while (done < s.fences.size() && events.query(s.fences[done].token)) {
        s.completed_tick = std::max(s.completed_tick, s.fences[done].tick);
        events.release(s.fences[done].token);
        ++done;
      }
      s.fences.erase(s.fences.begin(), s.fences.begin() + static_cast<std::ptrdiff_t>(done));
    }
  }

  // Whether memory that last became free at engine tick free_tick on `stream` is known idle.
  bool idle(StreamId stream, std::uint64_t free_tick) const {
    const Stream* s = find(stream);
    return s != nullptr && free_tick <= s->completed_tick;
  }

  // Makes sure a fence will tell when memory freed at free_tick on `stream` is idle: records one at
  // tick `now` (>= free_tick) unless an outstanding one already covers free_tick or the stream has
  // kMaxOutstanding outstanding. Returns whether it recorded.
  bool cover(StreamEvents& events, StreamId stream, std::uint64_t free_tick, std::uint64_t now) {
    Stream& s = at(stream);
    if (free_tick <= s.completed_tick) return false;
    if (!s.fences.empty() && s.fences.back().tick >= free_tick) return false;
    if (s.fences.size() >= kMaxOutstanding) return false;
    s.fences.push_back({events.record(stream), now});
    return true;
  }

  // The work queued on `stream` before engine tick `now` has completed (a stream synchronization
  // that began after tick `now` returned): the outstanding fences stay (each is released once, by
  // a later poll).
  void synchronized(StreamId stream, std::uint64_t now) {
    Stream& s = at(stream);
    s.completed_tick = std::max(s.completed_tick, now);
  }

  // Releases every outstanding fence (the engine's teardown).
  void release_all(StreamEvents& events) {
    for (Stream& s : streams_)
      for (const Fence& f : s.fences) events.release(f.token);
    streams_.clear();
  }

  std::size_t outstanding() const {
    std::size_t n = 0;
    for (const Stream& s : streams_) n += s.fences.size();
    return n;
  }

 private:
  struct Fence {
    EventToken token = 0;
    std::uint64_t tick = 0;  // the engine tick when it was recorded
  };
  struct Stream {
    StreamId id = 0;
    std::uint64_t completed_tick = 0;  // memory freed at or before this tick is idle on the GPU
    std::vector<Fence> fences;         // outstanding, oldest first
  };
  const Stream* find(StreamId stream) const {
    for (const Stream& s : streams_)
      if (s.id == stream) return &s;
    return nullptr;
  }
  Stream& at(StreamId stream) {
    for (Stream& s : streams_)
      if (s.id == stream) return s;
    streams_.push_back(Stream{stream, 0, {}});
    return streams_.back();
  }
  std::vector<Stream> streams_;  // few streams per engine: a linear scan
};

}  // namespace gpumem::alloc::detail
