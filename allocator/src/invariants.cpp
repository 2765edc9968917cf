// check_invariants(): walks every structure of the engine and aborts with a description at the
// first broken invariant (block.h and region_map.h state them). It runs with the engine lock held
// and every thread cache stopped, so it may run while another thread's growth or release has the
// engine lock dropped: claimed blocks, pieces in `waiting` and the counters are consistent then.
#include <fmt/format.h>

#include <unordered_map>

#include "engine.h"
#include "size_policy.h"

namespace gpumem::alloc {

using detail::Block;
using detail::PieceSlot;
using detail::Region;

namespace {

[[noreturn]] void broken(const std::string& what) { detail::invariant_failed(what.c_str()); }

}  // namespace

void CachingAllocator::Impl::check_now_locked() {
  detail::WorldStop stop(thread_caches);
  check_locked();
}

void CachingAllocator::Impl::check_locked() const {
  mutex.assert_held();
  std::size_t live_count = 0, reserved = 0, alloc = 0, free_count[2] = {0, 0}, lease_blocks = 0, claimed = 0;
  std::size_t va = 0;
  for (const auto& [base, rp] : map.regions) {
    const Region& r = *rp;
    if (base != r.va.base) broken("region keyed by the wrong base");
    va += r.va.size_bytes;
    std::uintptr_t at = r.va.base;
    std::size_t mapped_slots = 0, pieces = 0;
    if (r.expandable) {
      if (r.slots.size() > r.slot_count()) broken(fmt::format("region {:#x}: more slots than its range holds", base));
      std::size_t ghosts = 0;
      // Slot s lies in a run of slots that all name it the same way: a piece, or a kept mapping.
      const std::uintptr_t at_base = base;  // a structured binding: lambdas may not capture it (clang)
      auto check_in_run = [&](std::size_t s, std::uint32_t PieceSlot::*first, std::uint32_t PieceSlot::*count,
                              PhysHandle PieceSlot::*handle, const char* what) {
        const PieceSlot& x = r.slots[s];
        if (x.*first > s || s >= std::size_t{x.*first} + x.*count || std::size_t{x.*first} + x.*count > r.slots.size())
          broken(fmt::format("region {:#x}: slot {} lies outside its {}", at_base, s, what));
        const PieceSlot& head = r.slots[x.*first];
        if (head.*first != x.*first || head.*count != x.*count || head.*handle != x.*handle)
          broken(fmt::format("region {:#x}: slot {} disagrees with its {}'s first slot", at_base, s, what));
      };
      for (std::size_t s = 0; s < r.slots.size(); ++s) {
        const PieceSlot& x = r.slots[s];
        if (x.has_ghost()) {
          if (x.mapped()) broken(fmt::format("region {:#x}: slot {} is mapped and holds a kept mapping", base, s));
          check_in_run(s, &PieceSlot::ghost_first, &PieceSlot::ghost_count, &PieceSlot::ghost, "kept mapping");
          if (x.ghost_first == s) {
            ++ghosts;
            auto g = map.ghosts.find(x.ghost);
            bool listed = false;
            if (g != map.ghosts.end())
              for (const auto& ref : g->second) listed |= ref.region == &r && ref.first == s && ref.count == x.ghost_count;
            if (!listed) broken(fmt::format("region {:#x}: the kept mapping at slot {} is not listed", base, s));
          }
        }
        if (!x.mapped()) continue;
        ++mapped_slots;
        check_in_run(s, &PieceSlot::first, &PieceSlot::count, &PieceSlot::handle, "piece");
        if (x.first == s) ++pieces;
      }
      if (pieces != r.pieces) broken(fmt::format("region {:#x}: {} pieces, pieces says {}", base, pieces, r.pieces));
      if (ghosts != r.ghosts) broken(fmt::format("region {:#x}: {} kept mappings, ghosts says {}", base, ghosts, r.ghosts));
    }
    const std::size_t mapped = r.expandable ? mapped_slots * r.slot_bytes : r.va.size_bytes;
    if (mapped != r.mapped_bytes) broken(fmt::format("region {:#x}: mapped_bytes {} != {}", base, r.mapped_bytes, mapped));
    reserved += mapped;
    std::size_t unmapped_blocks = 0, region_claims = 0;
    const Block* prev = nullptr;
    for (const Block* b = r.first; b; prev = b, b = b->next) {
      const BlockState state = b->state;
      if (b->addr != at) broken(fmt::format("region {:#x}: gap or overlap at {:#x}", base, at));
      if (b->prev != prev) broken(fmt::format("block {:#x}: prev link broken", b->addr));
      if (b->region != &r || b->stream != r.stream) broken(fmt::format("block {:#x}: wrong region or stream", b->addr));
      if (state != BlockState::cached && b->lease != nullptr)
        broken(fmt::format("block {:#x} of the region's chain names a lease", b->addr));
      if (b->size_bytes == 0 || b->size_bytes % policy::kMinBlockBytes)
        broken(fmt::format("block {:#x}: size {} not a positive multiple of 512", b->addr, b->size_bytes));
      if (prev && prev->state == state && (state == BlockState::free || state == BlockState::unmapped))
        broken(fmt::format("block {:#x}: neighbouring {} blocks not merged", b->addr, to_string(state)));
      if (r.expandable) {
        const std::size_t s0 = r.slot_of(b->addr), s1 = r.slot_of(b->end() - 1);
        if (state == BlockState::unmapped) {
          if ((b->addr - r.va.base) % r.slot_bytes || b->size_bytes % r.slot_bytes)
            broken(fmt::format("unmapped block {:#x} not slot-aligned", b->addr));
          for (std::size_t s = s0; s <= s1 && s < r.slots.size(); ++s)
            if (r.slots[s].mapped()) broken(fmt::format("unmapped block {:#x} covers a mapped slot", b->addr));
        } else if (state == BlockState::claimed) {
          for (std::size_t s = s0; s <= s1; ++s)
            if (r.slot_mapped(s) != r.slot_mapped(s0))
              broken(fmt::format("claimed block {:#x} covers mapped and unmapped slots", b->addr));
          if (!r.slot_mapped(s0) && ((b->addr - r.va.base) % r.slot_bytes || b->size_bytes % r.slot_bytes))
            broken(fmt::format("claimed unmapped block {:#x} not slot-aligned", b->addr));
        } else {
          for (std::size_t s = s0; s <= s1; ++s)
            if (!r.slot_mapped(s))
              broken(fmt::format("{} block {:#x} covers an unmapped slot", to_string(state), b->addr));
        }
      } else if (state == BlockState::unmapped) {
        broken(fmt::format("classic segment {:#x} holds an unmapped block", base));
      }
      switch (state) {
        case BlockState::free:
          if (!map.free_index[static_cast<int>(r.pool)].contains(*b))
            broken(fmt::format("free block {:#x} missing from the free index", b->addr));
          ++free_count[static_cast<int>(r.pool)];
          break;
        case BlockState::unmapped:
          ++unmapped_blocks;
          if (r.unmapped.find(*b) == r.unmapped.end()) broken(fmt::format("unmapped block {:#x} not in the unmapped set", b->addr));
          break;
        case BlockState::allocated:
        case BlockState::pending_free:
          if (live.find_unlocked(b->addr) != b) broken(fmt::format("live block {:#x} missing from the live table", b->addr));
          ++live_count;
          if (state == BlockState::allocated) alloc += b->size_bytes;
          break;
        case BlockState::cached: {
          // A lease's block: its sub-blocks tile it (checked with the caches below).
          const detail::Lease* l = b->lease;
          if (l == nullptr || l->block != b) broken(fmt::format("cached block {:#x} is not a lease's block", b->addr));
          if (live.find_unlocked(b->addr) == b) broken(fmt::format("lease block {:#x} is in the live table", b->addr));
          ++lease_blocks;
          break;
        }
        case BlockState::claimed:
          if (map.free_index[static_cast<int>(r.pool)].contains(*b) || live.find_unlocked(b->addr) == b)
            broken(fmt::format("claimed block {:#x} is in a container", b->addr));
          if (auto it = r.unmapped.find(*b); it != r.unmapped.end() && &*it == b)
            broken(fmt::format("claimed block {:#x} is in the unmapped set", b->addr));
          ++region_claims;
          break;
      }
      at = b->end();
    }
    if (at != r.va.end()) broken(fmt::format("region {:#x}: blocks end at {:#x}, not {:#x}", base, at, r.va.end()));
    if (unmapped_blocks != r.unmapped.size()) broken(fmt::format("region {:#x}: unmapped set size", base));
    if (region_claims != r.claims) broken(fmt::format("region {:#x}: {} claimed blocks, claims says {}", base, region_claims, r.claims));
    claimed += region_claims;
  }
  if (claimed != map.claimed_blocks) broken(fmt::format("{} claimed blocks, claimed_blocks says {}", claimed, map.claimed_blocks));
  std::size_t leases = 0;
  std::int64_t alloc_delta = 0;
  for (const auto& tc : thread_caches.caches) {
    std::size_t free_subs[2] = {0, 0}, leased = 0, count = 0, large = 0, returning = 0;
    bool large_listed = tc->large_lease == nullptr;
    for (const detail::Lease* l = tc->leases; l; l = l->next) {
      ++count;
      const Block* lb = l->block;
      if (l->cache != tc.get() || lb == nullptr || lb->state != BlockState::cached || lb->lease != l)
        broken("thread cache lists a lease that is not its own");
      if (l->returning) {
        ++returning;
        if (l == tc->large_lease) broken("thread cache: its large_lease is a returning lease");
      } else if (lb->region->pool == PoolKind::large) {
        ++large;
        if (l != tc->large_lease) broken("thread cache holds a large lease that is not its large_lease");
        large_listed = true;
      }
      leased += lb->size_bytes;
      std::uintptr_t at = lb->addr;
      const Block* prev = nullptr;
      for (const Block* x = l->first; x; prev = x, x = x->next) {
        if (x->addr != at || x->prev != prev) broken(fmt::format("lease {:#x}: sub-blocks do not tile it at {:#x}", lb->addr, at));
        if (x->lease != l || x->region != lb->region || x->stream != lb->stream)
          broken(fmt::format("sub-block {:#x} has the wrong lease, region or stream", x->addr));
        if (x->size_bytes == 0 || x->size_bytes % policy::kMinBlockBytes)
          broken(fmt::format("sub-block {:#x}: size {} not a positive multiple of 512", x->addr, x->size_bytes));
        const BlockState xs = x->state;
        if (xs == BlockState::free) {
          if (prev && prev->state == BlockState::free) broken(fmt::format("sub-block {:#x}: free neighbours not merged", x->addr));
          if (!tc->index[static_cast<int>(lb->region->pool)].contains(*x))
            broken(fmt::format("free sub-block {:#x} missing from its cache's index", x->addr));
          ++free_subs[static_cast<int>(lb->region->pool)];
        } else if (xs == BlockState::allocated) {
          if (live.find_unlocked(x->addr) != x) broken(fmt::format("allocated sub-block {:#x} missing from the live table", x->addr));
          if (x->uses) broken(fmt::format("sub-block {:#x} is used on other streams", x->addr));
          ++live_count;
          alloc += x->size_bytes;
        } else {
          broken(fmt::format("sub-block {:#x} is {}", x->addr, to_string(xs)));
        }
        at = x->end();
      }
      if (at != lb->end()) broken(fmt::format("lease {:#x}: sub-blocks end at {:#x}", lb->addr, at));
    }
    if (count != tc->lease_count || leased != tc->leased_bytes) broken("thread cache lease count or bytes out of step");
    if (large > 1 || !large_listed) broken("thread cache: more than one large lease, or large_lease not among its leases");
    if (returning != tc->returning_count || returning > detail::ThreadCache::kMaxReturning)
      broken("thread cache: returning leases out of step with returning_count, or more than kMaxReturning");
    for (int pool = 0; pool < 2; ++pool) {
      if (free_subs[pool] != tc->index[pool].size()) broken("thread cache index holds blocks that are not its free sub-blocks");
      if (!tc->index[pool].check_order()) broken("thread cache index out of order or its byte count out of step");
    }
    leases += count;
    alloc_delta += tc->allocated_delta;
  }
  for (const auto& tc : thread_caches.spare)
    if (!tc->empty()) broken("a retired thread cache still holds leases");
  if (leases != lease_blocks) broken("lease blocks and thread caches' leases disagree");
  if (live_count != live.size_unlocked()) broken("live table holds blocks that are not live");
  for (int pool = 0; pool < 2; ++pool) {
    if (free_count[pool] != map.free_index[pool].size()) broken("free index holds blocks that are not free");
    if (!map.free_index[pool].check_order()) broken("free index out of order or its byte count out of step");
  }
  if (reserved != map.reserved_bytes) broken(fmt::format("reserved_bytes {} != mapped {}", map.reserved_bytes, reserved));
  if (alloc != allocated_bytes + static_cast<std::size_t>(alloc_delta))
    broken(fmt::format("allocated_bytes {} + thread-cache deltas {} != {}", allocated_bytes, alloc_delta, alloc));
  if (va != map.va_bytes) broken("va_bytes out of step");
  std::size_t pend = 0;
  for (const auto* list : {&pending, &waiting})
    for (const Block* b : *list) {
      if (b->state != BlockState::pending_free || !b->uses) broken("pending list holds a block not pending");
      pend += b->size_bytes;
    }
  if (pend != pending_bytes) broken("pending_bytes out of step");
  // Kept mappings: every listed one is in its region's slots (checked per region above from the
  // slots' side), their bytes add up, and each one's piece is mapped somewhere.
  std::size_t listed = 0, listed_bytes = 0, region_ghosts = 0;
  for (const auto& [base, rp] : map.regions) region_ghosts += rp->ghosts;
  for (const auto& [handle, list] : map.ghosts) {
    if (list.empty()) broken("a piece lists an empty set of kept mappings");
    bool found = false;
    for (const auto& [base, rp] : map.regions) {
      for (const PieceSlot& x : rp->slots)
        if (x.mapped() && x.handle == handle) {
          found = true;
          break;
        }
      if (found) break;
    }
    if (!found) broken(fmt::format("piece {:#x} has kept mappings but is mapped nowhere", handle));
    for (const auto& g : list) {
      ++listed;
      listed_bytes += g.count * g.region->slot_bytes;
      if (!g.region->slot_ghost(g.first) || g.region->slots[g.first].ghost != handle)
        broken(fmt::format("piece {:#x}: a listed kept mapping is not in its region's slots", handle));
    }
  }
  if (listed != region_ghosts || listed != map.ghost_count) broken("kept mappings listed and counted disagree");
  std::unordered_map<EventToken, std::size_t> markers;
  for (const auto& [handle, list] : map.ghosts)
    for (const auto& g : list)
      if (g.marker != 0) ++markers[g.marker];
  if (markers != map.marker_refs) broken("kept mappings' markers and their counts disagree");
  if (listed_bytes != map.ghost_bytes) broken("ghost_bytes out of step");
}

}  // namespace gpumem::alloc
