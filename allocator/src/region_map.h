// RegionMap: the regions of one engine and the blocks that tile them, each block kept in the
// container its state puts it in. Region mechanics: add and drop regions, split, merge, carve,
// best fit, claim (take blocks out of every container for an operation in progress) and commit
// (record pieces mapped or unmapped, put claimed blocks back). It decides nothing (callers pass what
// the policy chose) and never calls a MemorySource: the driver calls happen in growth and release,
// without the engine's lock, between a claim and its commit (Note [Engine locking],
// docs/notes/engine-locking.md).
//
// Containers by block state (block.h has the data model and its glossary):
//   free      -> free_index[region.pool]      unmapped -> region.unmapped
//   claimed   -> none; counted in region.claims and claimed_blocks
//   allocated, pending_free, cached -> the engine's live-block table, not here
//
// Invariants (checked by the engine's check_invariants), beyond those of block.h:
//   * reserved_bytes == sum over regions of mapped_bytes; va_bytes == sum of region sizes;
//   * claimed_blocks == number of claimed blocks == sum of region.claims.
// Functions that take a block say which state and container it must be in; breaking that is an
// internal error.
//
// Thread-safety: none. Every member is used under the engine's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "block.h"
#include "block_arena.h"
#include "block_surgery.h"
#include "free_index.h"
#include "size_policy.h"

namespace gpumem::alloc::detail {

// Aborts with a description: an engine invariant is broken (a bug, never a user error).
[[noreturn]] void invariant_failed(const char* what);

class RegionMap {
 public:
  using Regions = std::map<std::uintptr_t, std::unique_ptr<Region>>;

  RegionMap() = default;
  RegionMap(const RegionMap&) = delete;
  RegionMap& operator=(const RegionMap&) = delete;

  Regions regions;            // by base address
  FreeIndex free_index[2];    // by PoolKind
  BlockArena arena;
  std::size_t reserved_bytes = 0;  // physical memory mapped in regions (pieces, classic segments)
  std::size_t va_bytes = 0;        // address space of all regions
  std::size_t claimed_blocks = 0;
  std::uint64_t tick = 0;          // engine order of changes (advanced by the engine per event)
  // Kept mappings (block.h, "ghost"), by the handle of the piece they map.
  struct GhostRef {
    Region* region = nullptr;
    std::size_t first = 0;  // its first slot
    std::size_t count = 0;
    EventToken marker = 0;  // recorded on its stream when the piece moved away (0: none)
  };
  std::unordered_map<PhysHandle, std::vector<GhostRef>> ghosts;
  std::size_t ghost_bytes = 0;     // address space under ghosts (no physical memory of its own)
  // Ghosts in the order they were made (oldest first), for eviction; entries whose ghost is gone
  // are skipped (a region is dropped only without ghosts, and then its entries are purged).
  struct GhostAge {
    PhysHandle handle = 0;
    Region* region = nullptr;
    std::size_t first = 0;
  };
  std::deque<GhostAge> ghost_ages;
  std::size_t ghost_count = 0;     // ghosts in all regions
  std::unordered_map<EventToken, std::size_t> marker_refs;  // ghosts sharing each marker

  FreeIndex& index_of(const Region& r) noexcept { return free_index[static_cast<int>(r.pool)]; }

  // ---- regions

  // Adds a region over va (reserved by the caller). Expandable: one unmapped block in its unmapped
  // set, no slot mapped. Classic: one free block in no container (the caller carves it or hands it
  // out), mapped_bytes = the whole range. created_seq = tick + 1 (the next event's tick).
  // reserved_bytes is the caller's to change.
  // slot_bytes: an expandable region's slot size (ignored for a classic segment).
  Region* add_region(VaRange va, PoolKind pool, StreamId stream, bool expandable, std::size_t slot_bytes);
  // Removes a region whose only block is free (classic; in the free index or not), unmapped
  // (expandable; in its set) or claimed, and that has no other claim. reserved_bytes is the
  // caller's to change.
  void drop_region(Region& r);
  // The region holding addr, or null.
  Region* region_of(std::uintptr_t addr) noexcept;

  // ---- block surgery (block_surgery.h; no container changes unless said)

  // Splits b at `at` (b.addr < at < b.end()): b keeps the front, the returned block the rest, with
  // b's state. Neither is put into or taken out of a container.
  Block* split_at(Block* b, std::uintptr_t at) { return surgery::split_at(*this, b, at); }
  // Absorbs b->next into b (both out of any container) and disposes of it.
  void absorb_next(Block* b) noexcept { surgery::absorb_next(*this, b); }
  // b is free and in no container: merges it with free neighbours and inserts the result into the
  // free index. Returns the merged block (b may be disposed of: use the result).
  Block* insert_free_merged(Block* b) { return surgery::insert_free_merged(*this, b); }

  // b is unmapped and in no container: merges it with unmapped neighbours and inserts the result
  // into the region's unmapped set.
  void insert_unmapped_merged(Block* b);

  // b is free and out of the free index; cuts [addr, addr + size) out of it and returns that block
  // (free, in no container). The remainders go back to the free index.
  Block* carve(Block* b, std::uintptr_t addr, std::size_t size) { return surgery::carve(*this, b, addr, size); }

  // Hands out b (free, out of the free index) for a request of `rounded`, splitting off the rest
  // when the policy says so.
  Block* take_front(Block* b, std::size_t rounded, const policy::SplitLimits& limits) {
    if (policy::should_split(b->region->expandable, b->region->pool, b->size_bytes, rounded, limits.max_split_bytes))
      return carve(b, b->addr, rounded);
    return b;
  }

  // Best fit among the free blocks of (pool, stream) for a request of `rounded`: the block (free,
  // out of the free index; the rest split off as the policy says), or null. The fast path.
  Block* take_cached(PoolKind pool, StreamId stream, std::size_t rounded, const policy::SplitLimits& limits) {
    return surgery::take_best_fit(*this, free_index[static_cast<int>(pool)], pool, stream, rounded, limits);
  }

  // ---- the Space of block_surgery.h
  FreeIndex& index_for(const Block& b) noexcept { return index_of(*b.region); }
  Block* make_block() { return arena.make(); }
  void dispose_block(Block* b) noexcept { arena.dispose(b); }
  std::uint64_t free_stamp() const noexcept { return tick; }
  Block*& head_of(const Block& b) noexcept { return b.region->first; }

  // ---- claims: blocks an operation in progress owns while the engine's lock is dropped

  // b is free, in the free index, in an expandable region, and holds the whole piece that starts at
  // slot `slot`: claims that piece's block (returned). What b held below and above the piece stays
  // free in the index; b itself keeps the part below (so b is still the block to claim the next
  // lower piece from).
  Block* claim_piece(Block* b, std::size_t slot);
  // b is free and in the free index: claims it whole.
  void claim_block(Block* b);
  // Claims [lo, hi) of one region, starting the search at `from` (a block at or below lo): every
  // block overlapping it must be free or unmapped; those are split at lo and hi (an unmapped block
  // only at slot boundaries), the parts outside go back to their containers, and the claimed
  // blocks are appended to `out` in address order.
  void claim_range(Block* from, std::uintptr_t lo, std::uintptr_t hi, std::vector<Block*>& out);
  // Puts claimed block b back: the parts over mapped slots (or all of a classic segment's block)
  // become free, the parts over unmapped slots unmapped, each merged with its neighbours and
  // inserted into its container. Returns the last free block it produced (merged), or null.
  Block* unclaim(Block* b);

  // Commit: the piece `handle` is now mapped over slots [first, first + count) of r (unmapped slots
  // under claimed blocks). The blocks stay claimed until unclaim().
  void record_piece_mapped(Region& r, std::size_t first, std::size_t count, PhysHandle handle);
  // Commit: b is a claimed block of exactly one piece, which has been unmapped: its slots are
  // cleared and b becomes unmapped, merged into the region's unmapped set.
  void record_piece_unmapped(Block* b);

  // ---- ghosts (kept mappings; the slots' blocks keep their state and container)

  // Slots [first, first + count) of r, unmapped and without a ghost, still map piece `handle`;
  // marker (shared by the ghosts of one growth and stream; 0: none) completes once the work that
  // used them is done.
  void add_ghost(Region& r, std::size_t first, std::size_t count, PhysHandle handle, EventToken marker);
  // The ghost starting at slot `first` of r is gone (unmapped, or its piece mapped there again).
  // Returns its marker when no other ghost shares it (the caller releases it), else 0.
  EventToken remove_ghost(Region& r, std::size_t first);
  // The ghost's marker (0 if none), or 0 if no ghost starts there.
  EventToken ghost_marker(const Region& r, std::size_t first) const;
  // Drops ghost_ages entries whose ghost is gone from its front, and every entry of a region about
  // to be dropped.
  void trim_ghost_ages();
  void purge_ghost_ages(const Region& r);

 private:
  void note_claimed(Block* b) noexcept;
};

}  // namespace gpumem::alloc::detail
