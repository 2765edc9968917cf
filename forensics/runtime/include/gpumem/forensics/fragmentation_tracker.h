// FragmentationTracker: an AllocObserver that keeps, at every moment, allocated, requested,
// pending-free and reserved bytes, the reserved-but-unallocated bytes and their peak, and a table
// of live blocks (size, request, op, user scope, allocation time) so that reports can say which op
// made a block that pins a segment, and how old it is, even after the trace ring wrapped.
// The finer split of reserved-unallocated (inactive split, cached free, partly used granules,
// largest free extent) needs the layout: analyze_fragmentation() on a snapshot gives it.
//
// Cost: one tick-counter read per batch (tick_clock.h; the engine is asked for sequence numbers
// only), the op stack read once per batch that allocates, and one insert per allocation and one
// erase per free in a flat, preallocated table (gpumem/alloc/address_table.h: no memory allocated per
// event), under its own spin lock.
//
// Invariants: allocated_bytes == sum of live blocks' sizes; reserved_bytes >= 0 (clamped).
// Thread-safety: all members may be called from any thread (one spin lock, held per batch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>

#include "gpumem/alloc/events.h"
#include "gpumem/alloc/spin_lock.h"
#include "gpumem/alloc/address_table.h"
#include "gpumem/forensics/detail/tick_clock.h"

namespace gpumem::forensics {

struct FragmentationCounters {
  std::uint64_t allocated_bytes = 0;     // live blocks, rounded
  std::uint64_t requested_bytes = 0;     // live blocks, as requested
  std::uint64_t pending_free_bytes = 0;  // freed, waiting for other streams
  std::uint64_t reserved_bytes = 0;      // segments + mapped pieces
  std::uint64_t live_blocks = 0;
  std::uint64_t peak_reserved_unallocated_bytes = 0;
  std::uint64_t peak_reserved_unallocated_seq = 0;  // event seq of that peak
  std::uint64_t reserved_unallocated_bytes() const noexcept {
    return reserved_bytes > allocated_bytes ? reserved_bytes - allocated_bytes : 0;
  }
};

struct LiveBlockInfo {
  std::uint64_t size_bytes = 0;
  std::uint64_t requested_bytes = 0;
  std::uint32_t op = 0;     // OpRegistry ids (0 = unknown)
  std::uint32_t scope = 0;
  std::uint64_t t_ns = 0;   // allocation time (steady clock, ns)
  std::uint64_t seq = 0;
  std::shared_ptr<void> context;  // the allocation's AllocContext, when contexts are kept
};

class FragmentationTracker final : public alloc::AllocObserver {
 public:
  // record_ops: tag live blocks with the op current at their allocation (OpStack);
  // keep_contexts: keep each live block's AllocContext (its stack).
  explicit FragmentationTracker(bool record_ops = false, bool keep_contexts = false);
  void on_events(std::span<const alloc::AllocEvent> events) override;

  FragmentationCounters counters() const;
  std::optional<LiveBlockInfo> live_block(std::uintptr_t addr) const;
  // Every live block, by address.
  std::unordered_map<std::uintptr_t, LiveBlockInfo> live_blocks() const;

 private:
  const bool record_ops_;
  const bool keep_contexts_;
  detail::TickCalibration clock_;  // LiveBlockInfo::t_ns is kept in ticks
  mutable alloc::detail::SpinLock mutex_;  // held per batch for a few stores (see TraceRing)
  FragmentationCounters c_;
  alloc::AddressTable<LiveBlockInfo> live_;
};

}  // namespace gpumem::forensics
