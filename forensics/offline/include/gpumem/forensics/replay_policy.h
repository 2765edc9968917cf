// ReplayPolicy: the narrow interface the replay drives. A policy is an allocator under test: it
// serves requested sizes on streams with addresses of its own and reports what it holds.
//
// Contract:
//   * allocate(requested_bytes, stream) returns the address of a block of at least
//     requested_bytes, or nullopt if the policy cannot serve it (its memory cap or the device's
//     capacity is reached after it tried everything it would try). requested_bytes > 0.
//   * free(addr) takes an address allocate returned and that was not freed since; the block is
//     immediately reusable (the replay has no cross-stream uses to wait for).
//   * allocated_bytes(): bytes of live blocks as the policy sizes them (rounded);
//     reserved_bytes(): device memory the policy holds (segments, mapped or cached pages).
//     Both are O(1): the replay reads them after every call.
//   * counters(): the calls to the memory provider so far. Their meaning per policy:
//       creates  - cudaMalloc calls (classic) or physical pages/pieces created (cuMemCreate)
//       releases - cudaFree calls (classic) or physical pieces released (cuMemRelease)
//       maps     - physical pieces mapped (cuMemMap + cuMemSetAccess), unmaps - pieces unmapped
//   * breakdown(): where reserved-but-unrequested bytes sit right now (may walk all blocks).
//
// Thread-safety: a policy is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

struct PolicyCounters {
  std::uint64_t segments = 0;       // segments (or expandable regions) that exist now
  std::uint64_t creates = 0;
  std::uint64_t releases = 0;
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  // Stream synchronizations a growth made before unmapping (or moving a piece to another stream):
  // each drains the stream's queued work, and the CPU/GPU overlap with it.
  std::uint64_t syncs = 0;
  // Waits for one marker (recycle_wait:fence: a kept mapping in the way waits for the marker
  // recorded when its piece moved away, not for its stream), and the time they waited in all: the
  // replay's lag left before the marker completes, at most a synchronization's charge each.
  std::uint64_t marker_waits = 0;
  std::uint64_t marker_wait_ns = 0;
  std::uint64_t alloc_retries = 0;  // times the policy freed cached memory and retried
};

// The calls made between two readings (after - before, counter by counter), and a running sum of
// such differences. `segments` is a state, not a count of calls: the difference leaves it 0 and
// the sum leaves it as it was.
PolicyCounters operator-(const PolicyCounters& after, const PolicyCounters& before) noexcept;
PolicyCounters& operator+=(PolicyCounters& sum, const PolicyCounters& more) noexcept;

// What reserved memory is used for at one moment. The parts add up:
//   reserved = requested + rounding + inactive_split + cached_free + partly_used_granules.
struct WasteBreakdown {
  std::size_t requested_bytes = 0;       // live bytes the program asked for
  std::size_t allocated_bytes = 0;       // live blocks as the policy sized them
  std::size_t reserved_bytes = 0;
  // allocated - requested: rounding of request sizes to the policy's block sizes.
  std::size_t rounding_bytes = 0;
  // Free blocks inside segments that also hold live blocks (classic segments): cached but only
  // usable by requests that fit the hole.
  std::size_t inactive_split_bytes = 0;
  // Free memory that could be given back whole: unsplit free segments, wholly free pages of
  // expandable regions, physical pieces held unmapped.
  std::size_t cached_free_bytes = 0;
  // Free bytes on physical pages (granules) that also hold live bytes (expandable regions).
  std::size_t partly_used_granule_bytes = 0;
};

// Per-call costs of the provider calls a policy's counters count, in microseconds.
struct CallCosts {
  double create_us = 0;
  double release_us = 0;
  double map_us = 0;
  double unmap_us = 0;
  double sync_us = 0;  // one stream synchronization made for recycling (call_costs.h)
};

class ReplayPolicy {
 public:
  virtual ~ReplayPolicy() = default;

  // Called once before the first allocate with the trace about to be replayed; a policy may learn
  // from it what the trace says about the machine (the PyTorch model takes cudaMalloc's addresses
  // from the segment_alloc entries). The default ignores it.
  virtual void prepare(const Trace& trace) { (void)trace; }

  // The name the user gave ("pytorch", "pytorch:expandable", "gpumem", "gpumem:CONF").
  virtual const std::string& name() const noexcept = 0;

  // The traced time of the entry replayed next, in microseconds from the trace's first entry
  // (never decreasing). A policy whose decisions depend on time uses it as its clock; the default
  // ignores it.
  virtual void set_time_us(std::int64_t t_us) { (void)t_us; }

  // A training step starts at the request replayed next (ReplayOptions::step_marker_bytes). A
  // policy that learns steps (gpumem+plan) uses it; the default ignores it.
  virtual void mark_step() {}
  // One line on what the policy did that its counters do not say (empty: nothing).
  virtual std::string notes() const { return {}; }

  virtual std::optional<std::uint64_t> allocate(std::size_t requested_bytes, std::uint64_t stream) = 0;
  virtual void free(std::uint64_t addr) = 0;

  virtual std::size_t allocated_bytes() const noexcept = 0;
  virtual std::size_t reserved_bytes() const noexcept = 0;
  virtual PolicyCounters counters() const = 0;
  // The same call counters, for a reader of every step (the replay's call groups); `segments`
  // need not be filled in. The default is counters(); a policy whose segment count costs more than
  // the rest overrides it.
  virtual PolicyCounters calls() const { return counters(); }
  virtual WasteBreakdown breakdown() const = 0;
  // What the counted calls cost on an H200 (see call_costs.h).
  virtual CallCosts call_costs() const noexcept = 0;
};

}  // namespace gpumem::forensics
