// JemallocArena: one arena of gpumem's private jemalloc whose memory comes from extent hooks, and
// the hooks themselves. jemalloc decides size classes, slabs, splitting, coalescing and reuse; the
// hooks decide where memory comes from and refuse everything that would touch locked pages.
//
// See Note [Pinned memory on a jemalloc arena] in docs/notes/pinned-host-memory.md. In short, what
// jemalloc may ask of an extent and what the hooks answer:
//   alloc(new_addr = null)   obtain size bytes: the best-fitting free range of a region, else a new
//                            locked region. Fresh regions are zero and committed; reused ranges
//                            are zeroed on request.
//   alloc(new_addr != null)  refused (in-place growth at a fixed address; jemalloc copies instead)
//   dalloc / destroy         accepted: the range is free again in the RegionTable (still locked;
//                            whole idle regions are unmapped later, never from inside jemalloc's
//                            free path)
//   commit                   accepted, nothing to do (extents are always committed)
//   decommit, purge_lazy,    refused: madvise/decommit of page-locked, CUDA-registered pages would
//   purge_forced             give the CPU new pages while the GPU still copies the old ones
//   split                    accepted (bookkeeping only; an extent never spans two regions)
//   merge                    accepted only inside one region: a copy must not span two registrations
// Dirty decay is 0: jemalloc gives a free extent back through dalloc at once (best fit and
// coalescing then happen in the RegionTable, which releases whole idle regions), and muzzy decay is
// -1 so the lazy purge (madvise(MADV_FREE)) is never tried on that path.
//
// The arena is created with experimental.arenas_create_ext (jemalloc 5.3) so its metadata comes
// from ordinary memory, not from locked regions; older 5.x fall back to arenas.create.
//
// Thread-safety: allocate/deallocate/usable_size/stats may be called concurrently; purge and the
// destructor must not race with allocations of blocks the caller still expects to use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gpumem::pinned::detail {

// What the hooks call. Implemented by the pinned allocator; runs inside jemalloc's locks, so it must
// not call into jemalloc.
class ExtentProvider {
 public:
  virtual ~ExtentProvider() = default;
  // size_bytes at alignment_bytes (a power of two), or null. *zero on entry: the memory must read
  // as zero; on return: whether it does.
  virtual void* obtain_extent(std::size_t size_bytes, std::size_t alignment_bytes, bool* zero) = 0;
  virtual void give_back_extent(void* addr, std::size_t size_bytes) = 0;
  virtual bool may_merge(const void* a, const void* b) = 0;
};

// How often jemalloc called each hook and what it was told (tests read these to check that
// locked pages were never purged or decommitted).
struct HookCounts {
  std::uint64_t allocs = 0, alloc_failures = 0, fixed_address_refusals = 0;
  std::uint64_t dallocs = 0, destroys = 0, commits = 0;
  std::uint64_t decommit_refusals = 0, purge_lazy_refusals = 0, purge_forced_refusals = 0;
  std::uint64_t splits = 0, merges = 0, merge_refusals = 0;
};

// jemalloc's view of the arena (stats.arenas.<i>.*), read after an epoch refresh.
struct ArenaStats {
  std::size_t small_allocated_bytes = 0;  // live small (slab) allocations, by size class
  std::size_t large_allocated_bytes = 0;  // live large allocations, by size class
  std::size_t active_bytes = 0;           // pages of active extents (pactive * page)
  std::size_t dirty_bytes = 0;            // cached free extents (pdirty * page)
  std::size_t mapped_bytes = 0;           // obtained through the hooks and held
  std::size_t retained_bytes = 0;         // held but not in use (grown regions' unused parts)
};

class JemallocArena {
 public:
  // The arena; null with *error set if jemalloc refused. growth_limit_bytes caps jemalloc's
  // geometric growth (arena.<i>.retain_grow_limit), which only matters if MALLOC_CONF turned
  // retain back on: then each hook call is at most that large unless one extent needs more.
  static std::unique_ptr<JemallocArena> create(ExtentProvider& provider, std::size_t growth_limit_bytes,
                                               std::string* error);
  // Destroys the arena (arena.<i>.destroy): every extent goes back through dalloc/destroy.
  ~JemallocArena();
  JemallocArena(const JemallocArena&) = delete;
  JemallocArena& operator=(const JemallocArena&) = delete;

  void* allocate(std::size_t size_bytes, std::size_t alignment_bytes) noexcept;
  void deallocate(void* ptr, std::size_t size_bytes, std::size_t alignment_bytes) noexcept;
  // The size class a request gets (what allocate really takes).
  std::size_t usable_size(std::size_t size_bytes, std::size_t alignment_bytes) const noexcept;
  // Gives every cached free extent back through the hooks (arena.<i>.purge).
  void purge() noexcept;
  // arena.<i>.dirty_decay_ms / muzzy_decay_ms (-1 = never, 0 = at once). The pinned allocator uses
  // (0, -1); tests set others to make jemalloc call the purge hooks on its own.
  bool set_decay_ms(long dirty_ms, long muzzy_ms) noexcept;
  ArenaStats stats() const;
  HookCounts hook_counts() const noexcept;
  unsigned index() const noexcept { return index_; }
  // The jemalloc options this arena runs under, for settings strings ("retain:true,...").
  static std::string global_options();

  struct Hooks;  // extent_hooks_t + provider + counters (jemalloc_arena.cpp)

 private:
  JemallocArena(std::unique_ptr<Hooks> hooks, unsigned index);
  std::unique_ptr<Hooks> hooks_;
  unsigned index_;
};

}  // namespace gpumem::pinned::detail
