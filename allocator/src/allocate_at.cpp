// CachingAllocator::allocate_at: an allocation at a recorded address, for restoring a pool's state
// (PyTorch's cudagraph trees re-create the blocks a CUDA graph's outputs live in; see
// docs/notes/graph-pools.md). The range must be free mapped memory of one block: the block is
// carved to exactly the range (the rest stays free, in the free index) and handed out as an
// ordinary allocation (alloc event, counters, live table). It never grows and never waits.
#include "arenas.h"
#include "engine.h"
#include "size_policy.h"

namespace gpumem::alloc {

using detail::Block;
using detail::EventBatch;

FreeStatus CachingAllocator::allocate_at(void* ptr, std::size_t size_bytes, std::size_t requested_bytes) {
  return allocate_at_impl(ptr, size_bytes, requested_bytes, std::nullopt);
}

namespace {

// The block of r's chain that holds addr (or nullptr), walked to from the block at the hint when
// that is a block of r's chain on the hint's side of [addr, addr + size), else from r's first.
// Under the engine's lock; the chain changes only under it (thread caches' sub-blocks are not in
// it), so any block of it found in the live table is a valid place to start.
Block* block_at(CachingAllocator::Impl& m, detail::Region& r, std::uintptr_t addr, std::size_t size,
                StepPlacementHint hint) {
  if (hint.neighbour != 0) {
    Block* h = m.live.find(hint.neighbour, m.use_caches());
    if (h != nullptr && h->region == &r && static_cast<detail::Lease*>(h->lease) == nullptr &&
        (h->state == BlockState::allocated || h->state == BlockState::pending_free)) {
      if (!hint.above && h->end() <= addr) {
        Block* b = h;
        while (b != nullptr && b->end() <= addr) b = b->next;
        return b;
      }
      if (hint.above && h->addr >= addr + size) {
        Block* b = h;
        while (b != nullptr && b->addr > addr) b = b->prev;
        return b;
      }
    }
  }
  Block* b = r.first;
  while (b != nullptr && b->end() <= addr) b = b->next;
  return b;
}

bool holds(const Block* b, std::uintptr_t addr, std::size_t size) {
  return b != nullptr && b->state == BlockState::free && b->addr <= addr && b->end() >= addr + size;
}

}  // namespace

FreeStatus CachingAllocator::allocate_at_impl(void* ptr, std::size_t size_bytes, std::size_t requested_bytes,
                                              std::optional<StreamId> stream, StepPlacementHint hint) {
  if (arenas_) {
    // A step plan's placement (a stream given) goes to the first arena, where its arena range was
    // taken (take_arena_range), while no thread has moved; after that the planner stops at its next
    // call, and this one falls back (nothing changes).
    if (stream) {
      if (arenas_->routing()) return FreeStatus::foreign_pointer;
      return arenas_->first_arena().allocate_at_impl(ptr, size_bytes, requested_bytes, stream, hint);
    }
    return arenas_->allocate_at(ptr, size_bytes, requested_bytes);
  }
  Impl& m = *impl_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (ptr == nullptr) return FreeStatus::null_pointer;
  if (size_bytes == 0 || size_bytes % policy::kMinBlockBytes != 0 || addr % policy::kMinBlockBytes != 0)
    return FreeStatus::foreign_pointer;
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  {
    Impl::Lock lock(m.mutex);
    // A step plan's placement (stream given): frees whose stream uses have completed since become
    // free first (as an allocation's would), so that a block record_stream'd in the step before is
    // found free again.
    if (stream && m.may_wait()) m.process_pending_locked(batch);
    detail::Region* r = m.map.region_of(addr);
    if (r == nullptr) return FreeStatus::foreign_pointer;
    // A placement looks first without stopping the threads (the range is usually one free block);
    // a graph pool's restore, and a placement that found no free block holding the range, hand
    // every thread's cache back first: a block the range lies in may sit in one (free to the
    // engine, cached there), and is then part of one free block if the range is free at all.
    Block* b = stream ? block_at(m, *r, addr, size_bytes, hint) : nullptr;
    if (!holds(b, addr, size_bytes)) {
      {
        detail::WorldStop stop(m.thread_caches);
        m.drain_all_caches_locked();
      }
      b = block_at(m, *r, addr, size_bytes, {});
    }
    if (!holds(b, addr, size_bytes)) return FreeStatus::foreign_pointer;
    // ... and only in memory of its own stream: a block carved from another stream's free memory
    // would go back to that stream's free blocks with no event between the two streams' uses.
    if (stream && b->stream != *stream) return FreeStatus::foreign_pointer;
    m.map.index_of(*r).erase(*b);
    b = m.map.carve(b, addr, size_bytes);
    b->state = BlockState::allocated;
    b->requested_bytes = requested_bytes;
    m.live.insert(*b, m.use_caches());
    m.allocated_bytes += b->size_bytes;
    m.requested_bytes += requested_bytes;
    b->alloc_seq = m.emit(batch, EventKind::alloc, r->pool, b->addr, b->size_bytes, requested_bytes, b->stream);
    m.maybe_check_locked();
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
  return FreeStatus::ok;
}

}  // namespace gpumem::alloc
