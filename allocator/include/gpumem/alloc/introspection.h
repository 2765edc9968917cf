// Read-only views of an engine's state: what snapshots, reports and the viewer are built from.
// They are plain values copied out under the engine's lock; holding one holds no lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpumem/alloc/events.h"
#include "gpumem/alloc/memory_source.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc {

enum class BlockState : std::uint8_t {
  allocated,     // handed to the user
  pending_free,  // freed by the user, waiting for markers on other streams (record_stream)
  free,          // cached: mapped and reusable on its stream
  unmapped,      // address space with no physical memory behind it (expandable regions only)
  cached,        // freed into a thread's cache of recently freed blocks (engine-internal: views
                 // are taken after the caches are drained, so they never show it)
  claimed,       // taken by a growth or release in progress while the engine's lock is dropped
                 // around driver calls (engine-internal: views show it as free or unmapped, what
                 // its memory is until the operation commits)
};

const char* to_string(BlockState state) noexcept;

struct BlockView {
  std::uintptr_t addr = 0;
  std::size_t size_bytes = 0;       // rounded size (the block's extent)
  std::size_t requested_bytes = 0;  // the user's request (allocated/pending blocks), else 0
  BlockState state = BlockState::free;
  std::uint64_t alloc_seq = 0;      // seq of the alloc event (allocated/pending blocks)
};

struct PieceView {
  std::uintptr_t addr = 0;
  std::size_t size_bytes = 0;
  bool mapped = false;
};

// One classic segment, or one expandable region (its whole address range; unmapped parts appear
// as unmapped blocks). Blocks tile [base, base + size_bytes) in address order.
struct SegmentView {
  int device = 0;
  std::uintptr_t base = 0;
  std::size_t size_bytes = 0;    // address space of the segment / region
  std::size_t mapped_bytes = 0;  // physical memory mapped in it
  StreamId stream = 0;
  PoolKind pool = PoolKind::large;
  bool expandable = false;
  std::uint64_t created_seq = 0;
  std::vector<BlockView> blocks;
  std::vector<PieceView> pieces;  // expandable regions: each piece slot that is mapped
};

struct EngineTotals {
  std::size_t allocated_bytes = 0;     // rounded bytes of allocated blocks
  std::size_t requested_bytes = 0;     // requested bytes of allocated blocks
  std::size_t active_bytes = 0;        // allocated + pending_free
  std::size_t reserved_bytes = 0;      // physical memory held (mapped pieces + segments)
  std::size_t cached_free_bytes = 0;   // mapped free bytes (free blocks' mapped parts)
  std::size_t largest_free_extent_bytes = 0;  // largest contiguous mapped free run
  std::size_t va_reserved_bytes = 0;   // address space reserved
  std::size_t cap_bytes = 0;           // cap on reserved (kNoLimit if none)
  std::size_t segments = 0;            // classic segments + expandable regions
  std::size_t pieces_mapped = 0;
  // Kept mappings (recycle_keep_mappings): address space still mapped to pieces that moved
  // elsewhere. No physical memory of its own (reserved_bytes counts each piece once); a source's
  // mapped bytes are reserved_bytes' mapped part plus these.
  std::size_t kept_mapping_bytes = 0;
  std::size_t kept_mappings = 0;
  std::size_t thread_caches = 0;       // threads holding a cache of freed blocks (0 until the
                                       // engine's lock was first contended)
  std::size_t thread_cached_bytes = 0; // bytes in those caches (part of cached_free_bytes)
  bool thread_caches_on = false;       // caches came on (the engine's lock was contended once);
                                       // never goes back, whether or not caches exist now
  std::size_t arenas = 1;              // engines serving the device (Config::arenas; the sums above
                                       // are over all of them)
};

struct EngineSnapshot {
  int device = 0;
  std::string settings;  // to_string(Config)
  EngineTotals totals;
  std::vector<SegmentView> segments;  // sorted by base address
};

}  // namespace gpumem::alloc
