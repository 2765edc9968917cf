// What the growth-fault tests check around one faulted request, on any source that reports its
// physical and mapped bytes (SimSource in test_growth_faults.cpp, CudaVmmSource in
// test_driver_faults.cpp): the engine's config, and the checks after the fault.
#pragma once

#include <cstddef>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"

namespace gpumem::alloc::testing {

inline constexpr std::size_t kFaultMiB = 1024 * 1024;

// The engine under a fault: invariants checked after every mutation, a 1 GiB region reservation.
inline Config growth_fault_config(bool expandable) {
  Config c;
  c.expandable_segments = expandable;
  c.check_invariants = true;
  c.va_reserve_bytes = 1024 * kFaultMiB;
  return c;
}

// After a request r that may have failed: no leak (the source holds exactly the physical bytes the
// engine reserves; with expandable segments every piece is mapped, and the only other mappings are
// the engine's kept mappings).
template <class Source>
void check_no_leak(CachingAllocator& engine, const Source& source, bool expandable) {
  engine.check_invariants();
  CHECK(source.physical_bytes() == engine.totals().reserved_bytes);
  if (expandable) CHECK(source.mapped_bytes() == source.physical_bytes() + engine.totals().kept_mapping_bytes);
}

// Frees again, r (if it succeeded) and before, empties the cache: the source holds nothing.
template <class Source>
void check_everything_returns(CachingAllocator& engine, const Source& source, const AllocResult& before,
                              const AllocResult& r, const AllocResult& again) {
  engine.check_invariants();
  CHECK(engine.free(again.ptr) == FreeStatus::ok);
  if (r.ok()) CHECK(engine.free(r.ptr) == FreeStatus::ok);
  CHECK(engine.free(before.ptr) == FreeStatus::ok);
  engine.empty_cache();
  engine.check_invariants();
  CHECK(source.physical_bytes() == 0);
  CHECK(source.mapped_bytes() == 0);
}

}  // namespace gpumem::alloc::testing
