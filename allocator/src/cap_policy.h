// Cap policy: the one rule for the cap on reserved bytes, and whether a growth passes it.
//
// The cap is the smaller of per_process_memory_fraction x the provider's total and the absolute
// memory limit. A provider total of 0 means "unknown": the fraction is then not applied (only the
// absolute limit, if any, caps). A fraction of 1 means no fraction cap. The result is kNoLimit when
// nothing caps.
// Thread-safety: pure functions, callable from anywhere.
#pragma once

#include <cstddef>

#include "gpumem/alloc/config.h"

namespace gpumem::alloc::policy {

// The cap on reserved bytes (kNoLimit if none). fraction is in [0, 1]; limit_bytes 0 = no limit;
// provider_total_bytes 0 = unknown.
std::size_t cap_bytes(double fraction, std::size_t limit_bytes, std::size_t provider_total_bytes) noexcept;

// Whether growing reserved_bytes by grow_bytes passes cap_bytes.
inline bool exceeds_cap(std::size_t reserved_bytes, std::size_t grow_bytes, std::size_t cap_bytes) noexcept {
  return cap_bytes != kNoLimit && (reserved_bytes > cap_bytes || grow_bytes > cap_bytes - reserved_bytes);
}

}  // namespace gpumem::alloc::policy
