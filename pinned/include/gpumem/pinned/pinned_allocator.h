// PinnedAllocator: page-locked (pinned) host memory for host<->device copies, from a jemalloc arena
// whose extents live in regions a HostMemorySource maps and locks.
//
// Why: PyTorch's pinned allocator rounds every request up to a power of two and caches blocks by
// that size, so a 4.1 GB tensor takes 8 GB of page-locked memory. Here:
//   * requests below PinnedOptions::direct_min_bytes (1 MiB) come from a jemalloc arena: its size
//     classes (four per doubling, at most 25% over for any size) and slabs replace the power of
//     two, and its thread-aware bins keep small pinned allocations cheap;
//   * larger requests (batch buffers) are rounded to the page only and carved best-fit from the same
//     regions the arena's extents come from, where freed blocks of any size coalesce for new
//     requests of any size. jemalloc's classes would cost them about 8% on average (a batch of
//     32x3x224x224 float32, 19.3 MB, takes its 20 MiB class), against a 1.1x budget.
// See Note [Pinned memory on a jemalloc arena] (docs/notes/pinned-host-memory.md).
//
// Stream semantics (PyTorch's CachingHostAllocator's): record_stream(ptr, s) notes that a copy on
// stream s uses the block. free() of a block with uses records a marker (StreamEvents::record) on
// each of those streams, and the block goes back to the arena only once every marker has
// completed; until then it is pending, never handed out again. Pending frees are checked on every
// allocation, by process_events(), by empty_cache() and, with background_period_us, by a thread of
// the allocator's own; markers are queried, never waited for.
//
// Events: every change is an alloc::AllocEvent, in the device engine's vocabulary, published to
// attached observers (alloc::StatsObserver, forensics' TraceRing, op attribution) outside every
// lock, with device = kPinnedHostDevice (-1):
//   alloc           a block was handed out (size_bytes = its size class, requested_bytes = request)
//   free_requested  the user freed it (it may wait for markers)
//   free_completed  it went back to the arena
//   segment_alloc   a region was mapped and locked (size_bytes = region size)
//   segment_free    a wholly free region was unlocked and unmapped
//   oom             a request failed (size_bytes = size class, requested_bytes = request)
//   empty_cache     empty_cache ran (size_bytes = bytes released)
//   snapshot        a snapshot was taken
// pool is small for blocks from the jemalloc arena (requests below direct_min_bytes, 1 MiB: PyTorch's
// small-pool boundary) and the regions that hold them, large for direct blocks and their regions.
//
// Invariants (check_invariants): every live block lies inside a region and outside its free
// ranges; blocks do not overlap; the totals equal the sums over blocks and regions; jemalloc's own
// count of allocated bytes in the arena equals the size classes of the live and pending blocks.
//
// Thread-safety: every member may be called from any thread. jemalloc's arena locks and a sharded
// block table do the synchronization; observers run with no lock held. Lock order: jemalloc's locks
// -> the region table's mutex (taken inside the extent hooks); the block table's shard locks and
// the deferred-free queue's mutex are leaves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/events.h"
#include "gpumem/alloc/introspection.h"
#include "gpumem/alloc/stream_events.h"
#include "gpumem/pinned/host_memory_source.h"

namespace gpumem::pinned {

// AllocEvent::device and SegmentView::device of pinned host memory (c10's CPU device index).
inline constexpr int kPinnedHostDevice = -1;

struct PinnedOptions {
  // Every block is aligned to at least this (a power of two >= 16): 64, the alignment of PyTorch's
  // CPU allocations.
  std::size_t min_alignment_bytes = 64;
  // Requests of at least this many bytes are direct blocks: page-rounded and carved from the
  // regions, not from jemalloc's size classes. At least jemalloc's largest small class (16 KiB);
  // SIZE_MAX sends everything through jemalloc.
  std::size_t direct_min_bytes = std::size_t{1} << 20;
  // When jemalloc needs a new extent and no free part of a region fits it, a region of this many
  // bytes is mapped and locked (one cudaHostRegister) and the extent is carved from its start; the
  // rest serves later extents. An extent larger than this gets a region of exactly its size. Small:
  // little locked memory waits unused; large: fewer registrations. A positive multiple of the page size.
  std::size_t region_bytes = std::size_t{2} << 20;
  // PyTorch's pinned_use_background_threads: a thread of the allocator's own returns blocks whose
  // markers completed every this many microseconds, so their memory is free again before the next
  // allocation asks. 0 = no thread (allocation, process_events and empty_cache do it).
  unsigned background_period_us = 0;
};

// One sentence naming the problem and the fix, or empty when the options are valid.
std::string validate(const PinnedOptions& options);

struct PinnedAllocResult {
  void* ptr = nullptr;          // null iff the request failed or asked for 0 bytes
  std::size_t size_bytes = 0;   // the block's size class
  std::string error;            // set iff the request failed: what was asked and why it failed
  bool ok() const noexcept { return error.empty(); }
};

// Current numbers, and peaks since construction or reset_peaks().
struct PinnedTotals {
  std::size_t allocated_bytes = 0;     // size classes of blocks the user holds
  std::size_t requested_bytes = 0;     // the user's requests of those blocks
  std::size_t pending_free_bytes = 0;  // freed blocks waiting for their markers
  std::size_t reserved_bytes = 0;      // regions mapped (the memory this allocator holds)
  std::size_t locked_bytes = 0;        // regions that are page-locked (<= reserved_bytes)
  std::size_t cached_bytes = 0;        // reserved, not active: free for reuse (slab space and free ranges)
  std::size_t allocations = 0;         // blocks the user holds
  std::size_t pending_frees = 0;       // blocks waiting for markers
  std::size_t regions = 0;
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_requested_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::size_t peak_locked_bytes = 0;
  std::uint64_t num_allocs = 0;          // successful allocate() calls (size > 0)
  std::uint64_t num_frees = 0;           // successful free() calls
  std::uint64_t num_deferred_frees = 0;  // frees that had to wait for markers
  std::uint64_t num_region_maps = 0;     // source map_locked calls that succeeded
  std::uint64_t num_region_unmaps = 0;
  std::uint64_t num_alloc_failures = 0;
};

struct PinnedBlockInfo {
  std::uintptr_t block_addr = 0;
  std::size_t size_bytes = 0;
  std::size_t requested_bytes = 0;
  bool pending_free = false;
};

class PinnedAllocator {
 public:
  // source and events must outlive the allocator. Throws std::invalid_argument for invalid
  // options (validate() says why) and std::runtime_error if jemalloc refuses to create the arena.
  PinnedAllocator(HostMemorySource& source, alloc::StreamEvents& events, PinnedOptions options = {});
  // Destroys the arena and gives every region back to the source. Blocks still allocated or
  // pending are the caller's leak; their memory is returned regardless. Pending markers are
  // released without waiting: destroy the allocator only after the copies using it completed.
  ~PinnedAllocator();
  PinnedAllocator(const PinnedAllocator&) = delete;
  PinnedAllocator& operator=(const PinnedAllocator&) = delete;

  // A block of at least size_bytes. Before growing, completed pending frees are returned to the
  // arena; if the source refuses memory, wholly free regions are released and the request is tried
  // once more before it fails (with an oom event). size 0 gives a null pointer and no error; more
  // than 2^46 bytes fails at once, with an error saying so.
  PinnedAllocResult allocate(std::size_t size_bytes);
  alloc::FreeStatus free(void* ptr);
  // The block ptr starts is used by work queued on stream now; its reuse waits for that work.
  alloc::FreeStatus record_stream(void* ptr, alloc::StreamId stream);
  // Returns pending blocks whose markers have all completed to the arena; how many it returned.
  std::size_t process_events();
  // process_events(), then every cached free extent goes back through the hooks and every region
  // that is then wholly free is unlocked and unmapped. Returns the bytes of regions released.
  std::size_t empty_cache();

  // The block ptr points into (its start or inside it), if ptr is in a live or pending block.
  std::optional<PinnedBlockInfo> lookup(const void* ptr) const;
  // True when ptr lies in memory this allocator mapped (a live region).
  bool owns(const void* ptr) const;
  // The size class a request of size_bytes gets.
  std::size_t round_size(std::size_t size_bytes) const noexcept;

  void attach_observer(std::shared_ptr<alloc::AllocObserver> observer);
  void detach_observer(const alloc::AllocObserver* observer);

  PinnedTotals totals() const;
  void reset_peaks();
  // Regions as segments (device kPinnedHostDevice, never expandable) with their blocks in address
  // order: allocated, pending_free, and free for the rest (slab space and free ranges).
  alloc::EngineSnapshot snapshot();
  // "pinned: source=locked_host, min_alignment_bytes=64, region_bytes=2097152, jemalloc 5.3.0 ..."
  std::string settings() const;
  // jemalloc's hook calls so far: how often it asked to purge or decommit (always refused).
  struct HookCalls {
    std::uint64_t allocs, dallocs, destroys, decommit_refusals, purge_refusals, merges, merge_refusals, splits;
  };
  HookCalls hook_calls() const noexcept;

  // Aborts with a description if an invariant is broken.
  void check_invariants() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpumem::pinned
