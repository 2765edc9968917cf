#include "gpumem/forensics/read_limits.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"

namespace gpumem::forensics {
namespace {

void override_from(const char* variable, std::uint64_t& value) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return;
  const std::string_view s(text);
  std::uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v == 0) {
    throw ForensicsError(fmt::format("{}='{}' is not a positive integer; set it to a count (e.g. {}={}) or "
                                     "unset it for the default ({})",
                                     variable, s, variable, value * 2, value));
  }
  value = v;
}

}  // namespace

ReadLimits ReadLimits::from_environment() {
  ReadLimits limits;
  override_from("GPUMEM_MAX_FILE_BYTES", limits.max_file_bytes);
  override_from("GPUMEM_MAX_RECORDS", limits.max_records);
  return limits;
}

const ReadLimits& default_read_limits() {
  static const ReadLimits limits = ReadLimits::from_environment();
  return limits;
}

std::string read_limit_hint(const char* variable, std::uint64_t limit) {
  return fmt::format("the limit is {} ({}); if the file is genuine, raise it with {}=N (e.g. {}={})", limit,
                     variable, variable, variable, limit * 4);
}

}  // namespace gpumem::forensics
