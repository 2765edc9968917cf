// The `gpumem` command line: help for every option, one clear error per bad argument, exit
// statuses, and a replay of the trace shipped in the project (table and JSON).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "catch.h"
#include "forensics_test_support.h"
#include "run_command.h"

namespace {

using Run = gpumem::testing::CommandRun;
using gpumem::testing::run_cli;

std::string shipped_trace(const char* name = "resnet50") {
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  return std::string(src ? src : ".") + "/traces/" + name + ".native.trace.csv.gz";
}

}  // namespace

TEST_CASE("gpumem --help lists the commands; gpumem replay --help explains every option", "[cli]") {
  Run r = run_cli("--help");
  CHECK(r.status == 0);
  CHECK(r.out.find("replay") != std::string::npos);
  r = run_cli("replay --help");
  CHECK(r.status == 0);
  for (const char* opt : {"--policy", "--json", "--timeline", "--top", "--device", "--memory-limit", "--device-memory",
                          "pytorch:expandable", "gpumem:CONF", "progress bar", "gpumem+plan", "--step-marker",
                          "--per-step"}) {
    INFO(opt);
    CHECK(r.out.find(opt) != std::string::npos);
  }
  CHECK(run_cli("").status == 2);
}

TEST_CASE("every bad argument gets one clear error", "[cli]") {
  const std::string trace = shipped_trace();
  struct Case {
    std::string args;
    int status;
    const char* says;
  };
  const Case cases[] = {
      {"frobnicate", 2, "unknown command 'frobnicate'"},
      {"replay", 2, "no trace given"},
      {"replay a b", 2, "one trace at a time"},
      {"replay " + trace + " --bogus", 2, "unknown option '--bogus'"},
      {"replay " + trace + " --policy", 2, "--policy needs a value"},
      {"replay " + trace + " --policy tcmalloc", 2, "unknown policy 'tcmalloc'"},
      {"replay " + trace + " --top many", 2, "--top takes a count"},
      {"replay " + trace + " --memory-limit lots", 2, "--memory-limit takes a size"},
      {"replay " + trace + " --json=yes", 2, "--json takes no value"},
      {"replay " + trace + " --device 1", 1, "--device 1 does not apply"},
      {"replay /nonexistent/trace.csv.gz", 1, "cannot open"},
      {"replay " + trace + " --per-step 2", 2, "give --step-marker BYTES too"},
      {"replay " + trace + " --step-marker 0", 2, "--step-marker takes a request size"},
      {"replay " + trace + " --policy pytorch --policy gpumem:step_plan:False --step-marker 314453136", 2,
       "add --policy gpumem"},
      {"replay " + trace + " --policy gpumem+plan --step-marker 12345", 1, "makes no request of exactly that many"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const Run r = run_cli(c.args);
    CHECK(r.status == c.status);
    CHECK(r.out.find(c.says) != std::string::npos);
    // One error: one message (the unknown-policy one lists the accepted policies after it).
    const auto lines = std::count(r.out.begin(), r.out.end(), '\n');
    CHECK(lines <= (c.args.find("tcmalloc") != std::string::npos ? 11 : 1));
  }
}

TEST_CASE("replay of the shipped trace: table, JSON and timeline", "[cli]") {
  const std::string trace = shipped_trace();
  Run r = run_cli("replay " + trace + " --policy pytorch --policy pytorch:expandable");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("peak reserved / peak requested") != std::string::npos);
  CHECK(r.out.find("1.237") != std::string::npos);  // PyTorch 2.11 measured 1.237 on this run
  CHECK(r.out.find("1.010") != std::string::npos);  // and 1.010 with expandable segments
  CHECK(r.out.find("PyTorch measured") != std::string::npos);
  CHECK(r.out.find("\r") == std::string::npos);  // no progress bar when stderr is not a terminal

  gpumem::forensics::testing::TempDir dir;
  const std::string timeline = dir.file("timeline.csv");
  r = run_cli("replay " + trace + " --policy pytorch --json --top 2 --timeline " + timeline);
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("{\"trace\": ", 0) == 0);
  CHECK(r.out.find("\"peak_reserved_bytes\": 7493124096") != std::string::npos);
  CHECK(r.out.find("\"skipped_entries\": 0") != std::string::npos);
  const std::string csv = gpumem::forensics::testing::read_file(timeline);
  CHECK(csv.rfind("step,entry,time_us,action,requested_bytes,pytorch.allocated_bytes,pytorch.reserved_bytes\n", 0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 18265 + 17779);
}

TEST_CASE("replay of the shipped trace with a step planner: every step after the plan served, no call after the switch",
          "[cli]") {
  const std::string trace = shipped_trace();
  // resnet50's first activation (314,453,136 bytes) is allocated once per step.
  // The default gpumem policy has the planner; step_plan:False is the engine alone.
  const Run r =
      run_cli("replay " + trace + " --policy gpumem:step_plan:False --policy gpumem --step-marker 314453136 --top 0");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("step marks: 23 step(s) start at a request of 314453136 bytes") != std::string::npos);
  CHECK(r.out.find("gpumem: step plan: 23 step mark(s), 1 plan(s), 1 arena(s) mapped, 0 fallback(s)") !=
        std::string::npos);
  CHECK(r.out.find("18 whole steps served from the arena") != std::string::npos);
  CHECK(r.out.find("the calls after it took 0.0 ms") != std::string::npos);
  // Without the planner, nothing about it.
  CHECK(r.out.find("gpumem:step_plan:False: step plan") == std::string::npos);
}

TEST_CASE("replay prints under the table when the churn allowance opened", "[cli][churn]") {
  // The allowance's counts are test_replay's; here, that the command says it, for the policy whose
  // allowance opened and for no other.
  const Run r = run_cli("replay " + shipped_trace("oom") + " --policy gpumem --policy gpumem:recycle_churn:0 --top 0");
  REQUIRE(r.status == 0);
  INFO(r.out);
  CHECK(r.out.find("\ngpumem: churn allowance: opened 1 time(s)") != std::string::npos);
  CHECK(r.out.find("gpumem:recycle_churn:0: churn allowance") == std::string::npos);
}
