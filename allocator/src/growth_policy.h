// Policy: the engine's decisions as pure functions of plain inputs. The mechanism (split, merge,
// map, unmap) decides nothing and reads no configuration; it asks these functions.
// See Note [Physical page recycling] in docs/notes/physical-page-recycling.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "gpumem/alloc/config.h"
#include "gpumem/alloc/events.h"

namespace gpumem::alloc::policy {

inline constexpr std::size_t kMinBlockBytes = 512;           // every size is a multiple of this
inline constexpr std::size_t kSmallRequestBytes = kMiB;      // <= this goes to the small pool
inline constexpr std::size_t kSmallSegmentBytes = 2 * kMiB;  // classic small-pool segment
inline constexpr std::size_t kMinLargeAllocBytes = 10 * kMiB;
inline constexpr std::size_t kRoundLargeBytes = 2 * kMiB;
inline constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 60;  // 1 EiB, as PyTorch

// The size a request is served with: 512-byte multiples, or the next 1/N step between powers of
// two where roundup_power2_divisions gives N > 1 for the request's bucket.
std::size_t round_size_divided(std::size_t size_bytes, const std::array<std::uint32_t, 16>& divisions) noexcept;
inline std::size_t round_size(std::size_t size_bytes, const std::array<std::uint32_t, 16>& divisions,
                              bool any_divisions = true) noexcept {
  if (size_bytes <= kMinBlockBytes) return kMinBlockBytes;
  if (any_divisions) return round_size_divided(size_bytes, divisions);
  return (size_bytes + kMinBlockBytes - 1) & ~(kMinBlockBytes - 1);
}

inline PoolKind pool_for(std::size_t rounded_bytes) noexcept {
  return rounded_bytes <= kSmallRequestBytes ? PoolKind::small : PoolKind::large;
}

// Classic (non-expandable) segment size for a rounded request: 2 MiB for the small pool, the large
// segment size for 1-10 MiB, else rounded up to 2 MiB (then to the source's granularity).
std::size_t classic_segment_bytes(std::size_t rounded_bytes, std::size_t large_segment_bytes,
                                  std::size_t granularity_bytes) noexcept;

// Classic segments: whether a cached block of block_bytes may serve a request of rounded_bytes.
bool accept_cached_classic(std::size_t block_bytes, std::size_t rounded_bytes, std::size_t max_split_bytes,
                           std::size_t max_non_split_rounding_bytes) noexcept;

// Whether a block of block_bytes serving rounded_bytes is split (the rest goes back to the cache).
inline bool should_split(bool expandable, PoolKind pool, std::size_t block_bytes, std::size_t rounded_bytes,
                         std::size_t max_split_bytes) noexcept {
  const std::size_t remaining = block_bytes - rounded_bytes;
  if (expandable || pool == PoolKind::small) return remaining >= kMinBlockBytes;
  return rounded_bytes < max_split_bytes && remaining > kSmallRequestBytes;
}

// How an expandable region grows by pieces_needed pieces.
struct GrowthInputs {
  std::size_t pieces_needed = 0;
  std::size_t pieces_recyclable = 0;  // wholly free mapped pieces of the same pool elsewhere
  std::size_t piece_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t cap_bytes = kNoLimit;
  bool recycle_enabled = true;
};

struct GrowthPlan {
  std::size_t recycle = 0;  // pieces to unmap elsewhere and map here
  std::size_t create = 0;   // new pieces to create
  bool over_cap = false;    // creating them would pass the cap
};

// Recycle before creating: physical memory that is already held serves the request first, so
// reserved grows only when every piece of the pool is in use. Creating is refused past the cap.
GrowthPlan plan_growth(const GrowthInputs& in) noexcept;

// The cap on reserved bytes from a fraction of the provider's total and an absolute limit.
std::size_t cap_bytes(double fraction, std::size_t limit_bytes, std::size_t provider_total_bytes) noexcept;

// garbage_collection_threshold: whether cached memory should be released before growing.
bool should_collect_garbage(double threshold, std::size_t reserved_bytes, std::size_t cap_bytes) noexcept;

}  // namespace gpumem::alloc::policy
