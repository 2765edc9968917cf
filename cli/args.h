// ArgReader: walks a subcommand's arguments. Options are `--name VALUE`, `--name=VALUE` or flags;
// anything else is positional; `--` ends the options. Every mistake is one UsageError naming the
// argument and pointing at `gpumem CMD --help`. Commands read their arguments through
// CommandLine (command_line.h), which is built on this.
//
// Thread-safety: a plain value.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gpumem::cli {

class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

class ArgReader {
 public:
  ArgReader(std::string_view command, const std::vector<std::string_view>& args);

  bool done() const noexcept { return pos_ >= args_.size(); }
  // The next argument is an option (starts with "--" and options have not ended).
  bool at_option() const noexcept;
  // The option's name without its value ("--policy" for "--policy=x").
  std::string_view option_name() const;
  // Consumes a flag (an option without a value).
  void take_flag();
  // Consumes an option and its value.
  std::string_view take_value();
  std::string_view take_positional();

  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::string command_;
  std::vector<std::string_view> args_;
  std::size_t pos_ = 0;
  bool options_ended_ = false;
  void skip_double_dash();
};

// The one line of a usage error: "gpumem COMMAND: WHAT; see 'gpumem COMMAND --help'".
std::string usage_message(std::string_view command, std::string_view what);

// Parses a size: a number with a unit, B, KiB, MiB, GiB or TiB (case-insensitive). Units are
// binary, as in the configuration's *_mb keys: KB, MB, GB, TB mean KiB, MiB, GiB, TiB. A number
// without a unit is refused (nullopt), as is anything below 1 byte.
std::optional<std::size_t> parse_size(std::string_view text);

}  // namespace gpumem::cli
