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

std::string shipped_trace() {
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  return std::string(src ? src : ".") + "/traces/resnet50.native.trace.csv.gz";
}

}  // namespace

TEST_CASE("gpumem --help lists the commands; gpumem replay --help explains every option", "[cli]") {
  Run r = run_cli("--help");
  CHECK(r.status == 0);
  CHECK(r.out.find("replay") != std::string::npos);
  r = run_cli("replay --help");
  CHECK(r.status == 0);
  for (const char* opt : {"--policy", "--json", "--timeline", "--top", "--device", "--memory-limit", "--device-memory",
                          "pytorch:expandable", "gpumem:CONF", "progress bar"}) {
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
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const Run r = run_cli(c.args);
    CHECK(r.status == c.status);
    CHECK(r.out.find(c.says) != std::string::npos);
    // One error: one message (the unknown-policy one lists the accepted policies after it).
    const auto lines = std::count(r.out.begin(), r.out.end(), '\n');
    CHECK(lines <= (c.args.find("tcmalloc") != std::string::npos ? 8 : 1));
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
