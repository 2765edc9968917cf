// GpumemPolicy: gpumem's own engine (gpumem::alloc::CachingAllocator) as a replay policy, on a
// SimSource (accounting only) with every stream marker complete at once.
//
// reserved_bytes() is the physical memory the engine holds on the source (pieces created and not
// destroyed, mapped or not): what the device would have given away. Provider calls are counted
// by a thin forwarding source: creates (cuMemCreate), releases (cuMemRelease of pieces), maps,
// unmaps.
//
// Thread-safety: single-threaded, like every ReplayPolicy.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "gpumem/alloc/config.h"
#include "gpumem/forensics/replay_policy.h"

namespace gpumem::forensics {

// device_total_bytes: the simulated device's memory (the source's capacity). step_plan: the engine
// behind a StepPlanner (gpumem/alloc/step_plan.h), which learns the steps the replay marks
// (mark_step) and serves those that repeat from one arena; the arena's piece counts in
// reserved_bytes() and its create and map in the counters.
std::unique_ptr<ReplayPolicy> make_gpumem_policy(std::string name, const alloc::Config& config,
                                                 std::size_t device_total_bytes, bool step_plan = false);

}  // namespace gpumem::forensics
