// The numbers a reader accepts (read_limits.h says why): a size is at most kMaxPlausibleBytes, an
// address range does not pass 2^64, a time stamp is within +-kMaxPlausibleTimeUs, and the sizes of
// one trace (or one snapshot's segments) add up to at most kMaxTotalBytes. Readers call these per
// entry, so that their error names the line or the field. Internal to gpumem::forensics.
//
// Thread-safety: free functions and a plain value.
#pragma once

#include <cstdint>
#include <string>

#include "gpumem/forensics/read_limits.h"

namespace gpumem::forensics::detail {

// What is wrong with an entry's numbers, or "" when they are plausible.
std::string implausible_numbers(std::uint64_t addr, std::uint64_t size_bytes, std::int64_t time_us);

// A running sum of sizes; add() is false once the sum passes kMaxTotalBytes.
struct SizeSum {
  std::uint64_t bytes = 0;
  bool add(std::uint64_t size_bytes) noexcept {
    bytes += size_bytes;  // both <= 2^62 + 2^52: no wrap
    return bytes <= kMaxTotalBytes;
  }
};

// The complaint for a SizeSum past its bound.
std::string total_too_large(const char* what);

}  // namespace gpumem::forensics::detail
