// gpumem's targets on the real traces (issue 3): with its default configuration, peak reserved
// <= 1.02 x peak requested on every trace in $GPUMEM_SHARED_DIR/traces, never above what PyTorch with
// expandable segments measured on the same workload, and the provider calls that get it there
// under 2% of the traced run's time (H200 per-call costs).
//
// Tagged [!mayfail]: the engine is the lead's and is being tuned; the checks run and report every
// miss, without failing the suite. Remove the tag once the engine meets the targets.
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/policy_factory.h"
#include "gpumem/forensics/replay.h"
#include "gpumem/forensics/trace_loader.h"

namespace fx = gpumem::forensics;
namespace fs = std::filesystem;

TEST_CASE("gpumem reserves at most 1.02 x peak requested, and never more than PyTorch expandable", "[gpumem_target][!mayfail]") {
  const auto shared = fx::testing::shared_dir();  // absent: the repository's trace alone
  std::vector<fs::path> traces{fx::testing::repo_trace()};
  if (shared) {
    for (const char* dir : {"native", "expandable"}) {
      for (const auto& f : fs::directory_iterator(fs::path(*shared) / "traces" / dir)) traces.push_back(f.path());
    }
  }
  std::size_t checked = 0;
  {
    for (const fs::path& f : traces) {
      const std::string path = f.string();
      if (path.size() < 13 || path.compare(path.size() - 13, 13, ".trace.csv.gz") != 0) continue;
      const std::string workload = f.filename().string().substr(0, f.filename().string().size() - 13);
      const auto measured = fx::measured_beside(path);
      REQUIRE(measured.has_value());
      // Runs recorded under a cap (the OOM reproducer) are replayed under the same cap.
      fx::ReplayEnvironment env;
      std::smatch m;
      const std::string json = fx::testing::read_file(measured->json_path);
      if (std::regex_search(json, m, std::regex(R"(([0-9.]+) GiB allowed)"))) {
        env.memory_limit_bytes = static_cast<std::size_t>(std::stod(m[1].str()) * double(std::size_t{1} << 30));
      }
      const fx::LoadedTrace loaded = fx::load_trace(path);
      const fx::ReplayScript script = fx::compile_replay(loaded.trace);
      const fx::PolicyReplay r =
          fx::replay_policy(loaded.trace, script, "gpumem", fx::parse_policy_spec("gpumem", env).make);
      const auto expandable =
          shared ? fx::measured_beside((fs::path(*shared) / "traces" / "expandable" / (workload + ".trace.csv.gz")).string())
                 : std::nullopt;
      INFO(fmt::format("{}: gpumem peak reserved {} / peak requested {} = {:.4f}; PyTorch expandable measured {}; "
                       "{} creates, {} maps, {} unmaps, {} releases = {:.1f} ms, {:.2f}% of the run",
                       path, r.peak_reserved_bytes, r.peak_requested_bytes, r.ratio,
                       expandable ? std::to_string(expandable->peak_reserved_bytes) : "(not recorded)",
                       r.counters.creates, r.counters.maps, r.counters.unmaps, r.counters.releases,
                       r.call_seconds * 1e3, r.call_share * 100));
      CHECK(r.failed_allocations == 0);
      CHECK(r.ratio <= 1.02);
      if (expandable) CHECK(r.peak_reserved_bytes <= expandable->peak_reserved_bytes);
      CHECK(r.call_share < 0.02);
      ++checked;
    }
  }
  CHECK(checked >= (shared ? 8u : 1u));
}

TEST_CASE("the gpumem policy's breakdown adds up to its reserved bytes", "[gpumem_target]") {
  const std::string path = fx::testing::repo_trace();
  const fx::LoadedTrace loaded = fx::load_trace(path);
  const fx::ReplayScript script = fx::compile_replay(loaded.trace);
  const fx::PolicyReplay r = fx::replay_policy(loaded.trace, script, "gpumem", fx::parse_policy_spec("gpumem").make);
  const fx::WasteBreakdown& w = r.at_peak;
  CHECK(w.reserved_bytes == r.peak_reserved_bytes);
  CHECK(w.requested_bytes + w.rounding_bytes + w.inactive_split_bytes + w.cached_free_bytes +
            w.partly_used_granule_bytes ==
        w.reserved_bytes);
  CHECK(r.peak_allocated_bytes >= r.peak_requested_bytes);
  CHECK(r.counters.segments >= 1);
  // A gpumem:CONF policy parses its configuration (here: classic segments, like PyTorch's).
  const fx::PolicyReplay classic = fx::replay_policy(loaded.trace, script, "gpumem:expandable_segments:False",
                                                     fx::parse_policy_spec("gpumem:expandable_segments:False").make);
  CHECK(classic.peak_reserved_bytes >= classic.peak_requested_bytes);
  CHECK(classic.failed_allocations == 0);
}
