// RegionTable: the regions the arena's extent hooks obtained from the HostMemorySource, and the
// parts of each that jemalloc handed back.
//
// Glossary:
//   region     one HostRegion: a mapping page-locked as one unit (one cudaHostRegister), the unit
//              the source takes back.
//   returned   a range of a region that jemalloc gave back (extent dalloc/destroy hooks, i.e. after
//              gpumem purged the arena). It stays mapped and locked: a region is unlocked and
//              unmapped only whole. The alloc hook serves new extents from returned ranges before it
//              maps a new region.
//
// Invariants (check_invariants):
//   regions are disjoint; each region's returned ranges lie inside it, are disjoint, coalesced
//   (no two touch) and add up to returned_bytes; no region is wholly returned (give_back removes it);
//   reserved_bytes = sum of region sizes, locked_bytes = sum of sizes of locked regions.
//
// Thread-safety: every member locks one internal mutex (a leaf: nothing is called while holding
// it). The extent hooks call it from jemalloc's own locks, so it must never call back into jemalloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "gpumem/pinned/host_memory_source.h"

namespace gpumem::pinned::detail {

struct RegionTotals {
  std::size_t reserved_bytes = 0;  // live regions
  std::size_t locked_bytes = 0;    // live regions that are locked
  std::size_t returned_bytes = 0;  // given back by jemalloc, still mapped
  std::size_t regions = 0;
};

struct RegionCopy {
  HostRegion region;
  std::uint64_t created_seq = 0;
  std::vector<std::pair<std::uintptr_t, std::size_t>> returned;  // address order
};

class RegionTable {
 public:
  // A returned range that fits size_bytes at alignment_bytes (best fit: the smallest such range),
  // taken out of the returned set; 0 when none fits.
  std::uintptr_t take_returned(std::size_t size_bytes, std::size_t alignment_bytes);
  void insert(const HostRegion& region, std::uint64_t created_seq);
  // Records [addr, addr + size_bytes) as returned. When that makes its region wholly returned, the
  // region leaves the table and is returned here for the caller to unmap.
  std::optional<HostRegion> give_back(std::uintptr_t addr, std::size_t size_bytes);
  // Removes and returns every region (the arena is gone; the caller unmaps them).
  std::vector<HostRegion> take_all();

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
    std::uint64_t created_seq = 0;
    std::map<std::uintptr_t, std::size_t> returned;  // base -> size
    std::size_t returned_bytes = 0;
  };
  // The region holding addr, or end().
  std::map<std::uintptr_t, Record>::const_iterator find_locked(std::uintptr_t addr) const;

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Record> regions_;  // base -> record
  RegionTotals totals_;
};

}  // namespace gpumem::pinned::detail
