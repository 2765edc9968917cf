// `gpumem diff`: what changed between two snapshots or traces of a program.
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "command_line.h"
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
  CommandLine cl("diff", kHelp);
  cl.positionals(files);
  cl.flag("--json", json);
  cl.integer("--top", 0, 1000, top);
  if (const auto status = cl.parse(argv)) return *status;
  if (files.size() != 2) return cl.usage_error(fmt::format("diff takes two files, A and B (got {})", files.size()));
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
