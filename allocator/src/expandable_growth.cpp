// Growth of an expandable region: where a request lands (placement), which wholly free pieces move
// there (recycling), how many pieces are created, then the driver calls. See Note [Physical page
// recycling] (docs/notes/physical-page-recycling.md) for the design and Note [Engine locking]
// (engine.h, docs/notes/engine-locking.md) for plan -> act -> commit:
//
//   plan    (engine lock) placement, recycling choice and plan_growth from growth_policy.h; the
//           pieces to recycle and the target range are claimed, so nobody else can use them.
//   act     (no engine lock) create pieces, synchronize the streams of the pieces that move, unmap
//           them, map every piece at its target slot. A new region's address space is reserved
//           the same way, before planning, with the lock dropped.
//   commit  (engine lock) record every piece unmapped or mapped, unclaim, carve the request out.
//           On failure nothing leaks: created pieces not mapped are destroyed, recycled pieces
//           that could not be placed are destroyed (their slots become unmapped), claims go back.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <optional>
#include <utility>
#include <vector>

#include "engine.h"
#include "growth_policy.h"

namespace gpumem::alloc {

using detail::Block;
using detail::EventBatch;
using detail::GrowFailure;
using detail::Region;
using detail::RegionMap;

namespace {

struct Placement {
  Region* region = nullptr;
  Block* hole_first = nullptr;  // the lowest block of the hole the placement lies in
  std::uintptr_t addr = 0;
  std::size_t need = 0;         // unmapped slots under [addr, addr + size)
};

std::size_t unmapped_slots_in(const Region& r, std::uintptr_t addr, std::size_t size) {
  std::size_t n = 0;
  const std::size_t first = r.slot_of(addr), last = r.slot_of(addr + size - 1);
  for (std::size_t s = first; s <= last; ++s) n += r.slots[s].mapped ? 0 : 1;
  return n;
}

bool is_hole_state(const Block* b) {
  return b && (b->state == BlockState::free || b->state == BlockState::unmapped);
}

// Gathers every place `size` bytes could land in a region of (pool, stream) — either end of each
// run of free and unmapped blocks ("hole") — and asks the policy which is best.
std::optional<Placement> find_placement(RegionMap& map, PoolKind pool, StreamId stream, std::size_t size) {
  std::vector<policy::PlacementCandidate> candidates;
  std::vector<std::pair<Region*, Block*>> where;  // parallel to candidates: region, hole's first block
  for (auto& [base, rp] : map.regions) {
    Region& r = *rp;
    if (!r.expandable || r.pool != pool || r.stream != stream) continue;
    std::uintptr_t last_hole_end = 0;
    for (Block& u : r.unmapped) {
      if (u.addr < last_hole_end) continue;  // in a hole seen already
      Block* lo = &u;
      while (is_hole_state(lo->prev)) lo = lo->prev;
      const Block* hi = &u;
      while (is_hole_state(hi->next)) hi = hi->next;
      last_hole_end = hi->end();
      const policy::PlacementAddresses at = policy::placement_addresses(lo->addr, hi->end(), size);
      for (int i = 0; i < at.count; ++i) {
        candidates.push_back({at.addr[i], unmapped_slots_in(r, at.addr[i], size), hi->end() - lo->addr});
        where.emplace_back(&r, lo);
      }
    }
  }
  const std::optional<std::size_t> best = policy::choose_placement(candidates);
  if (!best) return std::nullopt;
  return Placement{where[*best].first, where[*best].second, candidates[*best].addr, candidates[*best].pieces_needed};
}

// The driver work of one growth, as plain values: the act phase touches no engine structure.
struct GrowthWork {
  std::size_t piece_bytes = 0;
  std::size_t create = 0;                 // pieces to create
  std::vector<StreamId> sync_streams;     // streams whose pieces move (synchronized first)
  std::vector<std::uintptr_t> unmap_at;   // recycled pieces, in the order chosen
  std::vector<PhysHandle> unmap_handles;  // their handles
  std::vector<std::uintptr_t> map_at;     // target slots, ascending
  // Results.
  std::vector<std::pair<PhysHandle, bool>> handles;  // (handle, created): the created, then the recycled
  std::size_t unmapped = 0;  // recycled pieces unmapped
  std::size_t mapped = 0;    // handles[i] is mapped at map_at[i] for i < mapped; the others were destroyed
  GrowFailure fail;          // status ok iff every step succeeded
};

void destroy_from(MemorySource& source, GrowthWork& w, std::size_t first) {
  for (std::size_t i = first; i < w.handles.size(); ++i) source.destroy(w.handles[i].first);
}

void run_growth_unlocked(MemorySource& source, StreamEvents& events, GrowthWork& w) {
  auto failed = [&](SourceStatus status) {
    w.fail.status = status;
    w.fail.detail = source.last_error();
  };
  // Create first: if the provider refuses, nothing has moved yet.
  for (std::size_t i = 0; i < w.create; ++i) {
    auto h = source.create(w.piece_bytes);
    if (!h.ok()) {
      failed(h.status);
      return destroy_from(source, w, 0);
    }
    w.handles.emplace_back(h.value, true);
  }
  // cuMemUnmap does not wait for kernels still using the range.
  for (StreamId s : w.sync_streams) events.synchronize_stream(s);
  for (; w.unmapped < w.unmap_at.size(); ++w.unmapped) {
    const SourceStatus st = source.unmap(w.unmap_at[w.unmapped], w.piece_bytes);
    if (st != SourceStatus::ok) {
      failed(st);
      return destroy_from(source, w, 0);
    }
    w.handles.emplace_back(w.unmap_handles[w.unmapped], false);
  }
  for (; w.mapped < w.map_at.size(); ++w.mapped) {
    const SourceStatus st = source.map(w.map_at[w.mapped], w.piece_bytes, w.handles[w.mapped].first);
    if (st != SourceStatus::ok) {
      failed(st);
      return destroy_from(source, w, w.mapped);
    }
  }
}

}  // namespace

CachingAllocator::Impl::Block* CachingAllocator::Impl::grow_expandable_dropping_lock(
    Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded, EventBatch& batch, GrowFailure& fail) {
  growth_mutex.assert_held();
  mutex.assert_held();
  const int p = static_cast<int>(pool);
  const std::size_t piece = rules.piece_bytes[p];

  // ---- plan
  std::optional<Placement> place = find_placement(map, pool, stream, rounded);
  if (!place) {
    if (rounded > rules.region_va_bytes[p]) {
      fail.status = SourceStatus::out_of_memory;
      fail.detail = fmt::format("the request is larger than the address space of a region ({} bytes)",
                                rules.region_va_bytes[p]);
      return nullptr;
    }
    // A new region. Expandable regions are aligned to a power of two at least a piece (sources
    // take only powers of two); slots are counted from the region's base, so any alignment would
    // be correct.
    lock.unlock();
    const auto reserved = source.reserve(rules.region_va_bytes[p], std::bit_ceil(piece));
    const std::string error = reserved.ok() ? std::string() : source.last_error();
    lock.lock();
    if (!reserved.ok()) {
      fail.status = reserved.status;
      fail.detail = error;
      return nullptr;
    }
    Region* r = map.add_region(reserved.value, pool, stream, true, piece);
    place = Placement{r, r->first, r->va.base, policy::round_up(rounded, piece) / piece};
  }
  Region& r = *place->region;
  const std::uintptr_t ex_lo = place->addr, ex_hi = place->addr + rounded;

  std::vector<Block*> extent_blocks;
  std::vector<policy::RecycleChoice> recycle;
  // Recycling synchronizes the streams of the pieces that move: never while capturing or holding.
  const bool recycle_now = rules.recycle && may_release();
  if (recycle_now && place->need > 0) {
    std::vector<policy::FreeExtent> extents;
    for (Block& b : map.free_index[p].blocks()) {
      if (b.size_bytes < piece || !b.region->expandable) continue;
      extents.push_back({b.addr, b.size_bytes, b.stream, b.region->va.base});
      extent_blocks.push_back(&b);
    }
    recycle = policy::choose_recycled_pieces(extents, piece, ex_lo, ex_hi, place->need);
  }
  policy::GrowthInputs in;
  in.pieces_needed = place->need;
  in.pieces_recyclable = recycle.size();
  in.piece_bytes = piece;
  in.reserved_bytes = map.reserved_bytes;
  in.cap_bytes = cap;
  in.recycle_enabled = recycle_now;
  const policy::GrowthPlan plan = policy::plan_growth(in);
  if (plan.over_cap) {
    fail.cap_reached = true;
    fail.status = SourceStatus::out_of_memory;
    return nullptr;
  }

  // Claim the pieces to recycle (each is taken from the front part of its extent's block, which
  // keeps the Block: the policy takes an extent's pieces from the highest down) ...
  GrowthWork w;
  w.piece_bytes = piece;
  w.create = plan.create;
  std::vector<Block*> recycled;
  for (std::size_t i = 0; i < plan.recycle; ++i) {
    Block* from = extent_blocks[recycle[i].extent];
    Region& rr = *from->region;
    const std::size_t slot = rr.slot_of(recycle[i].slot_addr);
    w.unmap_at.push_back(recycle[i].slot_addr);
    w.unmap_handles.push_back(rr.slots[slot].handle);
    recycled.push_back(map.claim_slot(from, slot));
    if (std::find(w.sync_streams.begin(), w.sync_streams.end(), rr.stream) == w.sync_streams.end())
      w.sync_streams.push_back(rr.stream);
  }
  // ... and the target: [ex_lo, ex_hi), widened to whole slots where they are unmapped.
  const std::size_t first = r.slot_of(ex_lo), last = r.slot_of(ex_hi - 1);
  const std::uintptr_t claim_lo = r.slots[first].mapped ? ex_lo : r.slot_addr(first);
  const std::uintptr_t claim_hi = r.slots[last].mapped ? ex_hi : r.slot_addr(last) + piece;
  std::vector<Block*> target;
  map.claim_range(place->hole_first, claim_lo, claim_hi, target);
  std::vector<std::size_t> target_slots;
  for (std::size_t s = first; s <= last; ++s)
    if (!r.slots[s].mapped) {
      target_slots.push_back(s);
      w.map_at.push_back(r.slot_addr(s));
    }
  if (target_slots.size() != place->need) detail::invariant_failed("growth: placement's piece count changed");

  // ---- act
  lock.unlock();
  run_growth_unlocked(source, events, w);
  lock.lock();

  // ---- commit
  for (std::size_t i = 0; i < recycled.size(); ++i) {
    Block* b = recycled[i];
    if (i >= w.unmapped) {
      map.unclaim(b);  // never unmapped: still free memory
      continue;
    }
    const Region& rr = *b->region;
    const std::uintptr_t sa = b->addr;
    const bool destroyed = plan.create + i >= w.mapped;  // its handle was not mapped, so destroyed
    map.record_slot_unmapped(b);
    if (destroyed) map.reserved_bytes -= piece;
    emit(batch, EventKind::segment_unmap, rr.pool, sa, piece, 0, rr.stream, destroyed ? 1 : 0);
  }
  for (std::size_t j = 0; j < w.mapped; ++j) {
    const auto [h, created] = w.handles[j];
    map.record_slot_mapped(r, target_slots[j], h);
    if (created) map.reserved_bytes += piece;
    emit(batch, EventKind::segment_map, r.pool, r.slot_addr(target_slots[j]), piece, 0, r.stream, created ? 1 : 0);
  }
  Block* merged = nullptr;
  for (Block* b : target)
    if (Block* f = map.unclaim(b)) merged = f;
  if (w.fail.status != SourceStatus::ok) {
    fail = std::move(w.fail);
    return nullptr;
  }
  // Every slot of [ex_lo, ex_hi) is mapped and free now: one free block holds the range.
  if (!merged || merged->addr > ex_lo || merged->end() < ex_hi)
    detail::invariant_failed("growth placement is not free memory");
  map.index_of(r).erase(*merged);
  return map.carve(merged, ex_lo, rounded);
}

}  // namespace gpumem::alloc
