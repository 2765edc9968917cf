// Fidelity of the PyTorch 2.11 allocator model on the real traces in $GPUMEM_SHARED_DIR/traces: its
// predicted peak reserved must be within 2% of what PyTorch measured on the H200 (the .json beside
// each trace), native/ with `pytorch`, expandable/ with `pytorch:expandable`. The traces' own
// segment entries are compared with the model's, line by line, too.
#include <cmath>
#include <filesystem>
#include <regex>
#include <unordered_map>

#include <fmt/format.h>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/policy_factory.h"
#include "gpumem/forensics/pytorch_policy.h"
#include "gpumem/forensics/replay.h"
#include "gpumem/forensics/trace_loader.h"

namespace fx = gpumem::forensics;
namespace fs = std::filesystem;

namespace {

struct SharedTrace {
  std::string path;
  bool expandable;
};

// The repository's trace, then every trace in $GPUMEM_SHARED_DIR/traces when that is there.
std::vector<SharedTrace> shared_traces(const std::optional<std::string>& shared) {
  std::vector<SharedTrace> out;
  if (!shared) return {{fx::testing::repo_trace(), false}};
  for (const char* dir : {"native", "expandable"}) {
    const fs::path d = fs::path(*shared) / "traces" / dir;
    if (!fs::exists(d)) continue;
    for (const auto& f : fs::directory_iterator(d)) {
      const std::string name = f.path().filename().string();
      if (name.size() > 13 && name.compare(name.size() - 13, 13, ".trace.csv.gz") == 0) {
        out.push_back({f.path().string(), std::string(dir) == "expandable"});
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const SharedTrace& a, const SharedTrace& b) { return a.path < b.path; });
  out.insert(out.begin(), {fx::testing::repo_trace(), false});
  return out;
}

// The cap PyTorch ran under, from an OOM message beside the trace ("8.00 GiB allowed").
std::size_t recorded_cap(const std::string& json_path) {
  const std::string text = fx::testing::read_file(json_path);
  std::smatch m;
  if (std::regex_search(text, m, std::regex(R"(([0-9.]+) GiB allowed)"))) {
    return static_cast<std::size_t>(std::stod(m[1].str()) * double(std::size_t{1} << 30));
  }
  return std::numeric_limits<std::size_t>::max();
}

}  // namespace

TEST_CASE("the PyTorch model predicts peak reserved within 2% on every shared trace", "[fidelity]") {
  const auto shared = fx::testing::shared_dir();  // absent: the repository's trace alone
  const auto traces = shared_traces(shared);
  REQUIRE(traces.size() >= (shared ? 7u : 1u));
  for (const auto& t : traces) {
    const auto measured = fx::measured_beside(t.path);
    REQUIRE(measured.has_value());
    const fx::LoadedTrace loaded = fx::load_trace(t.path);
    const fx::ReplayScript script = fx::compile_replay(loaded.trace);
    fx::ReplayEnvironment env;
    env.memory_limit_bytes = recorded_cap(measured->json_path);
    const std::string policy = t.expandable ? "pytorch:expandable" : "pytorch";
    const fx::PolicySpec spec = fx::parse_policy_spec(policy, env);
    const fx::PolicyReplay r = fx::replay_policy(loaded.trace, script, policy, spec.make);
    const double error = double(r.peak_reserved_bytes) / double(measured->peak_reserved_bytes) - 1.0;
    INFO(fmt::format("{} with {}: predicted {} measured {} ({:+.3f}%)", t.path, policy, r.peak_reserved_bytes,
                     measured->peak_reserved_bytes, error * 100));
    CHECK(std::abs(error) <= 0.02);
    // What the program asked for at its peak is the model's peak allocated's floor.
    CHECK(r.peak_allocated_bytes >= r.peak_requested_bytes);
    CHECK(r.failed_allocations == 0);
  }
}

TEST_CASE("without the trace's segment addresses the model is still within 2%", "[fidelity]") {
  const auto shared = fx::testing::shared_dir();  // absent: the repository's trace alone
  for (const auto& t : shared_traces(shared)) {
    const auto measured = fx::measured_beside(t.path);
    REQUIRE(measured.has_value());
    const fx::LoadedTrace loaded = fx::load_trace(t.path);
    const fx::ReplayScript script = fx::compile_replay(loaded.trace);
    fx::PytorchModelOptions o;
    o.expandable_segments = t.expandable;
    o.use_trace_segment_addresses = false;
    o.cap_bytes = recorded_cap(measured->json_path);
    const fx::PolicyReplay r = fx::replay_policy(loaded.trace, script, "pytorch", [o] {
      return std::make_unique<fx::PytorchPolicy>("pytorch", o);
    });
    const double error = double(r.peak_reserved_bytes) / double(measured->peak_reserved_bytes) - 1.0;
    INFO(fmt::format("{}: predicted {} measured {} ({:+.3f}%)", t.path, r.peak_reserved_bytes,
                     measured->peak_reserved_bytes, error * 100));
    CHECK(std::abs(error) <= 0.02);
  }
}

TEST_CASE("the model's segment calls are the trace's segment entries, in order", "[fidelity]") {
  const auto shared = fx::testing::shared_dir();  // absent: the repository's trace alone
  for (const auto& t : shared_traces(shared)) {
    const auto measured = fx::measured_beside(t.path);
    REQUIRE(measured.has_value());
    const fx::LoadedTrace loaded = fx::load_trace(t.path);
    fx::PytorchModelOptions o;
    o.expandable_segments = t.expandable;
    o.cap_bytes = recorded_cap(measured->json_path);
    fx::PytorchPolicy model("pytorch", o);
    model.prepare(loaded.trace);
    model.record_segment_events(true);
    // Drive the model entry by entry (oom entries are probes, as in the replay) and collect the
    // trace's own segment entries.
    std::unordered_map<std::uint64_t, std::uint64_t> addr;
    std::vector<std::pair<fx::TraceAction, std::size_t>> recorded;
    for (const fx::TraceEntry& e : loaded.trace.entries) {
      switch (e.action) {
        case fx::TraceAction::alloc:
          if (auto a = model.allocate(e.size_bytes, e.stream)) addr[e.addr] = *a;
          break;
        case fx::TraceAction::free_completed:
          if (auto it = addr.find(e.addr); it != addr.end()) {
            model.free(it->second);
            addr.erase(it);
          }
          break;
        case fx::TraceAction::oom:
          if (auto a = model.allocate(e.size_bytes, e.stream)) model.free(*a);
          break;
        case fx::TraceAction::segment_alloc:
        case fx::TraceAction::segment_free:
        case fx::TraceAction::segment_map:
        case fx::TraceAction::segment_unmap:
          recorded.emplace_back(e.action, e.size_bytes);
          break;
        default: break;
      }
    }
    model.check_invariants();
    const auto& events = model.segment_events();
    INFO(t.path);
    REQUIRE(events.size() == recorded.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < events.size(); ++i) {
      if (events[i].action != recorded[i].first || events[i].size_bytes != recorded[i].second) ++mismatches;
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("the snapshot pickle replays to PyTorch's measured peak", "[fidelity]") {
  const auto shared = fx::testing::shared_dir();
  if (!shared) GPUMEM_SKIP("GPUMEM_SHARED_DIR does not point at the shared traces (the OOM snapshot is there only)");
  const std::string path = *shared + "/traces/native/oom.snapshot.pickle";
  const auto measured = fx::measured_beside(path);
  REQUIRE(measured.has_value());
  const fx::LoadedTrace loaded = fx::load_trace(path);
  CHECK(loaded.format == fx::TraceFormat::snapshot);
  const fx::ReplayScript script = fx::compile_replay(loaded.trace);
  CHECK(script.trace_ooms == 1);
  fx::ReplayEnvironment env;
  env.memory_limit_bytes = recorded_cap(measured->json_path);
  const fx::PolicyReplay r =
      fx::replay_policy(loaded.trace, script, "pytorch", fx::parse_policy_spec("pytorch", env).make);
  CHECK(r.peak_reserved_bytes == measured->peak_reserved_bytes);
  CHECK(r.trace_ooms_served == 0);         // PyTorch's OOM happens in the model too
  CHECK(r.counters.alloc_retries == 1);    // after one retry, as num_alloc_retries says
  CHECK(measured->num_alloc_retries == 1);
}
