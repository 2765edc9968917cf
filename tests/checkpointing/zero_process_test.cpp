// ZeRO with real processes over c10d's ProcessGroupGloo, launched the way torchrun launches
// them (rank_launcher.h): every stage, gradient accumulation, frozen parameters and parameter
// groups train to what single-process training gives; per-rank model-state bytes match the ZeRO
// formulas; and a rank that throws, dies, stalls or never joins makes every rank end with an
// error naming it, within a bounded time (the launcher's deadline is only the last resort).
#include "rank_launcher.h"
#include "zero_process_cases.h"
#include "zero_test_helpers.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gpumem/zero/distributed_context.h>

#include <cmath>
#include <cstdio>
#include <map>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using namespace gpumem::zero;
using namespace gpumem::zero::testing;
using namespace std::chrono_literals;

namespace {

LaunchSpec worker(int world, std::vector<std::string> args, bool agent_store = true) {
  LaunchSpec spec;
  spec.program = GPUMEM_ZERO_RANK_WORKER;
  spec.args = std::move(args);
  spec.args.insert(spec.args.end(), {"--out", "{dir}"});
  spec.world_size = world;
  spec.agent_store = agent_store;
  spec.deadline = 180s;
  return spec;
}

struct LaunchDir {
  std::string dir;
  ~LaunchDir() { remove_launch_dir(dir); }
};

LaunchSpec failure_run(int world, const std::string& scenario, int rank, int step,
                       long long timeout_ms, long long grace_ms,
                       long long rendezvous_timeout_ms = 60000) {
  LaunchSpec spec = worker(world, {"--scenario", scenario, "--rank-at", std::to_string(rank),
                                   "--step", std::to_string(step), "--timeout-ms",
                                   std::to_string(timeout_ms), "--grace-ms",
                                   std::to_string(grace_ms), "--rendezvous-timeout-ms",
                                   std::to_string(rendezvous_timeout_ms)});
  spec.deadline = 90s;  // far beyond the bound the checks below assert
  return spec;
}

}  // namespace

TEST_CASE("Gloo processes: every case equals single-process training, memory per rank matches "
          "the ZeRO formulas",
          "[zero][process]") {
  if (!gloo_available()) FAIL("gpumem was built without Gloo's headers: install libgloo-dev");
  at::set_num_threads(1);
  const std::vector<Batch> batches = process_batches();
  const std::vector<ProcessCase> cases = process_cases();
  std::map<std::string, NamedTensors> reference;
  for (const ProcessCase& c : cases) {
    if (c.check_params) reference[c.name] = train_reference_case(c, batches);
  }
  // The comparisons mean something: training moved the parameters far beyond the tolerance and
  // groups changed the result; three micro-batches of loss / 3 are the full batch's gradient.
  const NamedTensors initial = [] {
    ToyNet net = make_toy_net(kProcessSeed);
    NamedTensors out;
    for (const auto& item : net->named_parameters())
      out.emplace_back(item.key(), item.value().detach().clone());
    return out;
  }();
  CHECK(compare(reference.at("stage0"), initial, 0, 0).max_abs > 0.05);
  CHECK(compare(reference.at("accumulate3_stage0"), reference.at("stage0"), 2e-5, 1e-4)
            .max_violation == 0);
  CHECK(compare(reference.at("param_groups_stage1"), reference.at("stage0"), 0, 0).max_abs > 1e-3);

  // Two ranks under a torchrun-style agent store, four with rank 0 serving the store.
  for (const auto& [world, agent_store] : {std::pair{2, true}, std::pair{4, false}}) {
    INFO(world << " processes, " << (agent_store ? "agent store" : "rank 0 serves the store"));
    const LaunchResult run = launch(worker(world, {"--scenario", "train"}, agent_store));
    LaunchDir cleanup{run.dir};
    std::printf("%d Gloo processes trained %zu cases in %.1f s (%s)\n", world, cases.size(),
                run.seconds, agent_store ? "agent store" : "rank 0 serves the store");
    INFO(run.describe());
    REQUIRE_FALSE(run.deadline_hit);
    for (const RankExit& e : run.ranks) REQUIRE(e.exit_code == 0);

    std::map<int, double> total_by_stage;
    for (const ProcessCase& c : cases) {
      INFO("case " << c.name);
      if (c.check_params) {
        const NamedTensors got = read_params(fmt::format("{}/{}.params", run.dir, c.name));
        const Difference d = compare(got, reference.at(c.name), 2e-5, 1e-4);
        INFO("max |processes - reference| = " << d.max_abs << " (worst: " << d.worst_param << ")");
        CHECK(d.max_violation == 0);
        for (const std::string& name : c.frozen) {  // frozen parameters did not move
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (got[i].first == name) CHECK(at::equal(got[i].second, initial[i].second));
          }
        }
      }
      if (c.check_memory) {
        for (int r = 0; r < world; ++r) {
          const RankStateRecord rec =
              read_rank_state(fmt::format("{}/{}.rank{}.txt", run.dir, c.name, r));
          const double formula = rec.expected.total_bytes();
          const double allocator_error = std::abs(rec.allocator_live_bytes - formula) / formula;
          INFO("rank " << r << "\n"
                       << format_model_state_table(rec.measured, rec.expected)
                       << "allocator live bytes " << rec.allocator_live_bytes);
          CHECK(max_relative_error(rec.measured, rec.expected) <= 0.05);
          CHECK(allocator_error <= 0.05);
          if (r == 0) {
            std::printf("  %s, %d ranks, rank 0: %.0f B held (trainer), %.0f B allocated and "
                        "alive (allocator), formula %.0f B (%+.2f%%)\n",
                        c.name.c_str(), world, rec.measured.total_bytes(),
                        rec.allocator_live_bytes, formula,
                        (rec.allocator_live_bytes - formula) / formula * 100);
            total_by_stage[c.options.stage] = rec.measured.total_bytes();
          }
        }
      }
    }
    // Each stage holds less than the one before.
    CHECK(total_by_stage.at(1) < total_by_stage.at(0));
    CHECK(total_by_stage.at(2) < total_by_stage.at(1));
    CHECK(total_by_stage.at(3) < total_by_stage.at(2));
  }
}

TEST_CASE("Gloo processes: a rank that throws ends every rank with its reason",
          "[zero][process][failure]") {
  if (!gloo_available()) FAIL("gpumem was built without Gloo's headers: install libgloo-dev");
  const LaunchResult run = launch(failure_run(4, "fail", 2, 3, 4000, 8000));
  LaunchDir cleanup{run.dir};
  std::printf("rank 2 throws: every rank ended after %.1f s; rank 0 says:\n%s", run.seconds,
              run.ranks[0].err.c_str());
  INFO(run.describe());
  REQUIRE_FALSE(run.deadline_hit);
  CHECK(run.seconds < 30);
  CHECK(run.ranks[2].exit_code == 1);
  CHECK(contains(run.ranks[2].err, "injected failure on rank 2 at step 3"));
  for (int r : {0, 1, 3}) {
    INFO("rank " << r);
    CHECK(run.ranks[r].exit_code == 1);
    CHECK(contains(run.ranks[r].err, "rank " + std::to_string(r) + " of 4 failed"));
    // The first report names the cause.
    CHECK(contains(run.ranks[r].err, "1. rank 2: injected failure on rank 2 at step 3"));
  }
}

TEST_CASE("Gloo processes: a rank that dies without a word is named by the others",
          "[zero][process][failure]") {
  if (!gloo_available()) FAIL("gpumem was built without Gloo's headers: install libgloo-dev");
  const LaunchResult run = launch(failure_run(3, "crash", 1, 2, 4000, 8000));
  LaunchDir cleanup{run.dir};
  std::printf("rank 1 dies: every rank ended after %.1f s; rank 0 says:\n%s", run.seconds,
              run.ranks[0].err.c_str());
  INFO(run.describe());
  REQUIRE_FALSE(run.deadline_hit);
  CHECK(run.seconds < 30);
  CHECK(run.ranks[1].exit_code == 9);
  for (int r : {0, 2}) {
    INFO("rank " << r);
    CHECK(run.ranks[r].exit_code == 1);
    CHECK(contains(run.ranks[r].err, "ranks that reported no failure: 1 "));
  }
}

TEST_CASE("Gloo processes: a stalled rank times the others out and its watchdog ends it",
          "[zero][process][failure]") {
  if (!gloo_available()) FAIL("gpumem was built without Gloo's headers: install libgloo-dev");
  // Rank 0 sleeps ten minutes before a step: ranks 1 and 2 time out in their collective after
  // 3 s and report; 4 s after the first report rank 0's watchdog ends it.
  const LaunchResult run = launch(failure_run(3, "stall", 0, 2, 3000, 4000));
  LaunchDir cleanup{run.dir};
  std::printf("rank 0 stalls: every rank ended after %.1f s; ranks 0 and 1 say:\n%s%s",
              run.seconds, run.ranks[0].err.c_str(), run.ranks[1].err.c_str());
  INFO(run.describe());
  REQUIRE_FALSE(run.deadline_hit);
  CHECK(run.seconds < 40);
  CHECK(run.ranks[0].exit_code == 3);
  CHECK(contains(run.ranks[0].err, "ended by the watchdog"));
  for (int r : {1, 2}) {
    INFO("rank " << r);
    CHECK(run.ranks[r].exit_code == 1);
    CHECK(contains(run.ranks[r].err, "ranks that reported no failure: 0"));
  }
}

TEST_CASE("Gloo processes: a rank that never joins fails the rendezvous within the timeout",
          "[zero][process][failure]") {
  if (!gloo_available()) FAIL("gpumem was built without Gloo's headers: install libgloo-dev");
  const LaunchResult run = launch(failure_run(2, "absent", 1, 0, 3000, 8000, 3000));
  LaunchDir cleanup{run.dir};
  std::printf("rank 1 never joins: rank 0 ended after %.1f s; it says:\n%s", run.seconds,
              run.ranks[0].err.c_str());
  INFO(run.describe());
  REQUIRE_FALSE(run.deadline_hit);
  CHECK(run.seconds < 30);
  CHECK(run.ranks[0].exit_code == 1);
  CHECK(contains(run.ranks[0].err, "could not connect ProcessGroupGloo to the other 1 rank(s)"));
  CHECK_FALSE(contains(run.ranks[0].err, "Exception raised from"));  // no libtorch backtrace
}
