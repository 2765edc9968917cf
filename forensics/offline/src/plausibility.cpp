#include "plausibility.h"

#include <fmt/format.h>

namespace gpumem::forensics::detail {

std::string implausible_numbers(std::uint64_t addr, std::uint64_t size_bytes, std::int64_t time_us) {
  if (size_bytes > kMaxPlausibleBytes) {
    return fmt::format("size {} is larger than any memory (over 2^52 bytes)", size_bytes);
  }
  if (addr > ~std::uint64_t{0} - size_bytes) {
    return fmt::format("address {} + size {} passes the end of the 64-bit address space", addr, size_bytes);
  }
  if (time_us > kMaxPlausibleTimeUs || time_us < -kMaxPlausibleTimeUs) {
    return fmt::format("time stamp {} us is more than 2^61 us (73,000 years) from zero", time_us);
  }
  return {};
}

std::string total_too_large(const char* what) {
  return fmt::format("the sizes of its {} add up to more than 2^62 bytes (4 EiB); no real program's do", what);
}

}  // namespace gpumem::forensics::detail
