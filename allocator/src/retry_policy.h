// Retry policy: what the engine tries, in what order, when no cached block fits a request. Pure:
// the engine (engine.cpp) runs the steps in order and stops at the first that yields a block; the
// request fails (an OomInfo) when none does.
//
//   collect_garbage  only when garbage_collection_threshold says reserved is too high
//   grow             map pieces (expandable) or create a segment (classic)
//   release_cached   give back every wholly free piece and segment (both pools, every stream),
//                    after pending frees complete: what empty_cache() does
//   take_cached      best fit again (release may have merged what is left)
//   grow             once more, now with the released memory under the cap
// Thread-safety: pure functions, callable from anywhere.
#pragma once

#include <cstdint>
#include <span>

namespace gpumem::alloc::policy {

enum class RecoveryStep : std::uint8_t { take_cached, collect_garbage, grow, release_cached };

const char* to_string(RecoveryStep step) noexcept;

// The steps after a miss in the free index, in order. garbage_collection_due: should_collect_garbage
// at the time of the miss.
std::span<const RecoveryStep> recovery_steps(bool garbage_collection_due) noexcept;

}  // namespace gpumem::alloc::policy
