#include "gpumem/forensics/vocabulary.h"

#include <cstdlib>

#include <fmt/format.h>

namespace gpumem::forensics {

std::string format_bytes(std::uint64_t b) {
  constexpr std::uint64_t kKiB = 1024;
  if (b < kKiB) return fmt::format("{} B", b);
  const double v = static_cast<double>(b);
  if (b < kKiB * kKiB) return fmt::format("{:.2f} KiB", v / static_cast<double>(kKiB));
  if (b < kKiB * kKiB * kKiB) return fmt::format("{:.2f} MiB", v / static_cast<double>(kKiB * kKiB));
  if (b < kKiB * kKiB * kKiB * kKiB) return fmt::format("{:.2f} GiB", v / static_cast<double>(kKiB * kKiB * kKiB));
  return fmt::format("{:.2f} TiB", v / static_cast<double>(kKiB * kKiB * kKiB * kKiB));
}

std::string format_signed_bytes(std::int64_t b) {
  if (b == 0) return "0 B";
  const std::uint64_t mag = b < 0 ? static_cast<std::uint64_t>(-(b + 1)) + 1 : static_cast<std::uint64_t>(b);
  return (b < 0 ? "-" : "+") + format_bytes(mag);
}

std::string format_share(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return "0%";
  return fmt::format("{:.0f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string format_elapsed_us(std::int64_t us) {
  if (std::llabs(us) >= 1'000'000) return fmt::format("+{:.3f} s", static_cast<double>(us) / 1e6);
  return fmt::format("+{:.1f} ms", static_cast<double>(us) / 1e3);
}

}  // namespace gpumem::forensics
