// BenchArgs: the command line of a benchmark program, parsed the same way in every one of them.
// Options are declared with where their value goes, then parse() walks argv once:
//
//   gpumem::bench::BenchArgs args("bench_alloc_pairs", "[--ops N] [--threads T] [--tsv]");
//   args.count("--ops", ops, 1).number("--threads", threads, 0, 256).flag("--tsv", tsv);
//   args.parse(argc, argv);
//
// Values come as the next argument or after '=' (--ops=1000). Numbers must be whole and in range,
// with nothing after them: "--ops 10x", "--ops -3", "--threads 1e3" are errors (std::stoi took the
// first two as 10 and, through unsigned wrap-around, a huge count). Every error names the argument
// and what was wrong, prints the usage line to stderr and exits with status 2; --help prints the
// usage to stdout and exits 0.
//
// Thread-safety: none (main() only).
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace gpumem::bench {

class BenchArgs {
 public:
  // Applies a value: returns an error text, empty when the value was taken.
  using Apply = std::function<std::string(const std::string& value)>;

  BenchArgs(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

  // --name without a value: sets out to true.
  BenchArgs& flag(std::string name, bool& out) {
    opts_.push_back({std::move(name), false, [&out](const std::string&) {
                       out = true;
                       return std::string();
                     }});
    return *this;
  }
  // --name N: a whole number in [min, max] (integral T).
  template <class T>
  BenchArgs& number(std::string name, T& out, T min = std::numeric_limits<T>::min(),
                    T max = std::numeric_limits<T>::max()) {
    static_assert(std::is_integral_v<T>);
    opts_.push_back({std::move(name), true, [&out, min, max](const std::string& v) {
                       return parse_number(v, out, min, max);
                     }});
    return *this;
  }
  // --name N: a count, at least `min`.
  BenchArgs& count(std::string name, std::size_t& out, std::size_t min = 0) {
    return number(std::move(name), out, min, std::numeric_limits<std::size_t>::max());
  }
  // --name TEXT (the last one given wins).
  BenchArgs& text(std::string name, std::string& out) {
    opts_.push_back({std::move(name), true, [&out](const std::string& v) {
                       out = v;
                       return std::string();
                     }});
    return *this;
  }
  // --name TEXT, repeatable: every value is appended.
  BenchArgs& texts(std::string name, std::vector<std::string>& out) {
    opts_.push_back({std::move(name), true, [&out](const std::string& v) {
                       out.push_back(v);
                       return std::string();
                     }});
    return *this;
  }
  // --name VALUE checked and applied by the caller (an error text names what is wrong).
  BenchArgs& custom(std::string name, Apply apply) {
    opts_.push_back({std::move(name), true, std::move(apply)});
    return *this;
  }
  // Arguments that are not options (files, say) go here; without it they are errors.
  BenchArgs& positional(std::vector<std::string>& out) {
    positional_ = &out;
    return *this;
  }
  // One optional argument that is not an option: a whole number in [min, max] named `label` in
  // errors (bench_snapshot_write [ENTRIES]).
  template <class T>
  BenchArgs& positional_number(std::string label, T& out, T min, T max) {
    number_label_ = std::move(label);
    number_ = [&out, min, max](const std::string& v) { return parse_number(v, out, min, max); };
    return *this;
  }

  void parse(int argc, char** argv) const {
    bool number_given = false;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        fmt::print("usage: {} {}\n", program_, usage_);
        std::exit(0);
      }
      std::string value;
      bool has_value = false;
      if (const auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
        value = a.substr(eq + 1);
        a.resize(eq);
        has_value = true;
      }
      const Option* o = find(a);
      if (o == nullptr) {
        if (positional_ != nullptr && !has_value && a.rfind("-", 0) != 0) {
          positional_->push_back(a);
          continue;
        }
        if (number_ && !has_value && a.rfind("--", 0) != 0) {
          if (number_given) fail(fmt::format("one {} at most; '{}' is a second", number_label_, a));
          if (std::string err = number_(a); !err.empty()) fail(fmt::format("{} {}: {}", number_label_, a, err));
          number_given = true;
          continue;
        }
        fail(fmt::format("unknown argument '{}'", argv[i]));
      }
      if (!o->takes_value) {
        if (has_value) fail(fmt::format("{} takes no value", a));
        o->apply({});
        continue;
      }
      if (!has_value) {
        if (i + 1 >= argc) fail(fmt::format("{} needs a value", a));
        value = argv[++i];
      }
      if (std::string err = o->apply(value); !err.empty()) fail(fmt::format("{} {}: {}", a, value, err));
    }
  }

  // Prints "PROGRAM: WHAT" and the usage line to stderr; exits 2.
  [[noreturn]] void fail(const std::string& what) const {
    fmt::print(stderr, "{}: {}\nusage: {} {}\n", program_, what, program_, usage_);
    std::exit(2);
  }

  // The number in `text`, whole text only: an error text, empty on success.
  template <class T>
  static std::string parse_number(std::string_view text, T& out, T min, T max) {
    T v{};
    const char* first = text.data();
    const char* last = first + text.size();
    if (text.empty()) return "expected a whole number, got nothing";
    if (std::is_unsigned_v<T> && text.front() == '-') return "expected a whole number of 0 or more";
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec == std::errc::result_out_of_range) return fmt::format("out of range (at most {})", max);
    if (ec != std::errc() || end != last) return "expected a whole number (digits only)";
    if (v < min || v > max) return fmt::format("must be in {}..{}", min, max);
    out = v;
    return {};
  }

 private:
  struct Option {
    std::string name;
    bool takes_value;
    Apply apply;
  };
  const Option* find(const std::string& name) const {
    for (const Option& o : opts_)
      if (o.name == name) return &o;
    return nullptr;
  }

  std::string program_;
  std::string usage_;
  std::vector<Option> opts_;
  std::vector<std::string>* positional_ = nullptr;
  std::string number_label_;
  Apply number_;
};

}  // namespace gpumem::bench
