// `gpumem diff`: what changed between two snapshots or traces of a program, at chosen moments.
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

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
    "usage: gpumem diff A B [--at MOMENT] [--at-a MOMENT] [--at-b MOMENT] [--json] [--top N]\n"
    "                       [--device N]\n"
    "\n"
    "Compares two snapshots or traces of a program (before and after a change, two steps of a run,\n"
    "or two moments of one file: gpumem diff F F --at-a entry:1000 --at-b peak): live bytes per op\n"
    "and per call site, segments added and removed (by address and size), and the change in every\n"
    "memory term (reserved, allocated, requested, reserved-unallocated, rounding, pending free,\n"
    "inactive split, cached free, largest free extent, external fragmentation; docs/forensics.md\n"
    "defines them). Each side is taken at its moment: by default its OOM when it records one (entries\n"
    "after it undone), else its peak of reserved bytes.\n"
    "\n"
    "A and B are PyTorch memory snapshots, snapshots gpumem wrote (pickle or JSON), or CSV traces.\n"
    "\n"
    "options:\n"
    "  --at MOMENT    both sides' moment: oom, peak, alloc-peak, entry:N or time:T (as in\n"
    "                 gpumem report)\n"
    "  --at-a MOMENT  A's moment (overrides --at for A)\n"
    "  --at-b MOMENT  B's moment (overrides --at for B)\n"
    "  --json         print one JSON object\n"
    "  --top N        rows per list, JSON included (default 20); the counts before the limit are\n"
    "                 printed too\n"
    "  --device N     which device of both files to compare (default: as gpumem report picks)\n"
    "  -h, --help     show this help\n"
    "\n"
    "Exit status: 0 on success, 1 if a file cannot be read or lacks what was asked for, 2 for a\n"
    "usage error.\n";

int run_diff(const std::vector<std::string_view>& argv) {
  std::vector<std::string> files;
  bool json = false;
  std::string at, at_a, at_b;
  std::optional<int> device;
  fx::DiffOptions options;
  CommandLine cl("diff", kHelp);
  cl.positionals(files);
  cl.flag("--json", json);
  cl.value("--at", at);
  cl.value("--at-a", at_a);
  cl.value("--at-b", at_b);
  cl.integer("--top", 0, 1000, options.top);
  cl.integer("--device", 0, 1024, device);
  if (const auto status = cl.parse(argv)) return *status;
  if (files.size() != 2) return cl.usage_error(fmt::format("diff takes two files, A and B (got {})", files.size()));
  for (auto [text, name, target] : {std::tuple{&at, "--at", &options.at_a}, std::tuple{&at_a, "--at-a", &options.at_a},
                                    std::tuple{&at_b, "--at-b", &options.at_b}}) {
    if (text->empty()) continue;
    std::string error;
    const auto moment = fx::parse_moment(*text, &error);
    if (!moment) return cl.usage_error(fmt::format("{}: {}", name, error));
    *target = *moment;
    if (text == &at) options.at_b = *moment;
  }
  options.device_a = options.device_b = device;
  try {
    const fx::Snapshot a = fx::load_snapshot(files[0]);
    const fx::Snapshot b = fx::load_snapshot(files[1]);
    const fx::SnapshotDiff d = fx::diff_snapshots(a, b, options);
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
  return {"diff", "compare two snapshots or traces at chosen moments: bytes per op and call site, memory terms",
          &run_diff};
}

}  // namespace gpumem::cli
