// TraceRing: a bounded history of an engine's events, the trace of gpumem's snapshots. An
// AllocObserver that copies each event, tagged with the op and user scope current on the thread
// that published it (when op recording is on), into a ring whose oldest records are overwritten.
//
// Cost: with record_ops off, tagging is one branch per batch; the ring's lock is held only for
// copying the batch's records in (no allocation, no call out). Capacity is fixed at
// construction (default kDefaultCapacity: about 50 training steps of BERT-base; 56 bytes a record).
//
// Invariants: size() <= capacity(); records() is oldest first, in publication order;
// dropped() counts records overwritten since construction or clear().
// Thread-safety: all members may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "gpumem/alloc/events.h"

namespace gpumem::forensics {

struct TraceRecord {
  alloc::AllocEvent event;
  std::uint32_t op = 0;     // OpRegistry id of the innermost op, 0 = none / not recorded
  std::uint32_t scope = 0;  // OpRegistry id of the innermost user scope, 0 = none
};

class TraceRing final : public alloc::AllocObserver {
 public:
  static constexpr std::size_t kDefaultCapacity = 262144;

  explicit TraceRing(std::size_t capacity = kDefaultCapacity, bool record_ops = false);

  void on_events(std::span<const alloc::AllocEvent> events) override;

  std::vector<TraceRecord> records() const;
  std::size_t size() const;
  std::size_t capacity() const noexcept { return ring_.size(); }
  std::uint64_t dropped() const;
  bool records_ops() const noexcept { return record_ops_; }
  void clear();

 private:
  const bool record_ops_;
  mutable std::mutex mutex_;
  std::vector<TraceRecord> ring_;
  std::size_t head_ = 0;   // next slot to write
  std::size_t count_ = 0;  // valid records
  std::uint64_t dropped_ = 0;
};

}  // namespace gpumem::forensics
