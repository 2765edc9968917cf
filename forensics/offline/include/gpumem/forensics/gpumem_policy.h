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

// device_total_bytes: the simulated device's memory (the source's capacity). With
// config.step_plan (gpumem+plan) the engine's step planner takes the steps the replay marks
// (mark_step), or finds them, and notes() says what it did: steps found and served, the arena, the
// calls its first arena took and the calls made after it.
std::unique_ptr<ReplayPolicy> make_gpumem_policy(std::string name, const alloc::Config& config,
                                                 std::size_t device_total_bytes);

}  // namespace gpumem::forensics
