// Per-call costs of memory-provider calls on an NVIDIA H200 (driver 580), as measured there (the
// figures below; bench/cuda_vmm_calls.cpp measures them again). Used to turn a policy's call counts
// into the time they would take, as a share of the traced run.
//
//   cuMemCreate 14 us (13 for 20 MiB), cuMemMap 2 us (1), cuMemSetAccess 35-40 us (31) per mapping
//   even when one call covers many, cuMemUnmap 20-24 us (19-23), cuMemRelease 10-14 us (26).
//   cudaMalloc + cudaFree of 1 MiB: 63-88 us per pair (split evenly below: not measured apart).
//
// A map counts cuMemMap plus its share of cuMemSetAccess; the middle of each range is used.
#pragma once

#include "gpumem/forensics/replay_policy.h"

namespace gpumem::forensics {

inline constexpr CallCosts kH200VmmCosts{/*create_us=*/14.0, /*release_us=*/12.0,
                                         /*map_us=*/2.0 + 37.5, /*unmap_us=*/22.0};
inline constexpr CallCosts kH200CudaMallocCosts{/*create_us=*/37.75, /*release_us=*/37.75,
                                                /*map_us=*/0.0, /*unmap_us=*/0.0};

// Seconds the counted calls take under costs.
inline double call_seconds(const PolicyCounters& c, const CallCosts& costs) noexcept {
  return (static_cast<double>(c.creates) * costs.create_us + static_cast<double>(c.releases) * costs.release_us +
          static_cast<double>(c.maps) * costs.map_us + static_cast<double>(c.unmaps) * costs.unmap_us) *
         1e-6;
}

}  // namespace gpumem::forensics
