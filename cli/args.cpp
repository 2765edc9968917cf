#include "args.h"

#include <cctype>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace gpumem::cli {

ArgReader::ArgReader(std::string_view command, const std::vector<std::string_view>& args)
    : command_(command), args_(args) {
  skip_double_dash();
}

void ArgReader::skip_double_dash() {
  while (!options_ended_ && pos_ < args_.size() && args_[pos_] == "--") {
    options_ended_ = true;
    ++pos_;
  }
}

bool ArgReader::at_option() const noexcept {
  return !options_ended_ && pos_ < args_.size() && args_[pos_].size() > 1 && args_[pos_][0] == '-';
}

std::string_view ArgReader::option_name() const {
  const std::string_view a = args_[pos_];
  const auto eq = a.find('=');
  return eq == std::string_view::npos ? a : a.substr(0, eq);
}

void ArgReader::take_flag() {
  const std::string_view a = args_[pos_];
  if (a.find('=') != std::string_view::npos) {
    fail(fmt::format("option {} takes no value (got '{}')", option_name(), a));
  }
  ++pos_;
  skip_double_dash();
}

std::string_view ArgReader::take_value() {
  const std::string_view a = args_[pos_];
  const auto eq = a.find('=');
  std::string_view value;
  if (eq != std::string_view::npos) {
    value = a.substr(eq + 1);
    ++pos_;
  } else {
    if (pos_ + 1 >= args_.size()) fail(fmt::format("option {} needs a value", a));
    value = args_[pos_ + 1];
    pos_ += 2;
  }
  if (value.empty()) fail(fmt::format("option {} needs a non-empty value", a.substr(0, eq)));
  skip_double_dash();
  return value;
}

std::string_view ArgReader::take_positional() {
  const std::string_view a = args_[pos_++];
  skip_double_dash();
  return a;
}

void ArgReader::fail(const std::string& what) const { throw UsageError(usage_message(command_, what)); }

std::string usage_message(std::string_view command, std::string_view what) {
  return fmt::format("gpumem {}: {}; see 'gpumem {} --help'", command, what, command);
}

std::optional<std::size_t> parse_size(std::string_view text) {
  double number = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, number);
  if (ec != std::errc() || number < 0 || !std::isfinite(number)) return std::nullopt;
  std::string unit(p, end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Binary units, one convention with the configuration's *_mb keys (1 MB = 1 MiB, as in PyTorch).
  double scale = 0;
  if (unit == "b") scale = 1;
  else if (unit == "kib" || unit == "kb") scale = 1024.0;
  else if (unit == "mib" || unit == "mb") scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "gb") scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "tb") scale = 1024.0 * 1024 * 1024 * 1024;
  else return std::nullopt;  // no unit ("8"): refused, so that 8 is never read as 8 bytes
  const double bytes = number * scale;
  if (bytes < 1 || bytes > 1e18) return std::nullopt;
  return static_cast<std::size_t>(bytes);
}

}  // namespace gpumem::cli
