#include "retry_policy.h"

namespace gpumem::alloc::policy {

namespace {

using S = RecoveryStep;
constexpr RecoveryStep kWithGc[] = {S::collect_garbage, S::grow, S::release_cached, S::take_cached, S::grow};
constexpr RecoveryStep kWithoutGc[] = {S::grow, S::release_cached, S::take_cached, S::grow};

}  // namespace

const char* to_string(RecoveryStep step) noexcept {
  switch (step) {
    case S::take_cached: return "take_cached";
    case S::collect_garbage: return "collect_garbage";
    case S::grow: return "grow";
    case S::release_cached: return "release_cached";
  }
  return "unknown";
}

std::span<const RecoveryStep> recovery_steps(bool garbage_collection_due) noexcept {
  if (garbage_collection_due) return kWithGc;
  return kWithoutGc;
}

}  // namespace gpumem::alloc::policy
