#include "engine_rules.h"

#include <algorithm>

#include "growth_policy.h"

namespace gpumem::alloc::detail {

EngineRules make_engine_rules(const Config& config, const SourceCaps& caps, std::size_t provider_total_bytes) {
  EngineRules r;
  r.expandable = config.expandable_segments && caps.virtual_memory;
  r.recycle = config.recycle;
  r.recycle_budget.fraction = config.recycle_budget;
  r.recycle_budget.burst_ns = static_cast<std::int64_t>(config.recycle_burst_ms) * 1'000'000;
  r.recycle_budget.slack = config.recycle_slack;
  r.recycle_budget.ceiling = config.recycle_ceiling;
  r.recycle_budget.churn = config.recycle_churn;
  r.recycle_budget.churn_allowance = config.recycle_churn > 0.0 ? kChurnAllowance : 0.0;
  r.recycle_headroom = config.recycle_headroom;
  r.keep_mappings = config.recycle_keep_mappings;
  r.recycle_fence = config.recycle_wait == RecycleWait::fence;
  r.thread_cache = config.thread_cache;
  r.check_invariants = config.check_invariants;
  const std::size_t g = caps.granularity_bytes ? caps.granularity_bytes : policy::kMinBlockBytes;
  r.slot_bytes = policy::round_up(std::max(config.small_piece_bytes, g), g);
  policy::PieceRules& small = r.pieces[static_cast<int>(PoolKind::small)];
  policy::PieceRules& large = r.pieces[static_cast<int>(PoolKind::large)];
  if (config.pieces == PieceSizing::fixed) {
    // PyTorch's pages: the small pool's are one slot, the large pool's large_segment_size_mb.
    small.mode = large.mode = policy::PieceMode::fixed;
    small.fixed_slots = 1;
    large.fixed_slots = policy::round_up(config.large_segment_size_bytes, r.slot_bytes) / r.slot_bytes;
    small.recycle_across_pools = large.recycle_across_pools = false;
  } else {
    // Pieces follow the requests, at most max_piece_size_mb long (docs/notes/allocation-policy.md).
    small.mode = large.mode = policy::PieceMode::adaptive;
    small.max_piece_slots = 1;
    large.max_piece_slots = std::max<std::size_t>(config.max_piece_bytes / r.slot_bytes, 1);
    large.frontier_max_piece_slots = config.frontier_piece_bytes / r.slot_bytes;
    small.overhang = large.overhang = config.recycle_overhang;
    // Pieces that follow the footprint (piece_rules_for_footprint), large pool (the small pool's
    // are one slot already).
    large.short_below_bytes = config.short_pieces_below_bytes;
    large.footprint_pieces = config.footprint_pieces;
  }
  for (int p = 0; p < 2; ++p)
    r.region_va_bytes[p] = policy::region_va_bytes(config.va_reserve_bytes, provider_total_bytes,
                                                   r.slot_bytes * policy::unit_slots(r.pieces[p]));
  r.large_segment_bytes = config.large_segment_size_bytes;
  r.granularity_bytes = caps.granularity_bytes;
  r.split.max_split_bytes = config.max_split_size_bytes;
  r.split.max_non_split_rounding_bytes = config.max_non_split_rounding_bytes;
  r.garbage_collection_threshold = config.garbage_collection_threshold;
  r.roundup_power2_divisions = config.roundup_power2_divisions;
  r.any_divisions = std::any_of(r.roundup_power2_divisions.begin(), r.roundup_power2_divisions.end(),
                                [](auto d) { return d > 1; });
  return r;
}

}  // namespace gpumem::alloc::detail
