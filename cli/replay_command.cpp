// `gpumem replay`: replays a PyTorch allocator trace through allocator policies and compares what
// each would reserve.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "command_line.h"
#include "commands.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/policy_factory.h"
#include "gpumem/forensics/replay.h"
#include "gpumem/forensics/replay_report.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/trace_loader.h"
#include "progress_bar.h"

namespace gpumem::cli {
namespace {

namespace fx = gpumem::forensics;

std::string help_text() {
  return fmt::format(
      "usage: gpumem replay TRACE [--policy P]... [--json] [--timeline FILE] [--top N]\n"
      "                     [--device N] [--memory-limit SIZE] [--device-memory SIZE]\n"
      "                     [--step-marker BYTES [--per-step K]]\n"
      "\n"
      "Replays the allocations and frees of a PyTorch allocator trace through allocator policies,\n"
      "in order, and reports for each what it would reserve: peak requested, allocated and\n"
      "reserved bytes, peak reserved / peak requested, where the reserved-but-unrequested bytes\n"
      "sit at the peak (rounding, inactive split blocks, cached free memory, free parts of\n"
      "partly used granules), the segments, the create/map/unmap/release calls and the stream\n"
      "synchronizations recycling makes, with the time they would take on an H200 (1 ms a\n"
      "synchronization) as a share of the traced run lengthened by them, the call sites\n"
      "holding the most memory at the peak, and the requests (call site and size) whose calls\n"
      "took the most time, with the part in the trace's second half (what recurs every step).\n"
      "\n"
      "TRACE is a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes,\n"
      "taken with torch.cuda.memory._record_memory_history enabled) or a CSV trace (.csv or\n"
      ".csv.gz: action,addr,size,stream,time_us,where). Frees of addresses the trace never\n"
      "allocated (the recorder's ring buffer wrapped) are skipped and counted. When a NAME.json\n"
      "with PyTorch's measured peaks sits beside the trace, its numbers are shown too.\n"
      "\n"
      "options:\n"
      "  --policy P           a policy to replay; repeat to compare several side by side\n"
      "                       (default: gpumem, pytorch, pytorch:expandable). Policies:\n"
      "{}"
      "  --json               print one JSON object instead of the table (for scripts)\n"
      "  --timeline FILE      write allocated and reserved bytes after every allocation and free,\n"
      "                       per policy, with the trace time, as CSV to FILE\n"
      "  --top N              how many call sites, and groups of requests by their calls' time,\n"
      "                       to list per policy (default 5, 0 for none)\n"
      "  --device N           which device's trace to take from a snapshot (default: the first\n"
      "                       with entries; -1 = pinned host memory); CSV traces hold one device\n"
      "  --memory-limit SIZE  cap every policy's reserved memory at SIZE (8GiB, 512MiB; a unit is\n"
      "                       required, MB means MiB): would the run have fit? Failed allocations\n"
      "                       are counted. Default for a snapshot that records an OOM: the memory\n"
      "                       it had (the cap it records, else what it had reserved at the OOM when\n"
      "                       the device still had room), so that the replay answers whether each\n"
      "                       policy would have served the request; otherwise none\n"
      "  --device-memory SIZE the simulated device's memory (default 139.8 GiB, an H200)\n"
      "  --step-marker BYTES  a training step starts at the first request of exactly BYTES bytes\n"
      "                       and at every K-th one after it (--per-step K, default 1), as if the\n"
      "                       program told the allocator: a gpumem policy with its step planner\n"
      "                       (the default) then learns the steps from the marks instead of\n"
      "                       finding their length itself\n"
      "  -h, --help           show this help\n"
      "\n"
      "A progress bar is drawn on stderr while replaying, only when stderr is a terminal.\n"
      "Exit status: 0 on success, 1 if the trace cannot be read, 2 for a usage error.\n",
      fx::policy_forms_help());
}

struct ReplayArgs {
  std::string trace;
  std::vector<std::string> policies;
  bool json = false;
  std::string timeline;
  std::size_t top = 5;
  std::optional<int> device;
  std::optional<std::uint64_t> step_marker;
  std::optional<std::size_t> per_step;
  fx::ReplayEnvironment env;
};

int run_replay(const std::vector<std::string_view>& argv) {
  ReplayArgs a;
  CommandLine cl("replay", help_text());
  cl.positional(a.trace, "trace", "gpumem replay TRACE");
  cl.values("--policy", a.policies);
  cl.flag("--json", a.json);
  cl.value("--timeline", a.timeline);
  cl.integer("--top", 0, 1000, a.top, "a count from 0 to 1000");
  cl.integer("--device", -1, 1024, a.device, "a device index (0, 1, ...; -1 = pinned host memory)");
  cl.size("--memory-limit", a.env.memory_limit_bytes);
  cl.size("--device-memory", a.env.device_total_bytes);
  cl.integer("--step-marker", 1, std::int64_t{1} << 50, a.step_marker, "a request size in bytes (1048576000)");
  cl.integer("--per-step", 1, 1'000'000, a.per_step, "a count of marker requests per step, from 1");
  if (const auto status = cl.parse(argv)) return *status;
  if (a.per_step && !a.step_marker) {
    std::fputs("gpumem replay: --per-step counts the requests of --step-marker's size in a step; give --step-marker "
               "BYTES too\n",
               stderr);
    return 2;
  }
  if (a.policies.empty()) a.policies = fx::default_policy_names();
  // Policies first: a bad name should not wait for a large trace to load.
  bool any_plans = false;
  try {
    for (const auto& p : a.policies) any_plans |= fx::parse_policy_spec(p, a.env).step_plan;
  } catch (const fx::ForensicsError& e) {
    std::fputs(fmt::format("gpumem replay: {}\n", e.what()).c_str(), stderr);
    return 2;
  }
  if (a.step_marker && !any_plans) {
    std::fputs("gpumem replay: --step-marker marks steps for the step planner, and no policy uses it; add --policy "
               "gpumem (its planner is on unless the policy says step_plan:False)\n",
               stderr);
    return 2;
  }
  try {
    const fx::LoadedTrace loaded = fx::load_trace(a.trace, a.device);
    // A snapshot of an OOM is replayed with the memory it had, unless --memory-limit says otherwise.
    if (a.env.memory_limit_bytes == std::numeric_limits<std::size_t>::max() && loaded.format == fx::TraceFormat::snapshot) {
      const fx::Snapshot snap = fx::load_snapshot(a.trace);
      const int device = loaded.device;
      if (const auto limit = fx::oom_replay_limit(snap, device)) {
        a.env.memory_limit_bytes = *limit;
        if (!a.json) {
          std::fputs(fmt::format("memory limit {}: the memory the snapshot's OOM had ({}); --memory-limit "
                                 "overrides it\n",
                                 fx::format_bytes(*limit),
                                 snap.gpumem.cap_bytes ? "the cap it records" : "its cap is not recorded: reserved "
                                                                                "at the OOM")
                         .c_str(),
                     stdout);
        }
      }
    }
    std::vector<fx::PolicySpec> specs;
    for (const auto& p : a.policies) specs.push_back(fx::parse_policy_spec(p, a.env));
    fx::ReplayScript script = fx::compile_replay(loaded.trace);
    if (a.step_marker) {
      const std::size_t steps = fx::mark_steps(script, *a.step_marker, a.per_step.value_or(1));
      if (steps == 0) {
        std::fputs(fmt::format("gpumem replay: --step-marker {}: the trace makes no request of exactly that many "
                               "bytes; give the size of a request made once per step (the largest tensors are "
                               "good markers: gpumem replay lists them by call site)\n",
                               *a.step_marker)
                       .c_str(),
                   stderr);
        return 1;
      }
      if (!a.json) std::fputs(fmt::format("step marks: {} step(s) start at a request of {} bytes\n", steps, *a.step_marker).c_str(), stdout);
    }
    fx::ReplayReport report{loaded.trace, script, loaded.format, fx::measured_beside(a.trace), {}};
    fx::ReplayOptions options;
    options.record_timeline = !a.timeline.empty();
    options.top_sites = a.top;
    options.top_call_groups = a.top;
    for (const auto& spec : specs) {
      ProgressBar bar(fmt::format("replaying {}", spec.name));
      options.progress = [&bar](std::size_t done, std::size_t total) { bar.update(done, total); };
      report.policies.push_back(fx::replay_policy(loaded.trace, script, spec.name, spec.make, options));
    }
    if (!a.timeline.empty()) {
      std::ofstream out(a.timeline);
      if (!out) {
        std::fputs(fmt::format("gpumem replay: cannot write the timeline to '{}'; check the path\n", a.timeline)
                       .c_str(),
                   stderr);
        return 1;
      }
      fx::write_timeline_csv(out, report);
    }
    const std::string text = a.json ? fx::format_json(report) : fx::format_table(report);
    std::fputs(text.c_str(), stdout);
  } catch (const fx::ForensicsError& e) {
    std::fputs(fmt::format("gpumem replay: {}\n", e.what()).c_str(), stderr);
    return 1;
  }
  return 0;
}

}  // namespace

Command replay_command() {
  return {"replay", "replay an allocator trace through allocator policies and compare them", &run_replay};
}

}  // namespace gpumem::cli
