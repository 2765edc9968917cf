// The alloc+free workloads of the pair benchmarks (bench_alloc_pairs on the engine,
// torch_alloc_pairs through c10's allocator interface), one definition so both time the same op
// sequences: fixed-size pairs of 4 KiB, 1 MiB and 64 MiB, and windows of W live allocations
// (W = 64, 1024) where each step frees a random slot and allocates a new size, log-uniform in
// 512 B..32 MiB, into it.
//
// A sequence is a pure function of (pattern, ops, seed): the same on every allocator and run.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace gpumem::bench {

struct AllocPattern {
  const char* name;
  std::size_t fixed_bytes;  // > 0: pairs of this size; 0: a window pattern
  std::size_t window;       // live allocations of a window pattern
};

inline const std::vector<AllocPattern>& alloc_patterns() {
  static const std::vector<AllocPattern> patterns = {
      {"4 KiB pairs", 4096, 0},
      {"1 MiB pairs", std::size_t{1} << 20, 0},
      {"64 MiB pairs", std::size_t{64} << 20, 0},
      {"window 64, 512 B-32 MiB", 0, 64},
      {"window 1024, 512 B-32 MiB", 0, 1024},
  };
  return patterns;
}

// A window pattern's ops: first allocate sizes[0..window), then step i frees live[slots[i]] and
// allocates sizes[window + i] into that slot. Empty for a fixed pattern.
struct AllocSequence {
  std::vector<std::size_t> sizes;    // window + ops sizes in bytes
  std::vector<std::uint32_t> slots;  // ops slots, each < window
};

// n sizes, log-uniform in [lo, hi) bytes (the windows': 512 B..32 MiB).
inline std::vector<std::size_t> log_uniform_sizes(std::size_t n, std::uint64_t seed, double lo = 512.0,
                                                  double hi = 32.0 * 1024 * 1024) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
  std::vector<std::size_t> out(n);
  for (auto& s : out) s = static_cast<std::size_t>(std::exp(u(rng)));
  return out;
}

inline AllocSequence make_alloc_sequence(const AllocPattern& p, std::size_t ops, std::uint64_t seed) {
  AllocSequence s;
  if (p.fixed_bytes) return s;
  s.sizes = log_uniform_sizes(ops + p.window, seed);
  std::mt19937_64 rng(seed ^ 0x5bd1e995);
  s.slots.resize(ops);
  for (auto& slot : s.slots) slot = static_cast<std::uint32_t>(rng() % p.window);
  return s;
}

}  // namespace gpumem::bench
