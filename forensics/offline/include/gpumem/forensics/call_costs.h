// Per-call costs of memory-provider calls on an NVIDIA H200, as measured there. Used to turn a
// policy's call counts into the time they would take, as a share of the traced run.
//
// Mapping calls (driver 580.159.04, 2026-12-02, median of 5 rounds after a warm-up, memory touched
// before unmapping; docs/notes/physical-page-recycling.md, "What a move costs"): cuMemMap 1.0 us,
// cuMemSetAccess 28.3 us, cuMemUnmap 18.5 us, per mapping, for 2 and 20 MiB pieces alike. One
// cuMemSetAccess or cuMemUnmap over a run of k back-to-back mappings costs k times as much (runs of
// 1, 4, 16, 64: 29.2 / 28.5 / 27.9 / 28.3 us per mapping for cuMemSetAccess, 18.7 / 18.7 / 18.4 /
// 18.5 for cuMemUnmap), so the cost is per mapping and batching calls over a range buys nothing.
// cuMemCreate 14 us (13 for 20 MiB), cuMemRelease 10-14 us (26), from an earlier measurement
// (driver 580). cudaMalloc + cudaFree of 1 MiB: 63-88 us per pair (split evenly below: not
// measured apart). bench/cuda_vmm_calls.cpp measures them again.
//
// A map counts cuMemMap plus its cuMemSetAccess. A move onto a kept mapping (the engine's ghosts)
// makes no call and is not counted; a move that keeps its old mapping counts a map and no unmap.
//
// A stream synchronization (a growth that unmaps a piece or a kept mapping whose last uses may still
// be queued, or moves a piece to another stream, waits for the stream first: cuMemUnmap does not wait
// for kernels) is not a driver call: it costs the wait for the work still queued and the CPU/GPU
// overlap lost with it, which depends on the workload. 1 ms is charged per synchronization: the
// order of a drained queue when the GPU runs ~10 ms behind (the replay's event lag,
// gpumem_policy.cpp). It is a model parameter, not a measurement: on the live GPT-2 varlen training
// run of main 5ade4eb (H200, 4 alternated repetitions) the default was 22 ms a step slower than
// recycle:False, which the 14 synchronizations the replay counts in that workload's 25-step trace
// could explain only at ~39 ms each; docs/notes/allocation-policy.md, "The cost of a stream
// synchronization".
//
// A wait for one marker (recycle_wait:fence) waits only for the work queued before the marker, which
// was recorded at an earlier growth: the replay charges the lag it had left (the marker completes
// 10 ms of simulated time after it was recorded), at most the 1 ms of a stream synchronization, so
// a marker wait never costs more than the synchronization it replaces (PolicyCounters::marker_wait_ns).

#pragma once

#include "gpumem/forensics/replay_policy.h"

namespace gpumem::forensics {

inline constexpr CallCosts kH200VmmCosts{/*create_us=*/14.0, /*release_us=*/12.0,
                                         /*map_us=*/1.0 + 28.3, /*unmap_us=*/18.5, /*sync_us=*/1000.0};
inline constexpr CallCosts kH200CudaMallocCosts{/*create_us=*/37.75, /*release_us=*/37.75,
                                                /*map_us=*/0.0, /*unmap_us=*/0.0};

// Seconds the counted calls take under costs.
inline double call_seconds(const PolicyCounters& c, const CallCosts& costs) noexcept {
  return (static_cast<double>(c.creates) * costs.create_us + static_cast<double>(c.releases) * costs.release_us +
          static_cast<double>(c.maps) * costs.map_us + static_cast<double>(c.unmaps) * costs.unmap_us +
          static_cast<double>(c.syncs) * costs.sync_us) *
             1e-6 +
         static_cast<double>(c.marker_wait_ns) * 1e-9;
}

}  // namespace gpumem::forensics
