// EngineRules: the settings the engine's mechanism and policy calls use, as plain values derived
// once from the Config, the source's capabilities and the provider's total memory. It is the only
// place where the engine reads its Config (besides reporting it in snapshots), so the mechanism
// never reads configuration mid-algorithm.
// Invariants: slot_bytes is a positive multiple of the source's granularity (or of 512 bytes when
// the source reports none); region_va_bytes[p] is a positive multiple of slot_bytes x
// unit_slots(pieces[p]).
// Thread-safety: immutable after construction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "gpumem/alloc/config.h"
#include "gpumem/alloc/memory_source.h"
#include "growth_policy.h"
#include "recycle_budget_policy.h"
#include "size_policy.h"

namespace gpumem::alloc::detail {

struct EngineRules {
  bool expandable = true;                  // expandable_segments and a virtual-memory source
  bool recycle = true;
  policy::RecycleBudgetRules recycle_budget;  // how much time recycling may spend
  double recycle_headroom = 0.0;            // create instead of recycling within this (policy::within_headroom)
  bool keep_mappings = true;               // a recycled piece keeps its old mapping (a ghost)
  bool recycle_fence = true;               // recycle_wait:fence: move only pieces fences show idle
  bool thread_cache = true;
  bool check_invariants = false;
  std::size_t slot_bytes = 0;              // slot of every expandable region (the smallest piece)
  policy::PieceRules pieces[2];            // by PoolKind: how pieces are sized
  std::size_t region_va_bytes[2] = {};     // by PoolKind: address space of an expandable region
  std::size_t large_segment_bytes = 0;     // classic 1-10 MiB segment size
  std::size_t granularity_bytes = 0;       // the source's
  policy::SplitLimits split;
  double garbage_collection_threshold = 0.0;
  std::array<std::uint32_t, 16> roundup_power2_divisions{};
  bool any_divisions = false;              // some bucket has divisions > 1
};

EngineRules make_engine_rules(const Config& config, const SourceCaps& caps, std::size_t provider_total_bytes);

}  // namespace gpumem::alloc::detail
