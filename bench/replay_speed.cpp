// Replay speed: trace entries per second through the gpumem policy (target >= 5 million/s), and
// through the PyTorch models for comparison.
//
//   replay_speed [TRACE...] [--repeat N]
//
// Default traces: the one shipped in traces/ (found from the working directory or
// $GPUMEM_SOURCE_DIR) and, when $GPUMEM_SHARED_DIR is set, the shared traces. Prints, per trace
// and policy, the measuring pass alone (what the target is about) and the whole replay_policy
// call (measuring pass + the replay to the peak for the breakdown), best of N runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_args.h"
#include "gpumem/forensics/policy_factory.h"
#include "gpumem/forensics/replay.h"
#include "gpumem/forensics/trace_loader.h"

namespace fx = gpumem::forensics;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<std::string> traces;
  int repeat = 5;
  gpumem::bench::BenchArgs args("replay_speed", "[TRACE...] [--repeat N]");
  args.number("--repeat", repeat, 1, 1000).positional(traces);
  args.parse(argc, argv);
  if (traces.empty()) {
    const char* src = std::getenv("GPUMEM_SOURCE_DIR");
    for (const std::string& root : {std::string(src ? src : "."), std::string(".")}) {
      const std::string p = root + "/traces/resnet50.native.trace.csv.gz";
      if (fs::exists(p)) {
        traces.push_back(p);
        break;
      }
    }
    if (const char* shared = std::getenv("GPUMEM_SHARED_DIR")) {
      for (const char* dir : {"native", "expandable"}) {
        const fs::path d = fs::path(shared) / "traces" / dir;
        if (!fs::exists(d)) continue;
        for (const auto& f : fs::directory_iterator(d)) {
          if (f.path().string().find(".trace.csv.gz") != std::string::npos) traces.push_back(f.path().string());
        }
      }
    }
  }
  if (traces.empty()) {
    std::fprintf(stderr, "replay_speed: no trace found; pass trace paths or run from the repository root\n");
    return 2;
  }
  const std::vector<std::string> policies = {"gpumem", "pytorch", "pytorch:expandable"};

  std::printf("%-48s %-20s %9s %16s %16s %14s\n", "trace", "policy", "entries", "entries/s (pass)",
              "entries/s (all)", "steps/s (pass)");
  double gpumem_entries = 0, gpumem_seconds = 0;
  for (const std::string& path : traces) {
    const fx::LoadedTrace loaded = fx::load_trace(path);
    const fx::ReplayScript script = fx::compile_replay(loaded.trace);
    for (const std::string& policy : policies) {
      const fx::PolicySpec spec = fx::parse_policy_spec(policy);
      double best_pass = 1e30, best_all = 1e30;
      for (int r = 0; r < repeat; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const fx::PolicyReplay result = fx::replay_policy(loaded.trace, script, policy, spec.make);
        const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best_pass = std::min(best_pass, result.replay_seconds);
        best_all = std::min(best_all, all);
      }
      const double entries = static_cast<double>(script.entries);
      std::printf("%-48s %-20s %9zu %16.3g %16.3g %14.3g\n", fs::path(path).parent_path().filename().string().append("/").append(fs::path(path).filename().string()).c_str(),
                  policy.c_str(), script.entries, entries / best_pass, entries / best_all,
                  static_cast<double>(script.steps.size()) / best_pass);
      if (policy == "gpumem") {
        gpumem_entries += entries;
        gpumem_seconds += best_pass;
      }
    }
  }
  if (gpumem_seconds > 0) {
    std::printf("\ngpumem policy, all traces: %.2f million trace entries per second (target >= 5)\n",
                gpumem_entries / gpumem_seconds / 1e6);
  }
  return 0;
}
