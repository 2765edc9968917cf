// Spread: the median and range of a benchmark's repeated measurements, and how the bench tables
// print them ("median (min..max)"). Thread-safety: plain values and pure functions.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace gpumem::bench {

struct Spread {
  double median, min, max;
};

// v: at least one measurement.
inline Spread spread_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// "12.3" for one round, "12.3 (11..15)" for more.
inline std::string format_spread(const Spread& s, int rounds) {
  if (rounds == 1) return fmt::format("{:.1f}", s.median);
  return fmt::format("{:.1f} ({:.0f}..{:.0f})", s.median, s.min, s.max);
}

}  // namespace gpumem::bench
