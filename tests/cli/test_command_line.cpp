// CommandLine, the argument handling of the `gpumem` subcommands: what each kind of option
// stores, --help, and one error line per mistake that names the argument and points at --help.
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "catch.h"
#include "command_line.h"

using gpumem::cli::CommandLine;

namespace {

// What a command declares in these tests, and what parsing printed.
struct Parsed {
  std::optional<int> status;
  std::string out, err;
  std::string file, timeline, colors = "auto";
  std::vector<std::string> policies;
  bool json = false, replay = true;
  std::size_t top = 20, limit_bytes = 0;
  std::optional<int> device;
};

std::string read_all(std::FILE* f) {
  std::string text;
  std::rewind(f);
  char buf[512];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  std::fclose(f);
  return text;
}

Parsed parse(const std::vector<std::string_view>& args) {
  Parsed p;
  CommandLine cl("test", "usage: gpumem test FILE [options]\n");
  cl.positional(p.file, "file", "gpumem test FILE", " (to compare two, use --diff)");
  cl.flag("--json", p.json);
  cl.flag("--no-replay", p.replay, false);
  cl.value("--timeline", p.timeline);
  cl.values("--policy", p.policies);
  cl.integer("--top", 0, 1000, p.top);
  cl.integer("--device", 0, 1024, p.device, "a device index (0, 1, ...)");
  cl.size("--memory-limit", p.limit_bytes);
  cl.choice("--colors", {"auto", "256", "8", "none"}, p.colors);
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  REQUIRE(out);
  REQUIRE(err);
  p.status = cl.parse(args, out, err);
  p.out = read_all(out);
  p.err = read_all(err);
  return p;
}

// The one line a usage error prints.
std::string error_line(const std::string& what) { return "gpumem test: " + what + "; see 'gpumem test --help'\n"; }

}  // namespace

TEST_CASE("command line: every kind of option stores its value", "[cli]") {
  const Parsed p = parse({"trace.csv", "--json", "--no-replay", "--timeline", "t.csv", "--policy", "gpumem",
                          "--policy=pytorch", "--top", "7", "--device=3", "--memory-limit", "8GiB", "--colors", "none"});
  CHECK_FALSE(p.status.has_value());
  CHECK(p.out.empty());
  CHECK(p.err.empty());
  CHECK(p.file == "trace.csv");
  CHECK(p.json);
  CHECK_FALSE(p.replay);
  CHECK(p.timeline == "t.csv");
  CHECK(p.policies == std::vector<std::string>{"gpumem", "pytorch"});
  CHECK(p.top == 7);
  CHECK(p.device == 3);
  CHECK(p.limit_bytes == std::size_t{8} << 30);
  CHECK(p.colors == "none");

  // Defaults stay when an option is not given; the bounds are accepted; `--` ends the options.
  const Parsed q = parse({"--top", "1000", "--device", "0", "--", "--json"});
  CHECK_FALSE(q.status.has_value());
  CHECK(q.file == "--json");
  CHECK_FALSE(q.json);
  CHECK(q.top == 1000);
  CHECK(q.device == 0);
  CHECK(q.colors == "auto");
  CHECK(q.replay);
}

TEST_CASE("command line: --help prints the help and asks to exit 0", "[cli]") {
  for (std::string_view h : {"--help", "-h"}) {
    const Parsed p = parse({"trace.csv", h, "--bogus"});  // what follows --help is not read
    CHECK(p.status == 0);
    CHECK(p.out == "usage: gpumem test FILE [options]\n");
    CHECK(p.err.empty());
  }
  // Without a file too: help comes before the check for the positional argument.
  CHECK(parse({"--help"}).status == 0);
  // A mistake before --help is reported.
  const Parsed bad = parse({"--bogus", "--help"});
  CHECK(bad.status == 2);
  CHECK(bad.out.empty());
}

TEST_CASE("command line: each mistake is one line naming the argument, and exit status 2", "[cli]") {
  struct Case {
    std::vector<std::string_view> args;
    std::string what;
  };
  const Case cases[] = {
      // unknown flag
      {{"f", "--bogus"}, "unknown option '--bogus'"},
      {{"f", "--bogus=1"}, "unknown option '--bogus'"},
      {{"f", "-x"}, "unknown option '-x'"},
      // missing value
      {{"f", "--top"}, "option --top needs a value"},
      {{"f", "--policy"}, "option --policy needs a value"},
      {{"f", "--top="}, "option --top needs a non-empty value"},
      // a flag given a value
      {{"f", "--json=yes"}, "option --json takes no value (got '--json=yes')"},
      // bad numbers: not a number, trailing text, a sign, out of range, overflow
      {{"f", "--top", "many"}, "--top takes a number from 0 to 1000, not 'many'"},
      {{"f", "--top", "12x"}, "--top takes a number from 0 to 1000, not '12x'"},
      {{"f", "--top", "+5"}, "--top takes a number from 0 to 1000, not '+5'"},
      {{"f", "--top", "-1"}, "--top takes a number from 0 to 1000, not '-1'"},
      {{"f", "--top=1001"}, "--top takes a number from 0 to 1000, not '1001'"},
      {{"f", "--top", "99999999999999999999"}, "--top takes a number from 0 to 1000, not '99999999999999999999'"},
      {{"f", "--device", "gpu0"}, "--device takes a device index (0, 1, ...), not 'gpu0'"},
      // bad size, bad choice
      {{"f", "--memory-limit", "lots"}, "--memory-limit takes a size with a unit such as 8GiB or 512MiB (B, KiB, MiB, GiB, TiB; MB means MiB, as in the configuration's *_mb keys), not 'lots'"},
      {{"f", "--memory-limit", "0"}, "--memory-limit takes a size with a unit such as 8GiB or 512MiB (B, KiB, MiB, GiB, TiB; MB means MiB, as in the configuration's *_mb keys), not '0'"},
      {{"f", "--memory-limit", "8"}, "--memory-limit takes a size with a unit such as 8GiB or 512MiB (B, KiB, MiB, GiB, TiB; MB means MiB, as in the configuration's *_mb keys), not '8'"},
      {{"f", "--colors", "16"}, "--colors takes auto, 256, 8 or none, not '16'"},
      // positional arguments
      {{"a", "b"}, "one file at a time: got 'a' and 'b' (to compare two, use --diff)"},
      {{}, "no file given: gpumem test FILE"},
      {{"--json"}, "no file given: gpumem test FILE"},
      {{""}, "no file given: gpumem test FILE"},  // an unset shell variable
  };
  for (const Case& c : cases) {
    std::string joined;
    for (auto a : c.args) joined += std::string(a) + " ";
    INFO(joined);
    const Parsed p = parse(c.args);
    CHECK(p.status == 2);
    CHECK(p.err == error_line(c.what));
    CHECK(p.out.empty());
  }
}

TEST_CASE("command line: checks after parsing report the same way; misuse by the command throws", "[cli]") {
  std::vector<std::string> files;
  CommandLine cl("diff", "help\n");
  cl.positionals(files);
  std::FILE* err = std::tmpfile();
  REQUIRE(err);
  CHECK_FALSE(cl.parse({"a", "b", "c"}, stdout, err).has_value());
  CHECK(files == std::vector<std::string>{"a", "b", "c"});
  CHECK(cl.usage_error("diff takes two files, A and B (got 3)", err) == 2);
  CHECK(read_all(err) == "gpumem diff: diff takes two files, A and B (got 3); see 'gpumem diff --help'\n");

  // A command without positional arguments names an unexpected one.
  bool flag = false;
  CommandLine plain("plain", "help\n");
  plain.flag("--x", flag);
  std::FILE* err2 = std::tmpfile();
  REQUIRE(err2);
  CHECK(plain.parse({"--x", "stray"}, stdout, err2) == 2);
  CHECK(read_all(err2) == "gpumem plain: unexpected argument 'stray'; see 'gpumem plain --help'\n");

  CHECK_THROWS_AS(plain.flag("--x", flag), std::logic_error);
  CHECK_THROWS_AS(cl.positionals(files), std::logic_error);
}

TEST_CASE("parse_size reads a number with a binary unit, and nothing without one", "[cli]") {
  using gpumem::cli::parse_size;
  CHECK(parse_size("4096B") == 4096u);
  CHECK(parse_size("8GiB") == std::size_t{8} << 30);
  CHECK(parse_size("512mib") == std::size_t{512} << 20);
  // One convention with the configuration's *_mb keys: MB is MiB, GB is GiB.
  CHECK(parse_size("80GB") == std::size_t{80} << 30);
  CHECK(parse_size("500MB") == std::size_t{500} << 20);
  CHECK(parse_size("1.5KiB") == 1536u);
  CHECK(parse_size("2TiB") == std::size_t{2} << 40);
  // A bare number is refused: "--memory-limit 8" must not mean 8 bytes.
  CHECK_FALSE(parse_size("8").has_value());
  CHECK_FALSE(parse_size("4096").has_value());
  CHECK_FALSE(parse_size("lots").has_value());
  CHECK_FALSE(parse_size("0B").has_value());
  CHECK_FALSE(parse_size("-1MB").has_value());
  CHECK_FALSE(parse_size("5PB").has_value());
}
