// Block, PieceSlot and Region: the engine's data model. Internal to allocator/.
//
// Glossary
//   region   A range of address space the engine got from one MemorySource::reserve(). Either a
//            classic segment (expandable == false: backed as a whole, by one physical piece on a
//            virtual-memory source or by the reservation itself on a cudaMalloc-style source) or an
//            expandable region (one per (stream, pool), physical pieces mapped slot by slot).
//   slot     A slot_bytes-long, slot-aligned part of an expandable region (2 MiB by default: the
//            smallest piece); it is mapped or not.
//   piece    A physical piece: one MemorySource handle of a whole number of slots, mapped by one
//            map() call over consecutive slots and unmapped as a whole. Pieces of one region may
//            differ in length (growth_policy.h says how long each is).
//   block    A contiguous address range inside a region with one state. The blocks of a region tile
//            it exactly, in address order, through prev/next.
//   ghost    A kept mapping (Config::recycle_keep_mappings): unmapped slots (in the engine's view:
//            never handed out, free for growth to map) over which the source still maps a piece
//            that has moved elsewhere. A ghost spans exactly one piece's length; a piece may have
//            several. Moving a piece onto its own ghost costs no driver call; any other use of the
//            slots unmaps the ghost first (Note [Physical page recycling], "Kept mappings").
//   claim    A block in state `claimed`: taken out of every container by a growth or a release in
//            progress, which owns it while the engine's lock is dropped around driver calls (see
//            Note [Engine locking] in docs/notes/engine-locking.md). Nobody else reads or changes a
//            claimed block; its neighbours never merge with it.
//
// Invariants (checked by CachingAllocator::check_invariants)
//   * blocks tile [region.base, region.base + region.size_bytes), prev/next consistent;
//   * every slot overlapped by an allocated, pending_free or free block is mapped; unmapped blocks
//     start and end on slot boundaries and every slot they cover is unmapped;
//   * the mapped slots of an expandable region are tiled by pieces: slot s of a piece starting at
//     slot f with n slots has first == f, count == n and the piece's handle, for f <= s < f + n;
//     region.pieces counts them;
//   * no two neighbouring blocks are both free, nor both unmapped (they are merged);
//   * a free block is in exactly one FreeIndex; an unmapped block is in its region's unmapped set;
//     allocated, pending_free and cached blocks are in the live-block table; nothing else is in
//     those; a cached block is in exactly one ThreadCache bin; a claimed block is in none of them;
//   * a claimed block of an expandable region covers only mapped or only unmapped slots, and
//     region.claims counts the claimed blocks of the region;
//   * region.mapped_bytes == (mapped slots) x slot_bytes, or size_bytes for a classic segment;
//   * a ghost covers only unmapped slots, tiled like pieces (ghost_first, ghost_count, ghost); its
//     piece is mapped somewhere in the engine; region.ghosts counts the region's ghosts and
//     RegionMap::ghosts lists every ghost under its piece's handle.
#pragma once

#include <boost/intrusive/set.hpp>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpumem/alloc/events.h"
#include "gpumem/alloc/introspection.h"
#include "gpumem/alloc/memory_source.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc::detail {

namespace bi = boost::intrusive;
using SetHook = bi::set_member_hook<bi::link_mode<bi::normal_link>>;

struct Region;
struct Block;
struct Lease;  // thread_cache.h

// A block's links in the live-block table's chain (live_table.h): the next block of its bucket,
// and the link that points at it (null: not in the table).
struct LiveHook {
  Block* next = nullptr;
  Block** pprev = nullptr;
};

// Streams a block was used on besides its own (record_stream), and the markers recorded on them
// when the block was freed. Allocated only for blocks that were recorded on another stream.
struct StreamUses {
  std::vector<StreamId> streams;
  std::vector<EventToken> markers;
};

// A block's state is read by the engine under its lock while a thread-cache fast path on another
// thread may switch a neighbouring block between allocated and cached (never to or from free or
// unmapped, the states the engine acts on). Relaxed atomics make that well-defined at the cost of
// plain loads and stores.
class AtomicState {
 public:
  AtomicState(BlockState s = BlockState::free) noexcept : v_(s) {}
  AtomicState& operator=(BlockState s) noexcept {
    v_.store(s, std::memory_order_relaxed);
    return *this;
  }
  operator BlockState() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<BlockState> v_;
};

// Block::lease, read by a thread that frees another thread's block before it holds the owner's
// cache lock (it checks again under that lock): relaxed atomic loads and stores, like AtomicState.
class AtomicLease {
 public:
  AtomicLease& operator=(Lease* l) noexcept {
    v_.store(l, std::memory_order_relaxed);
    return *this;
  }
  operator Lease*() const noexcept { return v_.load(std::memory_order_relaxed); }
  Lease* operator->() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<Lease*> v_{nullptr};
};

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size_bytes = 0;
  std::size_t requested_bytes = 0;  // allocated/pending_free: the user's request
  StreamId stream = 0;              // == region->stream; copied for the free index's key
  Region* region = nullptr;
  Block* prev = nullptr;            // address order within the region
  Block* next = nullptr;
  std::uint64_t alloc_seq = 0;      // seq of the alloc event (allocated/pending_free)
  std::uint64_t free_seq = 0;       // seq when it last became free (classic GC ages)
  std::unique_ptr<StreamUses> uses; // non-null only after record_stream on another stream
  // The thread-cache lease this block belongs to (Note [Thread caches]): for a lease's own block
  // (state cached, in the region's chain) and for the blocks it is cut into (sub-blocks: not in the
  // chain; allocated ones in the live table, free ones in the cache's index). Null otherwise.
  AtomicLease lease;
  AtomicState state;
  std::uint16_t free_class = 0;     // in a FreeIndex: the size class it is indexed in (free_index.h)
  SetHook set_hook;                 // FreeIndex (free) or Region::unmapped (unmapped)
  LiveHook live_hook;               // LiveTable (allocated, pending_free, cached)

  std::uintptr_t end() const noexcept { return addr + size_bytes; }
};

// One slot of an expandable region (or the one piece of a classic segment on a virtual-memory
// source): which piece maps it.
struct PieceSlot {
  PhysHandle handle = 0;    // the piece's handle (mapped slots)
  std::uint32_t first = 0;  // the piece's first slot
  std::uint32_t count = 0;  // the piece's length in slots; 0: the slot is unmapped
  // An unmapped slot under a ghost (a kept mapping of a piece that lives elsewhere now): the
  // piece's handle, the ghost's first slot and length; ghost_count == 0: no ghost.
  PhysHandle ghost = 0;
  std::uint32_t ghost_first = 0;
  std::uint32_t ghost_count = 0;
  bool mapped() const noexcept { return count != 0; }
  bool has_ghost() const noexcept { return ghost_count != 0; }
};

// Unmapped blocks of one region, by address.
struct BlockAddrLess {
  bool operator()(const Block& a, const Block& b) const noexcept { return a.addr < b.addr; }
};
using UnmappedSet =
    bi::set<Block, bi::member_hook<Block, SetHook, &Block::set_hook>, bi::compare<BlockAddrLess>,
            bi::constant_time_size<true>>;

struct Region {
  VaRange va;
  PoolKind pool = PoolKind::large;
  StreamId stream = 0;
  bool expandable = false;
  std::size_t slot_bytes = 0;           // expandable: slot size; classic: == va.size_bytes
  // Expandable: one per slot up to the highest slot ever mapped (grown on demand; the slots past
  // its end are unmapped). Classic on a virtual-memory source: one, the segment's piece.
  std::vector<PieceSlot> slots;
  std::size_t pieces = 0;               // expandable: pieces mapped
  bool backed_by_reservation = false;   // classic segment on a non-virtual-memory source
  std::size_t mapped_bytes = 0;
  std::uint64_t created_seq = 0;
  std::size_t claims = 0;               // claimed blocks: while > 0 the region is never dropped
  std::size_t ghosts = 0;               // kept mappings in it: while > 0 the region is never dropped
  Block* first = nullptr;
  UnmappedSet unmapped;

  std::size_t slot_of(std::uintptr_t addr) const noexcept { return (addr - va.base) / slot_bytes; }
  std::uintptr_t slot_addr(std::size_t slot) const noexcept { return va.base + slot * slot_bytes; }
  std::size_t slot_count() const noexcept { return va.size_bytes / slot_bytes; }
  bool slot_mapped(std::size_t slot) const noexcept { return slot < slots.size() && slots[slot].mapped(); }
  bool slot_ghost(std::size_t slot) const noexcept { return slot < slots.size() && slots[slot].has_ghost(); }
  // The piece holding mapped slot `slot`: its first slot and length.
  std::size_t piece_first(std::size_t slot) const noexcept { return slots[slot].first; }
  std::size_t piece_slots(std::size_t slot) const noexcept { return slots[slot].count; }
};

}  // namespace gpumem::alloc::detail
