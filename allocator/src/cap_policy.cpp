#include "cap_policy.h"

#include <algorithm>

namespace gpumem::alloc::policy {

std::size_t cap_bytes(double fraction, std::size_t limit_bytes, std::size_t provider_total_bytes) noexcept {
  std::size_t cap = kNoLimit;
  if (fraction < 1.0 && provider_total_bytes != 0) {
    const double bytes = std::max(fraction, 0.0) * static_cast<double>(provider_total_bytes);
    if (bytes < 18446744073709551616.0) cap = static_cast<std::size_t>(bytes);  // 2^64: no overflow
  }
  if (limit_bytes != 0) cap = std::min(cap, limit_bytes);
  return cap;
}

}  // namespace gpumem::alloc::policy
