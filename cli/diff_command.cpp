// `gpumem diff`: what changed between two snapshots or traces of a program.
#include <charconv>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "args.h"
#include "commands.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/snapshot_diff.h"
#include "gpumem/forensics/snapshot_io.h"

namespace gpumem::cli {
namespace {

namespace fx = gpumem::forensics;

constexpr const char* kHelp =
    "usage: gpumem diff A B [--json] [--top N]\n"
    "\n"
    "Compares two snapshots or traces of a program (for example before and after a change, or two\n"
    "steps of a training run): live bytes per op and per call site, segments added and removed\n"
    "(by address and size), and the change in fragmentation (reserved-unallocated, inactive split,\n"
    "cached free, largest free extent, external fragmentation). Each side is taken at its OOM when\n"
    "it records one (frees after it rolled back), else at its end.\n"
    "\n"
    "A and B are PyTorch memory snapshots, snapshots gpumem wrote (pickle or JSON), or CSV traces.\n"
    "\n"
    "options:\n"
    "  --json      print one JSON object\n"
    "  --top N     rows per list (default 20)\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 on success, 1 if a file cannot be read, 2 for a usage error.\n";

int run_diff(const std::vector<std::string_view>& argv) {
  std::vector<std::string> files;
  bool json = false;
  std::size_t top = 20;
  try {
    ArgReader r("diff", argv);
    while (!r.done()) {
      if (!r.at_option()) {
        files.emplace_back(r.take_positional());
        continue;
      }
      const std::string_view name = r.option_name();
      if (name == "-h" || name == "--help") {
        std::fputs(kHelp, stdout);
        return 0;
      }
      if (name == "--json") {
        r.take_flag();
        json = true;
      } else if (name == "--top") {
        const std::string_view v = r.take_value();
        auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), top);
        if (ec != std::errc() || p != v.data() + v.size() || top > 1000) {
          r.fail(fmt::format("--top takes a number from 0 to 1000, not '{}'", v));
        }
      } else {
        r.fail(fmt::format("unknown option '{}'", name));
      }
    }
    if (files.size() != 2) r.fail(fmt::format("diff takes two files, A and B (got {})", files.size()));
  } catch (const UsageError& e) {
    std::fputs(fmt::format("{}\n", e.what()).c_str(), stderr);
    return 2;
  }
  try {
    const fx::Snapshot a = fx::load_snapshot(files[0]);
    const fx::Snapshot b = fx::load_snapshot(files[1]);
    const fx::SnapshotDiff d = fx::diff_snapshots(a, b, top);
    const std::string text = json ? fx::render_diff_json(d) : fx::render_diff_text(d);
    std::fputs(text.c_str(), stdout);
  } catch (const fx::ForensicsError& e) {
    std::fputs(fmt::format("gpumem diff: {}\n", e.what()).c_str(), stderr);
    return 1;
  }
  return 0;
}

}  // namespace

Command diff_command() {
  return {"diff", "compare two snapshots or traces: bytes per op and call site, segments, fragmentation", &run_diff};
}

}  // namespace gpumem::cli
