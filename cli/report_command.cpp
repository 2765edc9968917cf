// `gpumem report`: where the memory of a snapshot or trace went, how fragmented it is, and, when
// the file records an OOM, why the request failed.
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
    "usage: gpumem report FILE [--json] [--top N] [--device N] [--no-replay]\n"
    "\n"
    "Reports where a program's GPU memory went: reserved vs allocated, the reserved-but-unallocated\n"
    "bytes split into rounding, inactive split blocks, cached free segments and partly used\n"
    "granules, external fragmentation (1 - largest free extent / free), segments pinned by a few\n"
    "small live blocks (with their op, call site and age), the live memory by op and by call\n"
    "site, and per-op and per-call-site tables over the whole trace (calls, bytes allocated, bytes\n"
    "still live, contribution to the peak, reserved growth caused, fragmentation change).\n"
    "\n"
    "When the file records an OOM (an `oom` trace entry), the report describes the moment of the\n"
    "failure: the request (requested and rounded) against the largest free extent, allocated,\n"
    "reserved, cached free, device free memory, the cap, a verdict (capacity, fragmentation,\n"
    "pending_frees, outside_memory) with the numbers behind it, and advice computed from the data.\n"
    "Frees recorded after the oom entry (a snapshot taken after the exception unwound) are rolled\n"
    "back first, and the report says so.\n"
    "\n"
    "FILE is a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot), a snapshot gpumem\n"
    "wrote (pickle or JSON), or a CSV trace (.csv/.csv.gz; its segments are rebuilt from the trace).\n"
    "\n"
    "options:\n"
    "  --json        print one JSON object (keys: verdict, request_bytes, rounded_request_bytes,\n"
    "                largest_free_extent_bytes, allocated_bytes, reserved_bytes,\n"
    "                reserved_unallocated_bytes, top_ops, top_sites, fragmentation, ...)\n"
    "  --top N       rows per list (default 10)\n"
    "  --device N    which device to report on (default: the one with an OOM, else the first\n"
    "                with a trace); -1 = pinned host memory\n"
    "  --no-replay   skip the replay of the trace under gpumem's policy in the OOM advice\n"
    "  -h, --help    show this help\n"
    "\n"
    "Exit status: 0 on success, 1 if the file cannot be read, 2 for a usage error.\n";

int run_report(const std::vector<std::string_view>& argv) {
  std::string file;
  bool json = false;
  fx::ReportOptions options;
  CommandLine cl("report", kHelp);
  cl.positional(file, "file", "gpumem report FILE");
  cl.flag("--json", json);
  cl.flag("--no-replay", options.replay_advice, false);
  cl.integer("--top", 0, 1000, options.top);
  cl.integer("--device", -1, 1024, options.device);
  if (const auto status = cl.parse(argv)) return *status;
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
  return {"report", "explain a snapshot or trace: memory by op and call site, fragmentation, OOM verdict",
          &run_report};
}

}  // namespace gpumem::cli
