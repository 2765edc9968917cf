// CommandLine: the argument handling every `gpumem` subcommand shares. A command declares its
// options and positional arguments, each with the variable it fills, then parse() reads the
// arguments in order (through ArgReader: `--name VALUE`, `--name=VALUE`, flags, `--` ends the
// options) and says whether the command runs:
//
//     CommandLine cl("report", kHelp);
//     cl.positional(file, "file", "gpumem report FILE");
//     cl.flag("--json", json);
//     cl.integer("--top", 0, 1000, options.top);
//     if (const auto status = cl.parse(args)) return *status;   // --help, or a usage error
//
// -h / --help prints the help text to `out` and parse() returns 0. A mistake prints one line to
// `err`, "gpumem CMD: WHAT; see 'gpumem CMD --help'", and parse() returns 2, the usage-error
// status of every command. WHAT names the argument and what it should be:
//
//     unknown option '--x'                        an option the command does not declare
//     option --x needs a value                    a value option last, without its value
//     option --x needs a non-empty value          --x= or --x ''
//     option --x takes no value (got '--x=1')     a flag given a value
//     --x takes a number from LO to HI, not 'V'   integer() (or "--x takes WHAT", WHAT given)
//     --x takes a size with a unit such as 8GiB or 512MiB (...), not 'V'    size()
//     --x takes A, B or C, not 'V'                choice()
//     one NOUN at a time: got 'A' and 'B'HINT     positional(), given twice
//     no NOUN given: USAGE                        positional(), never given, or given empty
//     unexpected argument 'A'                     a positional argument nobody declared
//
// Checks that need every argument (how many files, which options go together) run after
// parse() and report through usage_error(), which prints the same way and returns 2.
//
// Declaring an option twice is a programming error (std::logic_error).
//
// Thread-safety: a plain value; the variables it fills must outlive parse().
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "args.h"

namespace gpumem::cli {

class CommandLine {
 public:
  // `command` is the subcommand's name (for messages); `help` what --help prints.
  CommandLine(std::string_view command, std::string help);
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // An option without a value: sets target to `value`.
  void flag(std::string_view name, bool& target, bool value = true);
  // An option with a value: the last one given wins.
  void value(std::string_view name, std::string& target);
  // A repeatable option with a value: each one is appended.
  void values(std::string_view name, std::vector<std::string>& target);
  // An integer from lo to hi, stored as static_cast<T>(n) (T: an integer type or an optional of
  // one). `what` describes the accepted values in the error; default "a number from LO to HI".
  template <class T>
  void integer(std::string_view name, std::int64_t lo, std::int64_t hi, T& target, std::string what = {}) {
    add_integer(name, lo, hi, [&target](std::int64_t n) { target = static_cast<T>(n); }, std::move(what));
  }
  // A size in bytes, as parse_size() reads it (8GiB, 512MiB; a unit is required).
  void size(std::string_view name, std::size_t& target);
  // One of `choices`.
  void choice(std::string_view name, std::vector<std::string> choices, std::string& target);

  // The command's one positional argument, required. A second one is an error naming both
  // ("one NOUN at a time: got 'A' and 'B'" + extra_hint); none, or an empty one, is
  // "no NOUN given: " + missing.
  void positional(std::string& target, std::string noun, std::string missing, std::string extra_hint = {});
  // Any number of positional arguments, appended in order (the command checks how many).
  void positionals(std::vector<std::string>& target);

  // Reads `args` (what follows the subcommand's name). std::nullopt: the command runs; else
  // the status to exit with now (0 after --help, 2 after a usage error).
  std::optional<int> parse(const std::vector<std::string_view>& args, std::FILE* out = stdout,
                           std::FILE* err = stderr);

  // Prints "gpumem CMD: WHAT; see 'gpumem CMD --help'" to `err` and returns 2.
  int usage_error(std::string_view what, std::FILE* err = stderr) const;

 private:
  using Handler = std::function<void(ArgReader&, std::string_view name)>;
  struct Option {
    std::string name;
    Handler take;  // consumes the option (and its value) at the reader's position
  };

  // What positional arguments fill: one string (required, once) or a list, or nothing.
  struct Positional {
    std::string* one = nullptr;
    std::vector<std::string>* many = nullptr;
    std::string noun, missing, extra_hint;  // for `one`'s errors
    bool seen = false;
  };

  std::string command_;
  std::string help_;
  std::vector<Option> options_;
  Positional positional_;

  void add(std::string_view name, Handler take);
  void declare_positional(Positional p);
  void take_positional(ArgReader& r, std::string_view arg);
  void add_integer(std::string_view name, std::int64_t lo, std::int64_t hi, std::function<void(std::int64_t)> store,
                   std::string what);
};

}  // namespace gpumem::cli
