// Growth by a classic segment (expandable_segments:False, or a source without virtual memory): one
// segment sized for the request the way PyTorch's native allocator sizes it (growth_policy.h),
// reserved — and on a virtual-memory source created and mapped as one piece — without the engine's
// lock (Note [Engine locking], engine.h). Nothing is claimed: a new segment is invisible to other
// threads until it is committed.
#include "cap_policy.h"
#include "engine.h"
#include "growth_policy.h"

namespace gpumem::alloc {

using detail::EventBatch;
using detail::GrowFailure;

namespace {

// The driver work of one classic segment, as plain values.
struct SegmentWork {
  std::size_t size_bytes = 0;
  bool virtual_memory = false;
  VaRange va;
  PhysHandle handle = 0;
  GrowFailure fail;
};

bool create_segment_unlocked(MemorySource& source, SegmentWork& w) {
  auto failed = [&](SourceStatus status) {
    w.fail.status = status;
    w.fail.detail = source.last_error();
    return false;
  };
  const auto reserved = source.reserve(w.size_bytes, 0);
  if (!reserved.ok()) return failed(reserved.status);
  w.va = reserved.value;
  if (!w.virtual_memory) return true;  // a cudaMalloc-style source backs the reservation itself
  const auto h = source.create(w.size_bytes);
  if (!h.ok()) {
    failed(h.status);
    source.release(w.va);
    return false;
  }
  const SourceStatus st = source.map(w.va.base, w.size_bytes, h.value);
  if (st != SourceStatus::ok) {
    failed(st);
    source.destroy(h.value);
    source.release(w.va);
    return false;
  }
  w.handle = h.value;
  return true;
}

}  // namespace

CachingAllocator::Impl::Block* CachingAllocator::Impl::grow_classic_dropping_lock(
    Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded, EventBatch& batch, GrowFailure& fail) {
  growth_mutex.assert_held();
  mutex.assert_held();
  // ---- plan
  SegmentWork w;
  w.size_bytes = policy::classic_segment_bytes(rounded, rules.large_segment_bytes, rules.granularity_bytes);
  w.virtual_memory = caps.virtual_memory;
  if (policy::exceeds_cap(map.reserved_bytes, w.size_bytes, cap)) {
    fail.cap_reached = true;
    fail.status = SourceStatus::out_of_memory;
    return nullptr;
  }
  // ---- act
  lock.unlock();
  const bool ok = create_segment_unlocked(source, w);
  lock.lock();
  // ---- commit
  if (!ok) {
    fail = std::move(w.fail);
    return nullptr;
  }
  Region* r = map.add_region(w.va, pool, stream, false, w.size_bytes);
  if (w.virtual_memory) {
    r->slots.push_back(detail::PieceSlot{w.handle, 0, 1});
  } else {
    r->backed_by_reservation = true;
  }
  map.reserved_bytes += w.va.size_bytes;
  emit(batch, EventKind::segment_alloc, pool, r->va.base, w.va.size_bytes, 0, stream, 1);
  return map.take_front(r->first, rounded, rules.split);
}

}  // namespace gpumem::alloc
