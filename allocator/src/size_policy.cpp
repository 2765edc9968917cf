#include "size_policy.h"

#include <algorithm>
#include <bit>

namespace gpumem::alloc::policy {

namespace {

// The next 1/divisions step between the powers of two around size (exact powers kept).
std::size_t next_division(std::size_t size, std::size_t divisions) noexcept {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor = std::bit_floor(size);
  const std::size_t step = floor / std::bit_floor(divisions);
  if (step == 0) return floor << 1;
  const std::size_t below = size & ~(step - 1);
  return below == size ? size : below + step;
}

}  // namespace

std::size_t round_size_divided(std::size_t size_bytes, const std::array<std::uint32_t, 16>& divisions) noexcept {
  if (size_bytes < kMinBlockBytes) return kMinBlockBytes;
  // Bucket i covers [2^i MiB, 2^(i+1) MiB); smaller sizes use bucket 0, larger the last.
  const int log_mib = static_cast<int>(std::bit_width(size_bytes)) - 1 - 20;
  const std::size_t bucket = static_cast<std::size_t>(std::clamp(log_mib, 0, 15));
  const std::size_t div = divisions[bucket];
  if (div > 1 && size_bytes > kMinBlockBytes * div) return next_division(size_bytes, div);
  return round_up(size_bytes, kMinBlockBytes);
}

bool accept_cached_classic(std::size_t block_bytes, std::size_t rounded_bytes, std::size_t max_split_bytes,
                           std::size_t max_non_split_rounding_bytes) noexcept {
  if (max_split_bytes == kNoLimit) return true;
  // An oversize block never serves a request that could be split off a normal one...
  if (rounded_bytes < max_split_bytes && block_bytes >= max_split_bytes) return false;
  // ...and serves an oversize request only if it wastes less than max_non_split_rounding.
  if (rounded_bytes >= max_split_bytes && block_bytes >= rounded_bytes + max_non_split_rounding_bytes) return false;
  return true;
}

}  // namespace gpumem::alloc::policy
