// RegionTable: the regions the arena's extent hooks obtained from the HostMemorySource, and the
// free ranges inside them. Together with the hooks it is the allocator of extents (the pages
// jemalloc carves its size classes from): best fit over free ranges, coalescing, and release of
// whole regions.
//
// Glossary:
//   region     one HostRegion: a mapping page-locked as one unit (one cudaHostRegister), the unit
//              the source takes back. A new region is at least PinnedOptions::region_bytes.
//   free range a part of a region that is not in jemalloc's hands: the unused rest of a new region,
//              or an extent jemalloc gave back (dalloc/destroy, which it does as soon as an extent
//              is free: the arena's dirty decay is 0). It stays mapped and locked.
//   pool       small: a region mapped for jemalloc's extents (slabs and classes below
//              PinnedOptions::direct_min_bytes); large: one mapped for a direct block. A free range
//              serves only its region's pool, so long-lived small blocks never pin a large region
//              (PyTorch keeps small and large pools apart for the same reason).
//   idle       a region that is one free range end to end. Idle regions stay mapped (a later
//              extent may fit) until release_idle(): before a new region is mapped, and in
//              empty_cache.
//
// Invariants (check_invariants):
//   regions are disjoint; each region's free ranges lie inside it, are disjoint, coalesced (no two
//   touch) and add up to its free bytes; the size index holds exactly the free ranges;
//   reserved_bytes = sum of region sizes, locked_bytes = sum of sizes of locked regions,
//   free_bytes = sum of free ranges, idle_bytes = sum of sizes of idle regions.
//
// Thread-safety: every member locks one internal mutex (a leaf: nothing is called while holding
// it). The extent hooks call it from inside jemalloc's locks, so it never calls back into jemalloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "gpumem/alloc/events.h"
#include "gpumem/pinned/host_memory_source.h"

namespace gpumem::pinned::detail {

struct RegionTotals {
  std::size_t reserved_bytes = 0;  // live regions
  std::size_t locked_bytes = 0;    // live regions that are locked
  std::size_t free_bytes = 0;      // free ranges (idle regions included)
  std::size_t idle_bytes = 0;      // idle regions
  std::size_t regions = 0;
  std::size_t idle_regions = 0;
};

struct PooledRegion {
  HostRegion region;
  alloc::PoolKind pool = alloc::PoolKind::large;
};

struct RegionCopy {
  HostRegion region;
  alloc::PoolKind pool = alloc::PoolKind::large;
  std::uint64_t created_seq = 0;
  std::vector<std::pair<std::uintptr_t, std::size_t>> free_ranges;  // address order
};

class RegionTable {
 public:
  // The smallest free range that holds size_bytes at alignment_bytes, carved out (its rest stays
  // free); 0 when none does. An idle region larger than max_idle_split_bytes is passed over: it is
  // kept whole for a request its size rather than split for a small one (which gets a region of
  // its own instead).
  std::uintptr_t take_free(alloc::PoolKind pool, std::size_t size_bytes, std::size_t alignment_bytes,
                           std::size_t max_idle_split_bytes);
  void insert(const HostRegion& region, alloc::PoolKind pool, std::uint64_t created_seq);
  // Marks [addr, addr + size_bytes), which lies in one region and was not free, free.
  void give_back(std::uintptr_t addr, std::size_t size_bytes);
  // Removes and returns every idle region smaller than below_bytes (all of them by default), for
  // the caller to unmap.
  std::vector<PooledRegion> release_idle(std::size_t below_bytes = std::numeric_limits<std::size_t>::max());
  // Removes and returns every region (the arena is gone; the caller unmaps them).
  std::vector<PooledRegion> take_all();

  // True when both addresses lie in one region.
  bool same_region(std::uintptr_t a, std::uintptr_t b) const;
  std::optional<HostRegion> region_of(std::uintptr_t addr) const;
  RegionTotals totals() const;
  std::vector<RegionCopy> copy() const;
  // Aborts with a description if an invariant is broken.
  void check_invariants() const;

 private:
  struct Record {
    HostRegion region;
    alloc::PoolKind pool = alloc::PoolKind::large;
    std::uint64_t created_seq = 0;
    std::map<std::uintptr_t, std::size_t> free;  // base -> size
    std::size_t free_bytes = 0;
    bool idle() const noexcept { return free_bytes == region.size_bytes; }
  };
  using Regions = std::map<std::uintptr_t, Record>;
  Regions::iterator find_locked(std::uintptr_t addr);
  Regions::const_iterator find_locked(std::uintptr_t addr) const;
  void add_free_locked(Record& rec, std::uintptr_t base, std::size_t size);
  void remove_free_locked(Record& rec, std::uintptr_t base);
  void drop_region_locked(Regions::iterator it);

  mutable std::mutex mutex_;
  Regions regions_;                                         // base -> record
  std::set<std::pair<std::size_t, std::uintptr_t>> by_size_;  // (size, base) of every free range
  RegionTotals totals_;
};

}  // namespace gpumem::pinned::detail
