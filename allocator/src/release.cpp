// Giving memory back: empty_cache() and the OOM retry's release (every wholly free piece and
// classic segment, both pools, every stream), garbage collection (release_policy.h), and waiting for
// pending frees. Each runs as plan -> act -> commit (Note [Engine locking], engine.h):
//
//   plan    (engine lock) drain the thread caches; claim what goes back (wholly free pieces, wholly
//           free segments) or move the pending frees to `waiting`, so nobody else uses them.
//   act     (no engine lock) synchronize the streams that used the memory, unmap and destroy the
//           pieces, free the segments, release address space.
//   commit  (engine lock) record what went back, unclaim what could not be unmapped, emit events.
#include <algorithm>
#include <vector>

#include "engine.h"
#include "release_policy.h"
#include "size_policy.h"

namespace gpumem::alloc {

using detail::Block;
using detail::EventBatch;
using detail::Region;

namespace {

void note_stream(std::vector<StreamId>& streams, StreamId s) {
  if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
}

// A classic segment's memory, as plain values.
struct SegmentMemory {
  VaRange va;
  PhysHandle handle = 0;
  bool backed_by_reservation = false;
  bool released = false;  // result: given back (a segment that could not be unmapped stays cached)
};

SegmentMemory segment_memory(const Region& r) {
  return {r.va, r.backed_by_reservation ? 0 : r.slots[0].handle, r.backed_by_reservation, false};
}

// The driver work of one release, as plain values.
struct ReleaseWork {
  struct Piece {
    std::uintptr_t addr = 0;
    std::size_t size_bytes = 0;
    PhysHandle handle = 0;
    std::size_t group = 0;  // pieces of one free block: the group stops at its first failed unmap
    bool released = false;  // result: unmapped and destroyed
  };
  struct Ghost {
    std::uintptr_t va = 0;    // a kept mapping (block.h): unmapped before any piece is destroyed
    std::size_t bytes = 0;
    PhysHandle handle = 0;
    bool unmapped = false;    // result
  };
  std::vector<StreamId> sync_streams;  // streams whose memory goes back (synchronized first)
  std::vector<Ghost> ghosts;
  std::vector<Piece> pieces;
  std::vector<SegmentMemory> segments;  // freed whole
};

void run_release_unlocked(MemorySource& source, StreamEvents& events, ReleaseWork& w) {
  for (StreamId s : w.sync_streams) events.synchronize_stream(s);
  // Every kept mapping first: a piece is destroyed only once no mapping of it is left.
  std::vector<PhysHandle> still_aliased;
  for (auto& g : w.ghosts) {
    g.unmapped = source.unmap(g.va, g.bytes) == SourceStatus::ok;
    if (!g.unmapped) still_aliased.push_back(g.handle);
  }
  std::size_t failed_group = static_cast<std::size_t>(-1);
  for (auto& p : w.pieces) {
    if (p.group == failed_group) continue;
    if (std::find(still_aliased.begin(), still_aliased.end(), p.handle) != still_aliased.end()) {
      failed_group = p.group;  // a kept mapping of it could not be unmapped: it stays
      continue;
    }
    if (source.unmap(p.addr, p.size_bytes) != SourceStatus::ok) {
      failed_group = p.group;
      continue;
    }
    source.destroy(p.handle);
    p.released = true;
  }
  for (SegmentMemory& s : w.segments) {
    if (s.backed_by_reservation) {
      s.released = source.release(s.va) == SourceStatus::ok;
      continue;
    }
    if (source.unmap(s.va.base, s.va.size_bytes) != SourceStatus::ok) continue;
    // Unmapped: destroying the piece and releasing the range cannot fail in a way that keeps the
    // memory usable, so the segment is gone whatever they answer.
    source.destroy(s.handle);
    source.release(s.va);
    s.released = true;
  }
}

}  // namespace

void CachingAllocator::Impl::wait_pending_dropping_lock(Lock& lock, EventBatch& batch) {
  growth_mutex.assert_held();
  mutex.assert_held();
  if (pending.empty() || !may_wait()) return;
  // ---- plan: the pending frees move to `waiting`, where no other thread completes them (and so
  // releases their markers) while this one waits.
  waiting.swap(pending);
  std::vector<EventToken> markers;
  for (const Block* b : waiting)
    for (EventToken t : b->uses->markers) markers.push_back(t);
  // ---- act
  lock.unlock();
  for (EventToken t : markers) events.synchronize(t);
  lock.lock();
  // ---- commit
  complete_pending_locked(waiting, batch);
  pending.insert(pending.end(), waiting.begin(), waiting.end());  // any still outstanding
  waiting.clear();
}

std::size_t CachingAllocator::Impl::release_cached_dropping_lock(Lock& lock, EventBatch& batch) {
  growth_mutex.assert_held();
  mutex.assert_held();
  if (!may_release()) {
    // Holding: the pending frees may still complete; capturing: not even that (no waits).
    if (may_wait()) wait_pending_dropping_lock(lock, batch);
    return 0;
  }
  {
    detail::WorldStop stop(thread_caches);
    drain_all_caches_locked();
  }
  wait_pending_dropping_lock(lock, batch);
  const std::size_t before = map.reserved_bytes;

  // ---- plan: claim every wholly free piece (from the highest down in each free block, which
  // keeps the part below it) and every wholly free classic segment, in free-index order.
  ReleaseWork w;
  struct Claim {
    Block* block;
    bool segment;
  };
  std::vector<Claim> claims;
  std::vector<Block*> candidates;
  // Every kept mapping goes (they hold no memory, but a piece is destroyed and a region's address
  // space freed only once none is left in the way).
  std::vector<std::pair<Region*, std::size_t>> ghost_slots;  // parallel to w.ghosts
  for (const auto& [handle, list] : map.ghosts)
    for (const auto& g : list) {
      w.ghosts.push_back({g.region->slot_addr(g.first), g.count * g.region->slot_bytes, handle, false});
      ghost_slots.emplace_back(g.region, g.first);
      note_stream(w.sync_streams, g.region->stream);
    }
  std::size_t group = 0;
  for (int pool = 0; pool < 2; ++pool) {
    candidates.clear();
    for (Block& b : map.free_index[pool].blocks()) candidates.push_back(&b);  // claiming changes the index
    for (Block* b : candidates) {
      Region& r = *b->region;
      if (r.expandable) {
        // The pieces wholly inside b, from the highest down (claim_piece keeps the part below in b).
        std::vector<std::size_t> firsts;
        for (std::size_t s = r.slot_of(b->addr + r.slot_bytes - 1); s < r.slot_count() && r.slot_addr(s) < b->end();) {
          if (!r.slot_mapped(s)) break;
          const std::size_t f = r.piece_first(s), n = r.piece_slots(s);
          if (f == s && r.slot_addr(f + n) <= b->end()) firsts.push_back(f);
          s = f + n;
        }
        if (firsts.empty()) continue;
        note_stream(w.sync_streams, r.stream);
        ++group;
        for (auto it = firsts.rbegin(); it != firsts.rend(); ++it) {
          w.pieces.push_back({r.slot_addr(*it), r.piece_slots(*it) * r.slot_bytes, r.slots[*it].handle, group, false});
          claims.push_back({map.claim_piece(b, *it), false});
        }
      } else if (b->prev == nullptr && b->next == nullptr) {
        note_stream(w.sync_streams, r.stream);
        w.segments.push_back(segment_memory(r));
        map.claim_block(b);
        claims.push_back({b, true});
      }
    }
  }

  // ---- act
  if (!claims.empty() || !w.ghosts.empty()) {
    lock.unlock();
    run_release_unlocked(source, events, w);
    lock.lock();
  }

  // ---- commit
  for (std::size_t i = 0; i < w.ghosts.size(); ++i)
    if (w.ghosts[i].unmapped)
      if (const EventToken m = map.remove_ghost(*ghost_slots[i].first, ghost_slots[i].second)) events.release(m);
  std::size_t piece_i = 0, segment_i = 0;
  for (const Claim& c : claims) {
    Region& r = *c.block->region;
    if (c.segment) {
      if (w.segments[segment_i++].released) {
        drop_segment_locked(r, batch);
      } else {
        map.unclaim(c.block);
      }
      continue;
    }
    const ReleaseWork::Piece& p = w.pieces[piece_i++];
    if (!p.released) {
      map.unclaim(c.block);
      continue;
    }
    map.record_piece_unmapped(c.block);
    map.reserved_bytes -= p.size_bytes;
    emit(batch, EventKind::segment_unmap, r.pool, p.addr, p.size_bytes, 0, r.stream, 1);
  }

  // Expandable regions with nothing mapped (and nothing in progress) give their address space back.
  std::vector<VaRange> ranges;
  std::vector<Region*> empty;
  for (auto& [base, r] : map.regions)
    if (r->expandable && r->mapped_bytes == 0 && r->first->next == nullptr && r->claims == 0 && r->ghosts == 0)
      empty.push_back(r.get());
  for (Region* r : empty) {
    ranges.push_back(r->va);
    map.drop_region(*r);
  }
  if (!ranges.empty()) {
    lock.unlock();
    for (const VaRange& va : ranges) source.release(va);
    lock.lock();
  }
  return before - map.reserved_bytes;
}

void CachingAllocator::Impl::collect_garbage_dropping_lock(Lock& lock, EventBatch& batch) {
  growth_mutex.assert_held();
  mutex.assert_held();
  if (!may_release()) return;
  // ---- plan
  std::vector<policy::GcCandidate> candidates;
  std::vector<Block*> blocks;
  for (Block& b : map.free_index[static_cast<int>(PoolKind::large)].blocks())
    if (!b.region->expandable && !b.prev && !b.next) {
      candidates.push_back({b.region->va.size_bytes, b.free_seq, b.addr});
      blocks.push_back(&b);
    }
  const std::vector<std::size_t> victims =
      policy::choose_gc_victims(candidates, rules.garbage_collection_threshold, map.reserved_bytes, cap);
  if (victims.empty()) return;
  ReleaseWork w;
  std::vector<Block*> claimed;
  for (std::size_t i : victims) {
    Block* b = blocks[i];
    note_stream(w.sync_streams, b->region->stream);
    w.segments.push_back(segment_memory(*b->region));
    map.claim_block(b);
    claimed.push_back(b);
  }
  // ---- act
  lock.unlock();
  run_release_unlocked(source, events, w);
  lock.lock();
  // ---- commit
  for (std::size_t i = 0; i < claimed.size(); ++i) {
    if (w.segments[i].released) {
      drop_segment_locked(*claimed[i]->region, batch);
    } else {
      map.unclaim(claimed[i]);
    }
  }
}

void CachingAllocator::Impl::drop_segment_locked(Region& r, EventBatch& batch) {
  mutex.assert_held();
  map.reserved_bytes -= r.va.size_bytes;
  emit(batch, EventKind::segment_free, r.pool, r.va.base, r.va.size_bytes, 0, r.stream, 1);
  map.drop_region(r);
}

}  // namespace gpumem::alloc
