// `gpumem report`: where the memory of a snapshot or trace went at one moment, how fragmented it
// is there, and, at an OOM, why the request failed.
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "command_line.h"
#include "commands.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/snapshot_io.h"

namespace gpumem::cli {
namespace {

namespace fx = gpumem::forensics;

constexpr const char* kHelp =
    "usage: gpumem report FILE [--at MOMENT] [--json] [--top N] [--device N] [--no-replay]\n"
    "\n"
    "Reports a program's GPU memory at one moment of its trace: reserved = requested + rounding +\n"
    "pending free + inactive split + cached free, the largest free extent, segments pinned by a few\n"
    "small live blocks (with their op, call site and age), and per op and per call site: the live\n"
    "bytes and blocks, the allocations the trace records up to the moment, the memory their\n"
    "requests reserved and how much of it is reserved-unallocated now. docs/forensics.md defines\n"
    "every term.\n"
    "\n"
    "At an OOM (the default moment when the file records one) it says why the request failed: a\n"
    "verdict (fragmentation, pending_frees, outside_memory, capacity) with the numbers behind it,\n"
    "and advice that follows from it (a replay of the trace under gpumem's policy with the same\n"
    "memory, for fragmentation and pending_frees). At any other moment (by default the peak of\n"
    "reserved bytes) the verdict says where reserved memory beyond the requests goes\n"
    "(fragmentation, caching, rounding, pending_frees, compact) and what PyTorch's allocator, its\n"
    "expandable segments and gpumem would reserve there, replaying the same allocations.\n"
    "Entries recorded after the moment (a snapshot taken later) are undone first, and the report\n"
    "says so.\n"
    "\n"
    "FILE is a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot), a snapshot gpumem\n"
    "wrote (pickle or JSON), or a CSV trace (.csv/.csv.gz; its segments are rebuilt from the trace).\n"
    "\n"
    "options:\n"
    "  --at MOMENT   oom, peak (of reserved bytes), alloc-peak (of allocated bytes), entry:N\n"
    "                (after the first N trace entries) or time:T (T after the first entry: 2.5s,\n"
    "                300ms); default: the OOM when the file records one, else peak\n"
    "  --json        print one JSON object (keys: moment, verdict, reserved_bytes, allocated_bytes,\n"
    "                requested_bytes, fragmentation, evidence, advice, op_table, site_table, ...)\n"
    "  --top N       rows per list, JSON included: ops, call sites, pinned segments (default 10)\n"
    "  --device N    which device to report on (default: the one with an OOM, else the first\n"
    "                with a trace); a device the file does not record is an error\n"
    "  --no-replay   skip the replays (the OOM advice's, the comparison of policies)\n"
    "  -h, --help    show this help\n"
    "\n"
    "Exit status: 0 on success, 1 if the file cannot be read or lacks what was asked for, 2 for a\n"
    "usage error.\n";

int run_report(const std::vector<std::string_view>& argv) {
  std::string file, at;
  bool json = false;
  fx::ReportOptions options;
  CommandLine cl("report", kHelp);
  cl.positional(file, "file", "gpumem report FILE");
  cl.flag("--json", json);
  cl.flag("--no-replay", options.replay, false);
  cl.value("--at", at);
  cl.integer("--top", 0, 1000, options.top);
  cl.integer("--device", 0, 1024, options.device);
  if (const auto status = cl.parse(argv)) return *status;
  if (!at.empty()) {
    std::string error;
    const auto moment = fx::parse_moment(at, &error);
    if (!moment) return cl.usage_error(fmt::format("--at: {}", error));
    options.at = *moment;
  }
  try {
    const fx::Snapshot snap = fx::load_snapshot(file);
    const fx::MemoryReport report = fx::build_report(snap, options);
    const std::string text = json ? fx::render_report_json(report) : fx::render_report_text(report);
    std::fputs(text.c_str(), stdout);
  } catch (const fx::ForensicsError& e) {
    std::fputs(fmt::format("gpumem report: {}\n", e.what()).c_str(), stderr);
    return 1;
  }
  return 0;
}

}  // namespace

Command report_command() {
  return {"report", "explain a snapshot or trace at a moment: memory terms, by op and call site, the verdict",
          &run_report};
}

}  // namespace gpumem::cli
