// gpumem's statistics (alloc::DeviceStatsView, from the StatsObserver) as c10's DeviceStats, the
// struct torch.cuda.memory_stats() and at::accelerator read. The fields have the same meaning
// by construction (gpumem/alloc/stats.h); this only copies.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include "device_engine.h"
#include "gpumem/alloc/stats.h"

namespace gpumem::torch::detail {

inline c10::CachingAllocator::Stat to_c10(const alloc::Stat& s) {
  c10::CachingAllocator::Stat out;
  out.current = s.current;
  out.peak = s.peak;
  out.allocated = s.allocated;
  out.freed = s.freed;
  return out;
}

inline c10::CachingAllocator::StatArray to_c10(const alloc::StatArray& a) {
  c10::CachingAllocator::StatArray out;
  // Both index [all, small_pool, large_pool].
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = to_c10(a[i]);
  return out;
}

inline c10::CachingDeviceAllocator::DeviceStats to_c10_stats(const alloc::DeviceStatsView& v) {
  c10::CachingDeviceAllocator::DeviceStats s;
  s.allocation = to_c10(v.allocation);
  s.segment = to_c10(v.segment);
  s.active = to_c10(v.active);
  s.inactive_split = to_c10(v.inactive_split);
  s.allocated_bytes = to_c10(v.allocated_bytes);
  s.reserved_bytes = to_c10(v.reserved_bytes);
  s.active_bytes = to_c10(v.active_bytes);
  s.inactive_split_bytes = to_c10(v.inactive_split_bytes);
  s.requested_bytes = to_c10(v.requested_bytes);
  s.num_alloc_retries = v.num_alloc_retries;
  s.num_ooms = v.num_ooms;
  s.oversize_allocations = to_c10(v.oversize_allocations);
  s.oversize_segments = to_c10(v.oversize_segments);
  s.num_sync_all_streams = v.num_sync_all_streams;
  s.num_device_alloc = v.num_device_alloc;
  s.num_device_free = v.num_device_free;
  s.max_split_size = v.max_split_size;
  return s;
}

inline c10::CachingDeviceAllocator::DeviceStats to_c10_stats(const DeviceEngine& de) {
  return to_c10_stats(de.stats->stats());
}

// All zeros, with max_split_size as configured (what a device with no engine yet reports).
inline c10::CachingDeviceAllocator::DeviceStats empty_c10_stats(const alloc::Config& config) {
  c10::CachingDeviceAllocator::DeviceStats s;
  s.max_split_size =
      config.max_split_size_bytes == alloc::kNoLimit ? -1 : static_cast<int64_t>(config.max_split_size_bytes);
  return s;
}

}  // namespace gpumem::torch::detail
