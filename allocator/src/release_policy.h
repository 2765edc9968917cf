// Release policy: what the engine gives back to the provider, and in what order. Pure functions of
// plain values; release.cpp gathers the candidates, asks, and acts.
//
// garbage_collection_threshold (classic segments, with a cap): before growing, wholly free
// segments are freed, least recently freed first, until reserved is back under threshold x cap.
// Thread-safety: pure functions, callable from anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gpumem::alloc::policy {

// garbage_collection_threshold: whether cached memory should be released before growing (only
// with a cap and a threshold > 0).
bool should_collect_garbage(double threshold, std::size_t reserved_bytes, std::size_t cap_bytes) noexcept;

// A wholly free classic segment garbage collection may free.
struct GcCandidate {
  std::size_t size_bytes = 0;    // the segment's size (what freeing it takes off reserved)
  std::uint64_t free_seq = 0;    // engine tick when it last became free: smaller = freed longer ago
  std::uintptr_t addr = 0;       // breaks ties
};

// The candidates to free, in order (indices into candidates): least recently freed first (then
// lower address), while reserved (less what was freed so far) is above threshold x cap.
std::vector<std::size_t> choose_gc_victims(std::span<const GcCandidate> candidates, double threshold,
                                           std::size_t reserved_bytes, std::size_t cap_bytes);

}  // namespace gpumem::alloc::policy
