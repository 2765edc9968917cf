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

FreeStatus CachingAllocator::allocate_at_impl(void* ptr, std::size_t size_bytes, std::size_t requested_bytes,
                                              std::optional<StreamId> stream) {
  if (arenas_) {
    // Planned placements (a stream given) are for one engine only (step_plan needs arenas:1).
    if (stream) return FreeStatus::foreign_pointer;
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
    {
      // A block this range lies in may sit in a thread's cache (free to the engine, cached there):
      // hand every cache back first, so the range is one free block if it is free at all.
      detail::WorldStop stop(m.thread_caches);
      m.drain_all_caches_locked();
    }
    // A step plan's placement (stream given): frees whose stream uses have completed since become
    // free first (as an allocation's would), so that a block record_stream'd in the step before is
    // found free again.
    if (stream && m.may_wait()) m.process_pending_locked(batch);
    detail::Region* r = m.map.region_of(addr);
    if (r == nullptr) return FreeStatus::foreign_pointer;
    Block* b = r->first;
    while (b != nullptr && b->end() <= addr) b = b->next;
    if (b == nullptr || b->state != BlockState::free || b->addr > addr || b->end() < addr + size_bytes)
      return FreeStatus::foreign_pointer;
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
