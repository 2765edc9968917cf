// AllocEvent: one plain record per state change of the engine, in PyTorch's trace vocabulary so
// traces convert both ways (PyTorch 2.11's TraceEntry actions, c10/core/CachingDeviceAllocator.h).
//
// The engine emits events; it does not count. Observers (stats, trace ring, op attribution,
// fragmentation tracker, OOM hook) turn them into numbers. Events are collected under the engine's
// lock and published after it is dropped, in the order the engine produced them for that call;
// `seq` orders events of different threads totally (it is taken under the lock).
//
// Thread-safety: on_events may be called concurrently from several threads (one batch per engine
// call); observers synchronize themselves. An observer must not call back into the engine that is
// publishing to it from inside on_events, except through const queries that take no lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc {

enum class EventKind : std::uint8_t {
  alloc,           // a block was handed to the user: addr, size_bytes (rounded), requested_bytes
  free_requested,  // the user freed a block; it may still wait for other streams
  free_completed,  // the block is free for reuse (merged back into the cache)
  segment_alloc,   // a new non-expandable segment (cudaMalloc-style): addr, size_bytes
  segment_free,    // a non-expandable segment went back to the source
  segment_map,     // physical pieces mapped into an expandable region: addr, size_bytes
  segment_unmap,   // physical pieces unmapped from an expandable region
  oom,             // a request failed: size_bytes = rounded request, requested_bytes = request
  empty_cache,     // empty_cache() ran (size_bytes = bytes released)
  snapshot,        // an introspection snapshot was taken (size_bytes = active bytes)
};

const char* to_string(EventKind kind) noexcept;

enum class PoolKind : std::uint8_t { small = 0, large = 1 };

struct AllocEvent {
  EventKind kind = EventKind::alloc;
  PoolKind pool = PoolKind::large;
  std::int8_t device = 0;
  // segment_map / segment_unmap: how many physical pieces were created (map) or destroyed
  // (unmap) for this event rather than recycled; lets observers count create/release calls.
  std::uint16_t pieces_created_or_destroyed = 0;
  std::uintptr_t addr = 0;
  std::size_t size_bytes = 0;       // rounded block size, segment/mapping size
  std::size_t requested_bytes = 0;  // the user's request (alloc, frees, oom)
  StreamId stream = 0;
  std::uint64_t seq = 0;            // engine-wide order
  std::uint64_t t_ns = 0;           // steady clock, ns
};

// What an observer needs filled in beyond the event itself, or that it needs no events at all.
// Read on every engine call (one relaxed atomic load per observer, no virtual call), so an
// observer may change its answer at any time (a trace ring that is turned on): set_needs() takes
// effect from the next engine call. Reading the clock and numbering events cost more than the rest
// of an engine call on some machines: leave them out where nobody reads them.
enum ObserverNeeds : unsigned {
  kNeedsNothing = 0,
  kNeedsTimestamps = 1u << 0,  // AllocEvent::t_ns
  kNeedsSequence = 1u << 1,    // AllocEvent::seq
  // Asleep: the engine neither calls on_events nor builds events for this observer; when every
  // observer of an engine sleeps, an engine call costs what it costs with none attached.
  kSleeping = 1u << 2,
};

class AllocObserver {
 public:
  explicit AllocObserver(unsigned needs = kNeedsTimestamps | kNeedsSequence) noexcept : needs_(needs) {}
  virtual ~AllocObserver() = default;
  AllocObserver(const AllocObserver&) = delete;
  AllocObserver& operator=(const AllocObserver&) = delete;
  virtual void on_events(std::span<const AllocEvent> events) = 0;
  // ObserverNeeds bits. Any thread, any time.
  unsigned needs() const noexcept { return needs_.load(std::memory_order_relaxed); }
  bool sleeping() const noexcept { return (needs() & kSleeping) != 0; }

 protected:
  void set_needs(unsigned needs) noexcept { needs_.store(needs, std::memory_order_relaxed); }

 private:
  std::atomic<unsigned> needs_;
};

}  // namespace gpumem::alloc
