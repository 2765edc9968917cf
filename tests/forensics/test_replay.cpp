// The replay driver: matching frees to allocations by address, truncated traces (frees of
// addresses never allocated are skipped and counted), OOM probes, the peak moment and its
// breakdown, call sites, timeline and JSON output.
#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/call_costs.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/policy_factory.h"
#include "gpumem/forensics/replay.h"
#include "gpumem/forensics/replay_report.h"
#include "gpumem/forensics/trace_loader.h"

namespace fx = gpumem::forensics;
using fx::TraceAction;
using fx::testing::E;
using fx::testing::make_trace;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

fx::PolicyReplay run(const fx::Trace& t, const fx::ReplayScript& s, const std::string& policy,
                     fx::ReplayOptions options = {}) {
  return fx::replay_policy(t, s, policy, fx::parse_policy_spec(policy).make, options);
}

}  // namespace

TEST_CASE("frees are matched by the trace's address; unknown frees are skipped and counted", "[replay]") {
  // The recorder's ring buffer wrapped: the first two entries free blocks whose alloc was lost.
  const fx::Trace t = make_trace({
      {TraceAction::free_requested, 0xdead000, 4096},
      {TraceAction::free_completed, 0xdead000, 4096},
      {TraceAction::alloc, 0x1000, 12 * MiB},
      {TraceAction::alloc, 0x2000, 3 * MiB},
      {TraceAction::free_requested, 0x1000, 12 * MiB},
      {TraceAction::free_completed, 0x1000, 12 * MiB},
      {TraceAction::alloc, 0x1000, 1 * MiB},  // the address is reused by a new allocation
      {TraceAction::alloc, 0x2000, 2 * MiB},  // 0x2000's free was lost: it is freed first
  });
  const fx::ReplayScript s = fx::compile_replay(t);
  CHECK(s.entries == 8);
  CHECK(s.allocs == 4);
  CHECK(s.frees == 2);  // 0x1000's free, and the implied free of the old 0x2000
  CHECK(s.skipped_frees == 2);
  CHECK(s.skipped_allocs == 1);
  CHECK(s.skipped_entries() == 3);
  CHECK(s.peak_requested_bytes == 15 * MiB);
  CHECK(s.peak_requested_step == 1);

  const fx::PolicyReplay r = run(t, s, "pytorch");
  CHECK(r.peak_requested_bytes == 15 * MiB);
  // 12 MiB segment + 20 MiB segment (3 MiB block); the 1 MiB request reuses the 12 MiB block?
  // No: 1 MiB goes to the small pool (2 MiB segment). The 2 MiB request reuses the 20 MiB
  // segment's free space. Peak reserved: 12 + 20 + 2.
  CHECK(r.peak_reserved_bytes == 34 * MiB);
  CHECK(r.counters.creates == 3);
  CHECK(r.failed_allocations == 0);
}

TEST_CASE("the peak moment is explained: breakdown and call sites", "[replay]") {
  fx::Trace t;
  t.source = "handmade";
  auto add = [&](TraceAction a, std::uint64_t addr, std::uint64_t size, const char* where) {
    fx::testing::add_entry(t, a, addr, size, static_cast<std::int64_t>(t.entries.size()) * 10, where);
  };
  add(TraceAction::alloc, 0x1000, 5 * MiB, "model.py:10:forward");      // 20 MiB segment
  add(TraceAction::alloc, 0x2000, 5 * MiB, "model.py:11:forward");
  add(TraceAction::alloc, 0x3000, 100, "optim.py:3:step");               // 2 MiB small segment
  add(TraceAction::free_completed, 0x2000, 5 * MiB, "model.py:11:forward");
  const fx::ReplayScript s = fx::compile_replay(t);
  fx::ReplayOptions options;
  options.record_timeline = true;
  const fx::PolicyReplay r = run(t, s, "pytorch", options);
  CHECK(r.peak_reserved_bytes == 22 * MiB);
  CHECK(r.peak_step == 2);  // reserved is at its peak from step 2 on; requested is highest there
  CHECK(r.at_peak.requested_bytes == 10 * MiB + 100);
  CHECK(r.at_peak.rounding_bytes == 512 - 100);
  CHECK(r.at_peak.inactive_split_bytes == 10 * MiB + (2 * MiB - 512));
  CHECK(r.at_peak.requested_bytes + r.at_peak.rounding_bytes + r.at_peak.inactive_split_bytes +
            r.at_peak.cached_free_bytes + r.at_peak.partly_used_granule_bytes ==
        r.at_peak.reserved_bytes);
  REQUIRE(r.top_sites.size() == 3);
  CHECK(t.sites[r.top_sites[0].site] == "model.py:10:forward");  // ties by site order
  CHECK(r.top_sites[0].live_bytes == 5 * MiB);
  CHECK(t.sites[r.top_sites[2].site] == "optim.py:3:step");
  CHECK(r.peak_time_us == 20);
  REQUIRE(r.timeline_reserved_bytes.size() == 4);
  CHECK(r.timeline_reserved_bytes[0] == 20 * MiB);
  CHECK(r.timeline_allocated_bytes[3] == 5 * MiB + 512);
  CHECK(r.ratio == double(22 * MiB) / double(10 * MiB + 100));

  fx::ReplayReport report{t, s, fx::TraceFormat::csv, std::nullopt, {r}};
  std::ostringstream csv;
  fx::write_timeline_csv(csv, report);
  const std::string text = csv.str();
  CHECK(text.rfind("step,entry,time_us,action,requested_bytes,pytorch.allocated_bytes,pytorch.reserved_bytes\n", 0) == 0);
  CHECK(text.find("\n3,3,30,free,5242980,5243392,23068672\n") != std::string::npos);

  const std::string table = fx::format_table(report);
  CHECK(table.find("peak reserved / peak requested") != std::string::npos);
  CHECK(table.find("model.py:10:forward") != std::string::npos);
}

TEST_CASE("oom entries are probes: would the policy have served the request?", "[replay]") {
  const fx::Trace t = make_trace({
      {TraceAction::alloc, 0x1000, 40 * MiB},
      {TraceAction::free_completed, 0x1000, 40 * MiB},
      {TraceAction::alloc, 0x2000, 30 * MiB},
      {TraceAction::oom, 0, 50 * MiB},
  });
  const fx::ReplayScript s = fx::compile_replay(t);
  CHECK(s.trace_ooms == 1);
  CHECK(s.peak_requested_bytes == 80 * MiB);  // 30 MiB live + the 50 MiB the program asked for
  fx::ReplayEnvironment env;
  env.memory_limit_bytes = 80 * MiB;
  // PyTorch: 40 MiB cached + 30 MiB... the 30 MiB request is served by the cached 40 MiB block
  // (best fit, split: 10 MiB left), so 50 MiB more passes the cap (40 + 50 > 80) even after
  // freeing unsplit blocks (none): the OOM is reproduced.
  const fx::PolicyReplay torch = fx::replay_policy(t, s, "pytorch", fx::parse_policy_spec("pytorch", env).make);
  CHECK(torch.trace_ooms_served == 0);
  CHECK(torch.counters.alloc_retries == 1);
  CHECK(torch.peak_reserved_bytes == 40 * MiB);
  // Without the cap it is served, and the probe's block is freed at once.
  const fx::PolicyReplay free_run = run(t, s, "pytorch");
  CHECK(free_run.trace_ooms_served == 1);
  CHECK(free_run.peak_allocated_bytes == 40 * MiB);
  CHECK(free_run.peak_reserved_bytes == 90 * MiB);
}

TEST_CASE("gpumem's replay counts the stream synchronizations recycling makes and charges them", "[replay]") {
  // 16 MiB on stream 1, freed: its pieces are wholly free. 16 MiB on stream 0 then grows stream 0's
  // region, and the default moves stream 1's pieces there (buying would pass the memory guard): a
  // piece that changes stream waits for its old stream first, one synchronization.
  const fx::Trace t = make_trace({
      {TraceAction::alloc, 0x1000, 16 * MiB, 1},
      {TraceAction::free_requested, 0x1000, 16 * MiB, 1},
      {TraceAction::free_completed, 0x1000, 16 * MiB, 1},
      {TraceAction::alloc, 0x2000, 16 * MiB, 0},
  });
  const fx::ReplayScript s = fx::compile_replay(t);
  const fx::PolicyReplay moved = run(t, s, "gpumem");
  CHECK(moved.peak_reserved_bytes == 16 * MiB);
  CHECK(moved.counters.maps > moved.counters.creates);  // pieces moved
  CHECK(moved.counters.syncs == 1);
  const fx::PolicyReplay created = run(t, s, "gpumem:recycle:False");
  CHECK(created.peak_reserved_bytes == 32 * MiB);
  CHECK(created.counters.syncs == 0);
  // The synchronization is charged (call_costs.h): 1 ms, beyond the driver calls.
  fx::PolicyCounters calls_only = moved.counters;
  calls_only.syncs = 0;
  CHECK(moved.call_seconds == Approx(fx::call_seconds(calls_only, fx::kH200VmmCosts) + 1e-3));
  // PyTorch's models never unmap while running: no synchronization.
  CHECK(run(t, s, "pytorch:expandable").counters.syncs == 0);
}

TEST_CASE("the provider calls are charged to the requests that made them, by call site and size", "[replay]") {
  fx::Trace t;
  t.source = "handmade";
  auto add = [&](TraceAction a, std::uint64_t addr, std::uint64_t size, std::int64_t time_us, const char* where) {
    fx::testing::add_entry(t, a, addr, size, time_us, where);
  };
  // PyTorch's native model: the first 5 MiB request creates a 20 MiB segment, the second fits in
  // it; each 30 MiB request creates a segment of its own. The trace lasts 30 us: the last request
  // is in its second half.
  add(TraceAction::alloc, 0x1000, 5 * MiB, 0, "model.py:10:forward");
  add(TraceAction::alloc, 0x2000, 30 * MiB, 5, "model.py:20:logits");
  add(TraceAction::alloc, 0x3000, 5 * MiB, 10, "model.py:10:forward");
  add(TraceAction::alloc, 0x4000, 30 * MiB, 30, "model.py:20:logits");
  const fx::ReplayScript s = fx::compile_replay(t);
  const fx::PolicyReplay r = run(t, s, "pytorch");
  REQUIRE(r.counters.creates == 3);
  CHECK(r.call_groups == 2);
  REQUIRE(r.top_call_groups.size() == 2);
  const fx::CallGroup& logits = r.top_call_groups[0];  // the most time first
  CHECK(t.sites[logits.site] == "model.py:20:logits");
  CHECK(logits.size_bytes == 30 * MiB);
  CHECK(logits.steps == 2);
  CHECK(logits.calls.creates == 2);
  CHECK(logits.seconds == Approx(2 * fx::kH200CudaMallocCosts.create_us * 1e-6));
  CHECK(logits.second_half_seconds == Approx(fx::kH200CudaMallocCosts.create_us * 1e-6));
  const fx::CallGroup& forward = r.top_call_groups[1];
  CHECK(t.sites[forward.site] == "model.py:10:forward");
  CHECK(forward.steps == 1);  // the second 5 MiB request made no call
  CHECK(forward.calls.creates == 1);
  CHECK(forward.second_half_seconds == 0);
  CHECK(logits.seconds + forward.seconds == Approx(r.call_seconds));

  fx::ReplayOptions one;
  one.top_call_groups = 1;
  const fx::PolicyReplay r1 = run(t, s, "pytorch", one);
  CHECK(r1.call_groups == 2);
  REQUIRE(r1.top_call_groups.size() == 1);
  CHECK(t.sites[r1.top_call_groups[0].site] == "model.py:20:logits");
  fx::ReplayOptions none;
  none.top_call_groups = 0;
  const fx::PolicyReplay r0 = run(t, s, "pytorch", none);
  CHECK(r0.call_groups == 0);
  CHECK(r0.top_call_groups.empty());
  CHECK(r0.call_seconds == Approx(r.call_seconds));

  // A policy replayed without the groups says so (its time only); one that made no call says that.
  fx::PolicyReplay quiet = r0;
  quiet.policy = "quiet";
  quiet.call_seconds = 0;
  const std::string mixed = fx::format_table(fx::ReplayReport{t, s, fx::TraceFormat::csv, std::nullopt, {r, r0, quiet}});
  CHECK(mixed.find("  pytorch: 113 us in all, not grouped\n") != std::string::npos);  // 3 creates of 37.75 us
  CHECK(mixed.find("  quiet: no calls\n") != std::string::npos);

  fx::ReplayReport report{t, s, fx::TraceFormat::csv, std::nullopt, {r}};
  const std::string table = fx::format_table(report);
  CHECK(table.find("requests whose calls took the most time") != std::string::npos);
  CHECK(table.find("made by 2 group(s)") != std::string::npos);
  CHECK(table.find("30.00 MiB  model.py:20:logits") != std::string::npos);
  const std::string json = fx::format_json(report);
  CHECK(json.find("\"call_groups\": 2") != std::string::npos);
  CHECK(json.find("{\"site\": \"model.py:20:logits\", \"size_bytes\": 31457280, \"steps\": 2, \"creates\": 2") !=
        std::string::npos);
}

TEST_CASE("gpumem's calls, frees and moves included, all reach a call group", "[replay]") {
  // Growth on stream 0 moves the pieces stream 1's freed request left, and a later request of
  // another size grows again: every counted call lands in some group, none twice.
  const fx::Trace t = make_trace({
      {TraceAction::alloc, 0x1000, 16 * MiB, 1},
      {TraceAction::free_requested, 0x1000, 16 * MiB, 1},
      {TraceAction::free_completed, 0x1000, 16 * MiB, 1},
      {TraceAction::alloc, 0x2000, 16 * MiB, 0},
      {TraceAction::alloc, 0x3000, 40 * MiB, 0},
      {TraceAction::free_completed, 0x2000, 16 * MiB, 0},
      {TraceAction::alloc, 0x4000, 8 * MiB, 0},
  });
  const fx::ReplayScript s = fx::compile_replay(t);
  fx::ReplayOptions all;
  all.top_call_groups = 1000;
  const fx::PolicyReplay r = run(t, s, "gpumem", all);
  REQUIRE(r.counters.maps > 0);
  CHECK(r.call_groups == r.top_call_groups.size());
  fx::PolicyCounters sum;
  double seconds = 0;
  for (const fx::CallGroup& g : r.top_call_groups) {
    sum += g.calls;
    seconds += g.seconds;
  }
  CHECK(sum.creates == r.counters.creates);
  CHECK(sum.maps == r.counters.maps);
  CHECK(sum.unmaps == r.counters.unmaps);
  CHECK(sum.releases == r.counters.releases);
  CHECK(sum.syncs == r.counters.syncs);
  CHECK(seconds == Approx(r.call_seconds));
}

TEST_CASE("the JSON output has the fields scripts rely on", "[replay]") {
  const fx::Trace t = make_trace({{TraceAction::alloc, 0x1000, 3 * MiB}, {TraceAction::free_completed, 0x1000, 3 * MiB}});
  const fx::ReplayScript s = fx::compile_replay(t);
  fx::ReplayReport report{t, s, fx::TraceFormat::csv, std::nullopt,
                          {run(t, s, "pytorch"), run(t, s, "pytorch:expandable")}};
  const std::string json = fx::format_json(report);
  for (const char* key : {"\"trace\": \"handmade\"", "\"entries\": 2", "\"skipped_entries\": 0", "\"policies\": [",
                          "\"policy\": \"pytorch\"", "\"policy\": \"pytorch:expandable\"", "\"peak_requested_bytes\": 3145728",
                          "\"peak_allocated_bytes\": 3145728", "\"peak_reserved_bytes\": 20971520", "\"ratio\": 6.66667",
                          "\"segments\": 1", "\"maps\": 1", "\"unmaps\": 0", "\"creates\": 1", "\"releases\": 0",
                          "\"syncs\": 0"}) {
    INFO(key);
    CHECK(json.find(key) != std::string::npos);
  }
  const auto python = fx::testing::python();
  if (python) {
    fx::testing::TempDir dir;
    fx::testing::write_file(dir.file("r.json"), json);
    fx::testing::write_file(dir.file("check.py"),
                            "import json,sys\nd=json.load(open(sys.argv[1]))\n"
                            "assert [p['policy'] for p in d['policies']] == ['pytorch', 'pytorch:expandable']\n"
                            "assert d['policies'][1]['at_peak']['inactive_split_bytes'] == 17825792\n");
    CHECK(fx::testing::run_python(*python, dir.file("check.py"), dir.file("r.json")) == 0);
  }
}

TEST_CASE("policy names: accepted forms and one clear error otherwise", "[replay]") {
  CHECK(fx::parse_policy_spec("pytorch").name == "pytorch");
  CHECK(fx::parse_policy_spec("pytorch:expandable").make()->name() == "pytorch:expandable");
  auto message = [](const char* spec) {
    try {
      fx::parse_policy_spec(spec);
    } catch (const fx::ForensicsError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(message("jemalloc").find("unknown policy 'jemalloc'") != std::string::npos);
  CHECK(message("pytorch:").find("nothing after ':'") != std::string::npos);
  CHECK(message("pytorch:recycle:True").find("'recycle' is not a PYTORCH_CUDA_ALLOC_CONF key") != std::string::npos);
  CHECK(fx::default_policy_names() == std::vector<std::string>{"gpumem", "pytorch", "pytorch:expandable"});
}

namespace {

// A training loop of `steps` identical steps after a persistent block: A (100 MiB, the marker),
// B (50 MiB), free A, C (30 MiB), free B, free C.
fx::Trace repeating_steps(int steps) {
  fx::Trace t;
  t.source = "handmade";
  std::int64_t now = 0;
  auto add = [&](TraceAction a, std::uint64_t addr, std::uint64_t size) {
    fx::testing::add_entry(t, a, addr, size, now += 100, "train.py:1:step");
  };
  add(TraceAction::alloc, 0x100000, 400 * MiB);  // the weights, live throughout
  for (int s = 0; s < steps; ++s) {
    const std::uint64_t base = 0x10000000 + static_cast<std::uint64_t>(s) * 0x1000000;
    add(TraceAction::alloc, base + 0x1000, 100 * MiB);
    add(TraceAction::alloc, base + 0x2000, 50 * MiB);
    add(TraceAction::free_completed, base + 0x1000, 100 * MiB);
    add(TraceAction::alloc, base + 0x3000, 30 * MiB);
    add(TraceAction::free_completed, base + 0x2000, 50 * MiB);
    add(TraceAction::free_completed, base + 0x3000, 30 * MiB);
  }
  return t;
}

}  // namespace

TEST_CASE("step marks: the first marker request and every per_step-th after it", "[replay][plan]") {
  const fx::Trace t = repeating_steps(6);
  fx::ReplayScript s = fx::compile_replay(t);
  CHECK(fx::mark_steps(s, 100 * MiB, 1) == 6);
  CHECK(std::count_if(s.steps.begin(), s.steps.end(), [](const fx::ReplayStep& x) { return x.step_start; }) == 6);
  CHECK(s.steps[1].step_start);  // the first step's first request (step 0 is the weights)
  CHECK_FALSE(s.steps[0].step_start);
  CHECK(fx::mark_steps(s, 100 * MiB, 4) == 2);  // requests 0 and 4 of that size; earlier marks cleared
  CHECK(std::count_if(s.steps.begin(), s.steps.end(), [](const fx::ReplayStep& x) { return x.step_start; }) == 2);
  CHECK(fx::mark_steps(s, 77, 1) == 0);
  CHECK_THROWS_AS(fx::mark_steps(s, 0, 1), fx::ForensicsError);
  CHECK_THROWS_AS(fx::mark_steps(s, 100 * MiB, 0), fx::ForensicsError);
}

TEST_CASE("gpumem+plan serves the steps that repeat from one arena, with no call after the switch", "[replay][plan]") {
  const fx::Trace t = repeating_steps(8);
  fx::ReplayScript s = fx::compile_replay(t);
  REQUIRE(fx::mark_steps(s, 100 * MiB, 1) == 8);
  const fx::PolicyReplay plain = run(t, s, "gpumem:step_plan:False");
  const fx::PolicyReplay plan = run(t, s, "gpumem+plan");
  CHECK(plain.notes.empty());
  INFO(plan.notes);
  // The default has the planner: the same replay as gpumem+plan.
  const fx::PolicyReplay by_default = run(t, s, "gpumem");
  CHECK(by_default.notes == plan.notes);
  CHECK(by_default.peak_reserved_bytes == plan.peak_reserved_bytes);
  CHECK(by_default.counters.maps == plan.counters.maps);
  // Steps 1 and 2 are recorded and equal: the plan is made at the third mark and serves steps 3..8
  // (the trough is the step's start, where nothing planned is live); steps 3..7 end at a mark.
  CHECK(plan.notes.find("8 step mark(s), 1 plan(s), 1 arena(s) mapped, 0 fallback(s); 18 allocations and 5 whole "
                        "steps served from the arena") != std::string::npos);
  // A and B live together (150 MiB); C reuses A's place.
  CHECK(plan.notes.find("last plan: arena 0.146 GiB for 0.146 GiB live at most") != std::string::npos);
  CHECK(plan.notes.find("the calls after it took 0.0 ms") != std::string::npos);
  // The arena takes the place of the engine's cache: the peak is the weights and one step's
  // blocks, in 2 MiB granules, whichever serves them.
  CHECK(plan.peak_reserved_bytes <= plain.peak_reserved_bytes + 2 * MiB);
  CHECK(plan.peak_reserved_bytes >= 550 * MiB);
  CHECK(plan.failed_allocations == 0);
  // Without marks, steps of 6 events are shorter than detection looks for (min_step_events): the
  // engine alone, the same replay as gpumem.
  const fx::ReplayScript unmarked = fx::compile_replay(t);
  const fx::PolicyReplay blind = run(t, unmarked, "gpumem+plan");
  CHECK(blind.peak_reserved_bytes == plain.peak_reserved_bytes);
  CHECK(blind.counters.maps == plain.counters.maps);
  CHECK(blind.notes.find("step plan: 0 step(s) found, 0 plan(s)") != std::string::npos);  // too short to detect
}

TEST_CASE("recycle_churn (on by default): a replay that never churns is the same with it off, and says nothing",
          "[replay][churn]") {
  const fx::Trace t = repeating_steps(4);
  const fx::ReplayScript s = fx::compile_replay(t);
  const fx::PolicyReplay on = run(t, s, "gpumem");
  const fx::PolicyReplay off = run(t, s, "gpumem:recycle_churn:0");
  // Nothing here moves pieces twice in 0.1 s: the allowance never opens, so no note of it, and the
  // replay is the one without the key. (The shipped oom trace opens it: the next case.) The step
  // planner's note is there in both (steps of 6 events: too short for it to find).
  CHECK(on.notes.find("churn") == std::string::npos);
  CHECK(off.notes.find("churn") == std::string::npos);
  CHECK(on.notes == off.notes);
  CHECK(on.peak_reserved_bytes == off.peak_reserved_bytes);
  CHECK(on.counters.maps == off.counters.maps);
  CHECK(on.counters.unmaps == off.counters.unmaps);
}

TEST_CASE("recycle_churn (on by default) on the shipped oom trace: it opens once, and trades moves for memory",
          "[replay][churn]") {
  // A program that runs out of memory moves the same pieces over and over near its end (22% of its
  // time in driver calls without the allowance): the default opens the allowance there and buys
  // memory instead (docs/notes/allocation-policy.md, "The churn allowance").
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  const fx::Trace t = fx::load_trace(std::string(src ? src : ".") + "/traces/oom.native.trace.csv.gz").trace;
  const fx::ReplayScript s = fx::compile_replay(t);
  const fx::PolicyReplay on = run(t, s, "gpumem");
  const fx::PolicyReplay off = run(t, s, "gpumem:recycle_churn:0");
  CHECK(on.notes.rfind("churn allowance: opened 1 time(s)", 0) == 0);
  CHECK(off.notes.find("churn") == std::string::npos);
  // Fewer moves for more memory, at most the allowance's 10 points of the footprint more.
  CHECK(on.counters.maps < off.counters.maps);
  CHECK(on.counters.unmaps < off.counters.unmaps);
  CHECK(on.peak_reserved_bytes >= off.peak_reserved_bytes);
  CHECK(on.peak_reserved_bytes <= off.peak_reserved_bytes + off.peak_reserved_bytes / 10);
  CHECK(on.failed_allocations == 0);
}

TEST_CASE("gpumem+plan falls back to the engine at a step that differs", "[replay][plan]") {
  fx::Trace t = repeating_steps(6);
  // The fifth step's C is 31 MiB instead of 30: the planner stops serving there.
  for (auto& e : t.entries)
    if (e.addr == 0x10000000 + 4 * 0x1000000 + 0x3000) e.size_bytes = 31 * MiB;
  fx::ReplayScript s = fx::compile_replay(t);
  REQUIRE(fx::mark_steps(s, 100 * MiB, 1) == 6);
  const fx::PolicyReplay plan = run(t, s, "gpumem+plan");
  INFO(plan.notes);
  CHECK(plan.failed_allocations == 0);
  CHECK(plan.notes.find("1 fallback(s)") != std::string::npos);
  CHECK(plan.notes.find("where the plan has 31457280 bytes on stream 0") != std::string::npos);
}
