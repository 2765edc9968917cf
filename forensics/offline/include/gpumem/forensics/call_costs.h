// Per-call costs of memory-provider calls on an NVIDIA H200, as measured there. Used to turn a
// policy's call counts into the time they would take, as a share of the traced run.
//
// Mapping calls, as real workloads pay them (since 2026-12-04): the mean host time per call of
// gpumem's CUDA VMM source over 310 live runs of 19 workloads on the H200 (driver 580.159.04;
// `scripts/gpu/live/call_costs.py docs/measurements/*/*.jsonl`, each run's gpumem.driver.* keys,
// warm-up included): cuMemCreate 14.5 us (713,072 calls), cuMemMap 1.9 (974,761),
// cuMemSetAccess 32.2 (974,761), cuMemUnmap 29.2 (72,543). The model charged 14.0 / 1.0 / 28.3 /
// 18.5 before, from a loop of calls on an idle GPU (2026-12-02, median of 5 rounds after a warm-up,
// memory touched before unmapping; docs/notes/physical-page-recycling.md, "What a move costs"),
// which `bench/cuda_vmm_calls` still reads (23.1 / 15.3 us for cuMemSetAccess / cuMemUnmap on
// 2026-12-04): inside a training or inference process the same calls cost more, an unmap most
// (docs/notes/allocation-policy.md, "What the calls cost in live runs"). No live run released a
// piece; cuMemRelease keeps the loop's 12 us (10-14; 26 for 20 MiB). The cost is per mapping, for 2
// and 20 MiB pieces alike: one cuMemSetAccess or cuMemUnmap over a run of k back-to-back mappings
// costs k times as much (runs of 1, 4, 16, 64: 29.2 / 28.5 / 27.9 / 28.3 us per mapping for
// cuMemSetAccess, 18.7 / 18.7 / 18.4 / 18.5 for cuMemUnmap, in the loop), so batching calls over a
// range buys nothing. Nor does the length change much (bench/cuda_vmm_groups, 2026-12-04: 2, 8, 64
// and 512 MiB handles, cuMemSetAccess 27-36 / 25-35 / 26-38 / 44-82 us; only cuMemRelease grows,
// to 160-355 us at 512 MiB), and a handle is mapped and unmapped whole only (the driver refuses a
// part), so a piece costs its calls whatever its length. cudaMalloc + cudaFree of 1 MiB: 63-88 us per pair (split evenly below: not
// measured apart).
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

inline constexpr CallCosts kH200VmmCosts{/*create_us=*/14.5, /*release_us=*/12.0,
                                         /*map_us=*/1.9 + 32.2, /*unmap_us=*/29.2, /*sync_us=*/1000.0};
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
