// Size policy: how a request is rounded, which pool serves it, whether a block is split, whether a
// cached classic block may serve a request, and which whole pieces a free block holds. Pure
// functions of plain values; the mechanism asks them and decides nothing itself.
// Thread-safety: pure functions, callable from anywhere.
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

inline constexpr std::size_t round_up(std::size_t n, std::size_t m) noexcept { return (n + m - 1) / m * m; }

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

// The two settings splitting and classic reuse depend on (max_split_size_mb,
// max_non_split_rounding_mb).
struct SplitLimits {
  std::size_t max_split_bytes = kNoLimit;
  std::size_t max_non_split_rounding_bytes = 20 * kMiB;
};

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

// The whole pieces inside [addr, addr + size_bytes) of an expandable region whose pieces are
// piece_bytes long counted from region_base: [lo, hi), empty (lo == hi) if none.
struct SlotSpan {
  std::uintptr_t lo = 0;
  std::uintptr_t hi = 0;
  std::size_t count(std::size_t piece_bytes) const noexcept { return (hi - lo) / piece_bytes; }
};
inline SlotSpan whole_slots(std::uintptr_t addr, std::size_t size_bytes, std::uintptr_t region_base,
                            std::size_t piece_bytes) noexcept {
  const std::uintptr_t lo = region_base + round_up(addr - region_base, piece_bytes);
  const std::uintptr_t hi = region_base + (addr + size_bytes - region_base) / piece_bytes * piece_bytes;
  return hi > lo ? SlotSpan{lo, hi} : SlotSpan{lo, lo};
}

}  // namespace gpumem::alloc::policy
