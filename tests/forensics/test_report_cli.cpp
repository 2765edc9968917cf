// `gpumem report` and `gpumem diff` on the command line: help, usage errors, exit statuses, the
// OOM report on PyTorch's snapshot in text and JSON, and a diff of two files.
#include <cstdio>
#include <string>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/snapshot_writer.h"
#include "run_command.h"

using gpumem::forensics::testing::TempDir;

namespace {

using Run = gpumem::testing::CommandRun;
using gpumem::testing::run_cli;

std::string oom_snapshot() {
  auto dir = gpumem::forensics::testing::shared_dir();
  return dir ? *dir + "/traces/native/oom.snapshot.pickle" : std::string();
}

}  // namespace

TEST_CASE("gpumem report and diff explain their options and name bad arguments", "[cli]") {
  Run r = run_cli("--help");
  CHECK(r.out.find("report") != std::string::npos);
  CHECK(r.out.find("diff") != std::string::npos);
  r = run_cli("report --help");
  CHECK(r.status == 0);
  for (const char* opt : {"--json", "--top", "--device", "--no-replay", "--at", "verdict", "undone"}) {
    INFO(opt);
    CHECK(r.out.find(opt) != std::string::npos);
  }
  r = run_cli("diff --help");
  CHECK(r.status == 0);
  CHECK(r.out.find("segments added and removed") != std::string::npos);

  r = run_cli("report");
  CHECK(r.status == 2);
  CHECK(r.out.find("no file given") != std::string::npos);
  r = run_cli("report a b");
  CHECK(r.status == 2);
  r = run_cli("report x --top many");
  CHECK(r.status == 2);
  CHECK(r.out.find("--top") != std::string::npos);
  r = run_cli("report x --bogus");
  CHECK(r.status == 2);
  CHECK(r.out.find("--bogus") != std::string::npos);
  r = run_cli("report /nonexistent/file.pickle");
  CHECK(r.status == 1);
  CHECK(r.out.find("/nonexistent/file.pickle") != std::string::npos);
  r = run_cli("diff onlyone");
  CHECK(r.status == 2);
  CHECK(r.out.find("two files") != std::string::npos);
}

TEST_CASE("gpumem report on PyTorch's OOM snapshot, text and JSON", "[cli][traces]") {
  const std::string snap = oom_snapshot();
  if (snap.empty()) GPUMEM_SKIP("GPUMEM_SHARED_DIR with traces/ not set");
  Run r = run_cli("report '" + snap + "' --no-replay");
  CHECK(r.status == 0);
  CHECK(r.out.find("verdict fragmentation") != std::string::npos);
  CHECK(r.out.find("200.00 MiB") != std::string::npos);
  CHECK(r.out.find("692.00 MiB") != std::string::npos);
  r = run_cli("report '" + snap + "' --json --no-replay --top 3");
  CHECK(r.status == 0);
  for (const char* key : {"\"verdict\":\"fragmentation\"", "\"request_bytes\":209715200",
                          "\"reserved_unallocated_bytes\":725614592", "\"largest_free_extent_bytes\":205520896",
                          "\"top_ops\":", "\"top_sites\":"}) {
    INFO(key);
    CHECK(r.out.find(key) != std::string::npos);
  }
}

TEST_CASE("gpumem diff of a snapshot and its JSON copy shows no change; of two files, the change", "[cli][traces]") {
  const std::string snap = oom_snapshot();
  if (snap.empty()) GPUMEM_SKIP("GPUMEM_SHARED_DIR with traces/ not set");
  TempDir dir;
  const auto s = gpumem::forensics::load_snapshot(snap);
  gpumem::forensics::write_snapshot(s, dir.file("copy.json"));
  Run r = run_cli("diff '" + snap + "' '" + dir.file("copy.json") + "' --json");
  CHECK(r.status == 0);
  CHECK(r.out.find("\"ops\":[]") != std::string::npos);
  CHECK(r.out.find("\"segments_added\":[]") != std::string::npos);
  // The CSV of the same run (segments rebuilt at its OOM) has the same segments, but its call
  // sites are named after the capture script: the diff moves the bytes between the sites.
  auto dir2 = gpumem::forensics::testing::shared_dir();
  r = run_cli("diff '" + snap + "' '" + *dir2 + "/traces/native/oom.trace.csv.gz'");
  CHECK(r.status == 0);
  CHECK(r.out.find("segments added (0)") != std::string::npos);
  CHECK(r.out.find("segments removed (0)") != std::string::npos);
  CHECK(r.out.find("capture.py:112:oom") != std::string::npos);
  CHECK(r.out.find("oom_repro.py:112:oom") != std::string::npos);
}
