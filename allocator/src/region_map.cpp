#include "region_map.h"

#include <cstdio>
#include <cstdlib>

namespace gpumem::alloc::detail {

void invariant_failed(const char* what) {
  std::fprintf(stderr, "gpumem: engine invariant broken: %s\n", what);
  std::abort();
}

Region* RegionMap::add_region(VaRange va, PoolKind pool, StreamId stream, bool expandable, std::size_t piece_bytes) {
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
    r->piece_bytes = piece_bytes;
    r->slots.resize(va.size_bytes / piece_bytes);
    b->state = BlockState::unmapped;
    r->unmapped.insert(*b);
  } else {
    r->piece_bytes = va.size_bytes;
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

Block* RegionMap::claim_slot(Block* b, std::size_t slot) {
  Region& r = *b->region;
  const std::uintptr_t sa = r.slot_addr(slot);
  if (b->state != BlockState::free || !r.expandable || sa < b->addr || sa + r.piece_bytes > b->end())
    invariant_failed("claim_slot: the block is not free or does not hold the whole slot");
  FreeIndex& idx = index_of(r);
  idx.erase(*b);
  Block* mid = b;
  if (sa > b->addr) {
    mid = split_at(b, sa);
    b->free_seq = tick;
    idx.insert(*b);
  }
  if (mid->end() > sa + r.piece_bytes) {
    Block* rest = split_at(mid, sa + r.piece_bytes);
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
      if ((x->addr - r.va.base) % r.piece_bytes || x->size_bytes % r.piece_bytes)
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
      mapped = r.slots[first].mapped;
      std::size_t s = first + 1;
      while (s <= last && r.slots[s].mapped == mapped) ++s;
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

void RegionMap::record_slot_mapped(Region& r, std::size_t slot, PhysHandle handle) noexcept {
  r.slots[slot] = PieceSlot{handle, true};
  r.mapped_bytes += r.piece_bytes;
}

void RegionMap::record_slot_unmapped(Block* b) {
  Region& r = *b->region;
  if (b->state != BlockState::claimed || b->size_bytes != r.piece_bytes || (b->addr - r.va.base) % r.piece_bytes)
    invariant_failed("record_slot_unmapped: not a claimed one-slot block");
  r.slots[r.slot_of(b->addr)] = PieceSlot{};
  r.mapped_bytes -= r.piece_bytes;
  --r.claims;
  --claimed_blocks;
  b->state = BlockState::unmapped;
  insert_unmapped_merged(b);
}

}  // namespace gpumem::alloc::detail
