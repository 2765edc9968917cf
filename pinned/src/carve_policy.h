// The pinned allocator's placement decisions, as plain functions of plain values (the mechanism in
// PinnedAllocator::Impl::carve acts on them). See Note [Pinned memory on a jemalloc arena].
#pragma once

#include <algorithm>
#include <cstddef>

namespace gpumem::pinned::detail {

// The largest idle region a request of size_bytes may split. Larger idle regions stay whole for a
// request of their size; the request gets a region of its own (at least region_bytes) instead.
inline std::size_t max_idle_split_bytes(std::size_t size_bytes, std::size_t region_bytes) noexcept {
  return std::max(region_bytes, 2 * size_bytes);
}

// The size of the region mapped when nothing free fits a request of size_bytes.
inline std::size_t new_region_bytes(std::size_t size_bytes, std::size_t region_bytes) noexcept {
  return std::max(size_bytes, region_bytes);
}

// Whether idle regions are unmapped before mapping new_region: when keeping them would raise
// locked memory above its high-water mark (below it they stay, for later requests, and nothing is
// registered twice).
inline bool release_idle_before_map(std::size_t reserved_bytes, std::size_t new_region,
                                    std::size_t high_water_bytes) noexcept {
  return reserved_bytes + new_region > high_water_bytes;
}

}  // namespace gpumem::pinned::detail
