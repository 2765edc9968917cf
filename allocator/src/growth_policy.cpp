#include "growth_policy.h"

#include <algorithm>
#include <bit>

namespace gpumem::alloc::policy {

namespace {

std::size_t round_up(std::size_t n, std::size_t m) noexcept { return (n + m - 1) / m * m; }

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

std::size_t classic_segment_bytes(std::size_t rounded_bytes, std::size_t large_segment_bytes,
                                  std::size_t granularity_bytes) noexcept {
  std::size_t seg;
  if (rounded_bytes <= kSmallRequestBytes) {
    seg = kSmallSegmentBytes;
  } else if (rounded_bytes < kMinLargeAllocBytes) {
    seg = large_segment_bytes;
  } else {
    seg = round_up(rounded_bytes, kRoundLargeBytes);
  }
  return granularity_bytes ? round_up(seg, granularity_bytes) : seg;
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

GrowthPlan plan_growth(const GrowthInputs& in) noexcept {
  GrowthPlan plan;
  plan.recycle = in.recycle_enabled ? std::min(in.pieces_needed, in.pieces_recyclable) : 0;
  plan.create = in.pieces_needed - plan.recycle;
  if (plan.create > 0 && in.cap_bytes != kNoLimit) {
    const std::size_t grow = plan.create * in.piece_bytes;
    plan.over_cap = in.reserved_bytes > in.cap_bytes || grow > in.cap_bytes - in.reserved_bytes;
  }
  return plan;
}

std::size_t cap_bytes(double fraction, std::size_t limit_bytes, std::size_t provider_total_bytes) noexcept {
  std::size_t cap = kNoLimit;
  if (fraction < 1.0) cap = static_cast<std::size_t>(fraction * static_cast<double>(provider_total_bytes));
  if (limit_bytes != 0) cap = std::min(cap, limit_bytes);
  return cap;
}

bool should_collect_garbage(double threshold, std::size_t reserved_bytes, std::size_t cap_bytes) noexcept {
  if (threshold <= 0.0 || cap_bytes == kNoLimit) return false;
  return static_cast<double>(reserved_bytes) > threshold * static_cast<double>(cap_bytes);
}

}  // namespace gpumem::alloc::policy
