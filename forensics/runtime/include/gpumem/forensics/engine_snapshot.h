// snapshot_from_engine: a Snapshot (PyTorch's layout plus gpumem's additions) of a running engine,
// from its EngineSnapshot (the block layout), the records of its TraceRing, and optionally the
// FragmentationTracker (ops and stacks of blocks whose alloc the ring no longer holds) and a
// StackSymbolizer (frames of the stack contexts records and blocks carry, symbolized once each).
//
// Layout as PyTorch's snapshot() gives it: one segment per classic segment and one per
// contiguous mapped run of an expandable region (unmapped address space is left out), blocks in
// address order tiling each segment, states active_allocated / active_pending_free / inactive.
// Trace records are ordered by the engine's seq; with a tracker, a live block whose alloc record the
// ring already overwrote gets its alloc record back from the tracker (time, op, stack), so the trace
// holds the allocation of every live block whatever the ring's size (blocks the history skipped by
// kind are not added); times are converted from the steady clock to
// Unix microseconds at conversion time; empty_cache events (which PyTorch does not trace) are
// left out. Blocks and entries with an op get it in `op`, entries their user scope in
// user_metadata; op_frames is set, so the writers also give them frames naming the op and the
// scope for PyTorch's viewer.
//
// Thread-safety: a free function of its arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "gpumem/alloc/introspection.h"
#include "gpumem/forensics/fragmentation_tracker.h"
#include "gpumem/forensics/snapshot.h"
#include "gpumem/forensics/stack_symbolizer.h"
#include "gpumem/forensics/trace_ring.h"

namespace gpumem::forensics {

// A private pool's engine on the same device (the torch adapter's CUDA graph and MemPool pools,
// each an engine of its own): its segments belong in the device's snapshot, tagged with the pool.
struct PoolEngineView {
  std::pair<std::int64_t, std::int64_t> pool_id{0, 0};
  alloc::EngineSnapshot engine;
};

struct EngineSnapshotExtras {
  const FragmentationTracker* tracker = nullptr;
  const StackSymbolizer* symbolize = nullptr;  // null: no frames
  std::uint64_t device_total_bytes = 0;
  std::uint64_t device_free_bytes = 0;
  // Provider free bytes for the last oom record (PyTorch's oom entries carry them).
  std::optional<std::uint64_t> oom_device_free_bytes;
  // The device's private pools: their segments follow the engine's, each with its pool_id.
  std::span<const PoolEngineView> pools;
};

// PyTorch's trace action for an engine event (nullopt for empty_cache, which PyTorch does not trace).
std::optional<TraceAction> trace_action_of(alloc::EventKind kind) noexcept;

Snapshot snapshot_from_engine(const alloc::EngineSnapshot& engine, std::span<const TraceRecord> trace,
                              const EngineSnapshotExtras& extras = {});

}  // namespace gpumem::forensics
