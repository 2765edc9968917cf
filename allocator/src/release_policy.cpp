#include "release_policy.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "gpumem/alloc/config.h"

namespace gpumem::alloc::policy {

bool should_collect_garbage(double threshold, std::size_t reserved_bytes, std::size_t cap_bytes) noexcept {
  if (threshold <= 0.0 || cap_bytes == kNoLimit) return false;
  return static_cast<double>(reserved_bytes) > threshold * static_cast<double>(cap_bytes);
}

std::vector<std::size_t> choose_gc_victims(std::span<const GcCandidate> candidates, double threshold,
                                           std::size_t reserved_bytes, std::size_t cap_bytes) {
  std::vector<std::size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(candidates[a].free_seq, candidates[a].addr) < std::tie(candidates[b].free_seq, candidates[b].addr);
  });
  std::vector<std::size_t> out;
  for (std::size_t i : order) {
    if (!should_collect_garbage(threshold, reserved_bytes, cap_bytes)) break;
    out.push_back(i);
    reserved_bytes -= std::min(reserved_bytes, candidates[i].size_bytes);
  }
  return out;
}

}  // namespace gpumem::alloc::policy
