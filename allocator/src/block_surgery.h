// Block surgery: split, merge, carve and best fit on a chain of blocks, written once for the two
// places that own such chains: the engine's regions (RegionMap, under the engine's lock) and a
// thread cache's leases (ThreadCache, under the cache's lock; Note [Thread caches]).
//
// A Space says where the chain's free blocks are indexed and where block objects come from:
//   FreeIndex& index_for(const Block& b)   the index a free block b belongs in
//   Block* make_block()                     a fresh Block (value-initialized)
//   void dispose_block(Block* b)            gives a Block object back
//   std::uint64_t free_stamp() const        what free_seq is set to when a block becomes free
//   Block*& head_of(const Block& b)         the pointer to the first block of b's chain
// The functions below keep the chain's invariants: blocks tile their range in address order through
// prev/next, neighbouring free blocks are merged, every free block is in its index. They decide
// nothing: callers pass what the policy chose.
//
// Thread-safety: none; the Space's owner serializes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "block.h"
#include "free_index.h"
#include "size_policy.h"

namespace gpumem::alloc::detail::surgery {

// Splits b at `at` (b->addr < at < b->end()): b keeps the front, the returned block the rest, with
// b's state, stream, region and lease. Neither is put into or taken out of a container.
template <class Space>
inline Block* split_at(Space& space, Block* b, std::uintptr_t at) {
  Block* rest = space.make_block();
  rest->addr = at;
  rest->size_bytes = b->end() - at;
  rest->stream = b->stream;
  rest->region = b->region;
  rest->lease = static_cast<Lease*>(b->lease);
  rest->state = BlockState(b->state);
  rest->prev = b;
  rest->next = b->next;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  b->size_bytes = at - b->addr;
  return rest;
}

// Splits b at `at` (b->addr < at < b->end()) the other way round: the returned block (fresh) takes
// the front, b keeps the rest and so keeps its place in any container; its key (addr, size)
// changes, so a caller whose b is in a FreeIndex must tell it (resized). The front gets b's state,
// stream, region and lease.
template <class Space>
inline Block* split_front(Space& space, Block* b, std::uintptr_t at) {
  Block* front = space.make_block();
  front->addr = b->addr;
  front->size_bytes = at - b->addr;
  front->stream = b->stream;
  front->region = b->region;
  front->lease = static_cast<Lease*>(b->lease);
  front->state = BlockState(b->state);
  front->prev = b->prev;
  front->next = b;
  if (b->prev) b->prev->next = front;
  else space.head_of(*b) = front;
  b->prev = front;
  b->addr = at;
  b->size_bytes -= front->size_bytes;
  return front;
}

// Absorbs b->next into b (both out of any container) and disposes of it.
template <class Space>
inline void absorb_next(Space& space, Block* b) noexcept {
  Block* n = b->next;
  b->size_bytes += n->size_bytes;
  b->next = n->next;
  if (n->next) n->next->prev = b;
  space.dispose_block(n);
}

// b is free and in no container: merges it with free neighbours and inserts the result into its
// index. Returns the merged block, which may be a neighbour: b itself may be disposed of, so the
// caller uses the result, never b.
template <class Space>
inline Block* insert_free_merged(Space& space, Block* b) {
  FreeIndex& idx = space.index_for(*b);
  Block* p = b->prev && b->prev->state == BlockState::free ? b->prev : nullptr;
  Block* n = b->next && b->next->state == BlockState::free ? b->next : nullptr;
  const std::uint64_t stamp = space.free_stamp();
  if (p) {
    // p grows over b (and n): it keeps its node, moved only if its rank changed.
    const std::size_t old = p->size_bytes;
    if (n) idx.erase(*n);
    absorb_next(space, p);
    if (n) absorb_next(space, p);
    p->free_seq = stamp;
    idx.resized(*p, old);
    return p;
  }
  if (n) {
    // n grows down over b: it keeps its node (moved only if its rank changed), b is disposed of.
    // The common free of a pair: the block split off n's front comes back.
    const std::size_t old = n->size_bytes;
    n->addr = b->addr;
    n->size_bytes += b->size_bytes;
    n->prev = b->prev;
    if (b->prev) b->prev->next = n;
    else space.head_of(*b) = n;
    n->free_seq = stamp;
    idx.resized(*n, old);
    space.dispose_block(b);
    return n;
  }
  b->free_seq = stamp;
  idx.insert(*b);
  return b;
}

// b is free and out of its index; cuts [addr, addr + size) out of it and returns that block (free,
// in no container). The remainders go back to the index.
template <class Space>
inline Block* carve(Space& space, Block* b, std::uintptr_t addr, std::size_t size) {
  FreeIndex& idx = space.index_for(*b);
  if (addr > b->addr) {
    Block* mid = split_at(space, b, addr);
    b->free_seq = space.free_stamp();
    idx.insert(*b);
    b = mid;
  }
  if (b->size_bytes > size) {
    Block* rest = split_at(space, b, b->addr + size);
    rest->free_seq = space.free_stamp();
    idx.insert(*rest);
  }
  return b;
}

// Best fit in idx (the free blocks of one pool) for a request of `rounded` on `stream`: the block
// (free, out of the index; the rest split off as the policy says), or null.
template <class Space>
inline Block* take_best_fit(Space& space, FreeIndex& idx, PoolKind pool, StreamId stream, std::size_t rounded,
                            const policy::SplitLimits& limits) {
  Block* b = idx.best_fit(stream, rounded);
  if (b == nullptr) return nullptr;
  if (!b->region->expandable &&
      !policy::accept_cached_classic(b->size_bytes, rounded, limits.max_split_bytes,
                                     limits.max_non_split_rounding_bytes))
    return nullptr;
  if (!policy::should_split(b->region->expandable, pool, b->size_bytes, rounded, limits.max_split_bytes)) {
    idx.erase(*b);
    return b;
  }
  // A fresh block takes the front; b keeps the rest and its node in the index (in place unless the
  // rest changed class or rank), so a pair (take, then free merging it back) touches each index
  // node once, and usually not its tree.
  const std::size_t old = b->size_bytes;
  Block* front = split_front(space, b, b->addr + rounded);
  b->free_seq = space.free_stamp();
  idx.resized(*b, old);
  return front;
}

}  // namespace gpumem::alloc::detail::surgery
