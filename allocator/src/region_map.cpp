#include "region_map.h"

#include <cstdio>
#include <cstdlib>

namespace gpumem::alloc::detail {

void invariant_failed(const char* what) {
  std::fprintf(stderr, "gpumem: engine invariant broken: %s\n", what);
  std::abort();
}

Region* RegionMap::add_region(VaRange va, PoolKind pool, StreamId stream, bool expandable, std::size_t slot_bytes) {
  auto r = std::make_unique<Region>();
  r->va = va;
  r->pool = pool;
  r->stream = stream;
  r->expandable = expandable;
  r->created_seq = tick + 1;
  Block* b = arena.make();
  b->addr = va.base;
  b->size_bytes = va.size_bytes;
  b->stream = stream;
  b->region = r.get();
  r->first = b;
  if (expandable) {
    r->slot_bytes = slot_bytes;
    b->state = BlockState::unmapped;
    r->unmapped.insert(*b);
  } else {
    r->slot_bytes = va.size_bytes;
    r->mapped_bytes = va.size_bytes;
    b->state = BlockState::free;
  }
  va_bytes += va.size_bytes;
  Region* raw = r.get();
  regions.emplace(va.base, std::move(r));
  return raw;
}

void RegionMap::drop_region(Region& r) {
  Block* b = r.first;
  if (b->next) invariant_failed("dropping a region that holds more than one block");
  switch (BlockState(b->state)) {
    case BlockState::unmapped:
      r.unmapped.erase(r.unmapped.iterator_to(*b));
      break;
    case BlockState::free:
      if (index_of(r).contains(*b)) index_of(r).erase(*b);
      break;
    case BlockState::claimed:
      --r.claims;
      --claimed_blocks;
      break;
    default:
      invariant_failed("dropping a region that holds a live block");
  }
  if (r.claims != 0) invariant_failed("dropping a region with a claim in progress");
  if (r.ghosts != 0) invariant_failed("dropping a region that still holds kept mappings");
  purge_ghost_ages(r);
  arena.dispose(b);
  va_bytes -= r.va.size_bytes;
  regions.erase(r.va.base);
}

Region* RegionMap::region_of(std::uintptr_t addr) noexcept {
  auto it = regions.upper_bound(addr);
  if (it == regions.begin()) return nullptr;
  --it;
  return it->second->va.contains(addr) ? it->second.get() : nullptr;
}

void RegionMap::insert_unmapped_merged(Block* b) {
  Region& r = *b->region;
  if (b->prev && b->prev->state == BlockState::unmapped) {
    Block* p = b->prev;
    r.unmapped.erase(r.unmapped.iterator_to(*p));
    absorb_next(p);
    b = p;
  }
  if (b->next && b->next->state == BlockState::unmapped) {
    r.unmapped.erase(r.unmapped.iterator_to(*b->next));
    absorb_next(b);
  }
  r.unmapped.insert(*b);
}

void RegionMap::note_claimed(Block* b) noexcept {
  b->state = BlockState::claimed;
  ++b->region->claims;
  ++claimed_blocks;
}

Block* RegionMap::claim_piece(Block* b, std::size_t slot) {
  Region& r = *b->region;
  if (!r.expandable || !r.slot_mapped(slot) || r.piece_first(slot) != slot)
    invariant_failed("claim_piece: the slot is not the first of a mapped piece");
  const std::uintptr_t lo = r.slot_addr(slot), hi = lo + r.piece_slots(slot) * r.slot_bytes;
  if (b->state != BlockState::free || lo < b->addr || hi > b->end())
    invariant_failed("claim_piece: the block is not free or does not hold the whole piece");
  FreeIndex& idx = index_of(r);
  idx.erase(*b);
  Block* mid = b;
  if (lo > b->addr) {
    mid = split_at(b, lo);
    b->free_seq = tick;
    idx.insert(*b);
  }
  if (mid->end() > hi) {
    Block* rest = split_at(mid, hi);
    rest->free_seq = tick;
    idx.insert(*rest);
  }
  note_claimed(mid);
  return mid;
}

void RegionMap::claim_block(Block* b) {
  if (b->state != BlockState::free) invariant_failed("claim_block: the block is not free");
  index_of(*b->region).erase(*b);
  note_claimed(b);
}

void RegionMap::claim_range(Block* from, std::uintptr_t lo, std::uintptr_t hi, std::vector<Block*>& out) {
  Region& r = *from->region;
  FreeIndex& idx = index_of(r);
  auto take_out = [&](Block* x) {
    if (x->state == BlockState::free) {
      idx.erase(*x);
    } else if (x->state == BlockState::unmapped) {
      r.unmapped.erase(r.unmapped.iterator_to(*x));
    } else {
      invariant_failed("claim_range: the range holds a block that is neither free nor unmapped");
    }
  };
  auto put_back = [&](Block* x) {
    if (x->state == BlockState::free) {
      x->free_seq = tick;
      idx.insert(*x);
    } else {
      if ((x->addr - r.va.base) % r.slot_bytes || x->size_bytes % r.slot_bytes)
        invariant_failed("claim_range: an unmapped block split off a slot boundary");
      r.unmapped.insert(*x);
    }
  };
  Block* x = from;
  if (x->addr > lo) invariant_failed("claim_range: the search starts above the range");
  while (x && x->end() <= lo) x = x->next;
  while (x && x->addr < hi) {
    take_out(x);
    if (x->addr < lo) {
      Block* y = split_at(x, lo);
      put_back(x);
      x = y;
    }
    if (x->end() > hi) put_back(split_at(x, hi));
    Block* next = x->next;
    note_claimed(x);
    out.push_back(x);
    x = next;
  }
}

Block* RegionMap::unclaim(Block* b) {
  if (b->state != BlockState::claimed) invariant_failed("unclaim: the block is not claimed");
  Region& r = *b->region;
  --r.claims;
  --claimed_blocks;
  Block* last_free = nullptr;
  while (b) {
    // The run of slots with the same mapped state at the start of b becomes one block.
    Block* rest = nullptr;
    bool mapped = true;
    if (r.expandable) {
      const std::size_t first = r.slot_of(b->addr), last = r.slot_of(b->end() - 1);
      mapped = r.slot_mapped(first);
      std::size_t s = first + 1;
      while (s <= last && r.slot_mapped(s) == mapped) ++s;
      if (s <= last) rest = split_at(b, r.slot_addr(s));
    }
    if (mapped) {
      b->state = BlockState::free;
      last_free = insert_free_merged(b);
    } else {
      b->state = BlockState::unmapped;
      insert_unmapped_merged(b);
    }
    b = rest;
  }
  return last_free;
}

void RegionMap::record_piece_mapped(Region& r, std::size_t first, std::size_t count, PhysHandle handle) {
  if (count == 0 || first + count > r.slot_count()) invariant_failed("record_piece_mapped: slots outside the region");
  if (r.slots.size() < first + count) r.slots.resize(first + count);
  for (std::size_t s = first; s < first + count; ++s) {
    if (r.slots[s].mapped()) invariant_failed("record_piece_mapped: a slot is mapped already");
    if (r.slots[s].has_ghost()) invariant_failed("record_piece_mapped: a slot still holds a kept mapping");
    r.slots[s] = PieceSlot{handle, static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(count)};
  }
  r.mapped_bytes += count * r.slot_bytes;
  ++r.pieces;
}

void RegionMap::record_piece_unmapped(Block* b) {
  Region& r = *b->region;
  const std::size_t first = r.slot_of(b->addr);
  if (b->state != BlockState::claimed || (b->addr - r.va.base) % r.slot_bytes || !r.slot_mapped(first) ||
      r.piece_first(first) != first || b->size_bytes != r.piece_slots(first) * r.slot_bytes)
    invariant_failed("record_piece_unmapped: not a claimed block of exactly one piece");
  const std::size_t count = r.piece_slots(first);
  for (std::size_t s = first; s < first + count; ++s) r.slots[s] = PieceSlot{};
  r.mapped_bytes -= count * r.slot_bytes;
  --r.pieces;
  --r.claims;
  --claimed_blocks;
  b->state = BlockState::unmapped;
  insert_unmapped_merged(b);
}

void RegionMap::add_ghost(Region& r, std::size_t first, std::size_t count, PhysHandle handle, EventToken marker) {
  if (count == 0 || first + count > r.slots.size()) invariant_failed("add_ghost: slots outside the region's slot table");
  for (std::size_t s = first; s < first + count; ++s) {
    PieceSlot& slot = r.slots[s];
    if (slot.mapped() || slot.has_ghost()) invariant_failed("add_ghost: a slot is mapped or holds a kept mapping");
    slot.ghost = handle;
    slot.ghost_first = static_cast<std::uint32_t>(first);
    slot.ghost_count = static_cast<std::uint32_t>(count);
  }
  ++r.ghosts;
  ghosts[handle].push_back({&r, first, count, marker});
  ghost_bytes += count * r.slot_bytes;
  ghost_ages.push_back({handle, &r, first});
  ++ghost_count;
  if (marker != 0) ++marker_refs[marker];
}

EventToken RegionMap::remove_ghost(Region& r, std::size_t first) {
  if (!r.slot_ghost(first) || r.slots[first].ghost_first != first) invariant_failed("remove_ghost: no kept mapping starts there");
  const PhysHandle handle = r.slots[first].ghost;
  const std::size_t count = r.slots[first].ghost_count;
  for (std::size_t s = first; s < first + count; ++s) {
    r.slots[s].ghost = 0;
    r.slots[s].ghost_first = 0;
    r.slots[s].ghost_count = 0;
  }
  --r.ghosts;
  --ghost_count;
  ghost_bytes -= count * r.slot_bytes;
  auto it = ghosts.find(handle);
  if (it == ghosts.end()) invariant_failed("remove_ghost: the piece lists no kept mapping");
  auto& list = it->second;
  EventToken marker = 0;
  for (std::size_t i = 0; i < list.size(); ++i)
    if (list[i].region == &r && list[i].first == first) {
      marker = list[i].marker;
      list[i] = list.back();
      list.pop_back();
      break;
    }
  if (list.empty()) ghosts.erase(it);
  if (marker == 0) return 0;
  auto ref = marker_refs.find(marker);
  if (ref == marker_refs.end()) invariant_failed("remove_ghost: a marker nobody counts");
  if (--ref->second > 0) return 0;
  marker_refs.erase(ref);
  return marker;
}

EventToken RegionMap::ghost_marker(const Region& r, std::size_t first) const {
  if (!r.slot_ghost(first) || r.slots[first].ghost_first != first) return 0;
  auto it = ghosts.find(r.slots[first].ghost);
  if (it == ghosts.end()) return 0;
  for (const GhostRef& g : it->second)
    if (g.region == &r && g.first == first) return g.marker;
  return 0;
}

void RegionMap::trim_ghost_ages() {
  auto gone = [](const GhostAge& a) {
    return !(a.region->slot_ghost(a.first) && a.region->slots[a.first].ghost_first == a.first &&
             a.region->slots[a.first].ghost == a.handle);
  };
  while (!ghost_ages.empty() && gone(ghost_ages.front())) ghost_ages.pop_front();
  // Entries of ghosts gone behind a long-lived one: compacted once they outnumber the ghosts.
  if (ghost_ages.size() > 2 * ghost_count + 64) std::erase_if(ghost_ages, gone);
}

void RegionMap::purge_ghost_ages(const Region& r) {
  std::erase_if(ghost_ages, [&](const GhostAge& a) { return a.region == &r; });
}

}  // namespace gpumem::alloc::detail
