// ViewerModel: series, peaks, OOM, checkpointed state_at, snapshot opening.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "catch.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/snapshot_writer.h"
#include "gpumem/view/live_groups.h"
#include "gpumem/view/render.h"
#include "gpumem/view/view_state.h"
#include "gpumem/view/summary.h"
#include "gpumem/view/text_report.h"
#include "gpumem/view/viewer_model.h"
#include "viewer_test_support.h"

using namespace gpumem::view;
using namespace gpumem::view::testing;

namespace {

// A random trace of n entries: allocations and frees in one big segment.
Trace random_trace(std::size_t n, unsigned seed) {
  Trace t;
  std::mt19937_64 rng(seed);
  add(t, TraceAction::segment_alloc, kSeg1, 1024 * kMiB, 0);
  std::vector<std::uint64_t> live;
  std::uint64_t next = kSeg1;
  while (t.entries.size() < n) {
    const auto now = static_cast<std::int64_t>(t.entries.size());
    if (!live.empty() && (rng() % 2 == 0 || next > kSeg1 + 1000 * kMiB)) {
      const std::size_t k = rng() % live.size();
      add(t, TraceAction::free_completed, live[k], 1000, now, "f.py:1:free");
      live.erase(live.begin() + static_cast<long>(k));
    } else {
      add(t, TraceAction::alloc, next, 1000, now, rng() % 2 ? "a.py:1:x" : "b.py:2:y");
      live.push_back(next);
      next += 1024;
    }
  }
  return t;
}

// A large-pool segment of a snapshot at addr with these blocks.
gpumem::forensics::SnapshotSegment large_segment(std::uint64_t addr, std::uint64_t total_bytes,
                                                 std::uint64_t allocated_bytes,
                                                 std::vector<gpumem::forensics::SnapshotBlock> blocks) {
  gpumem::forensics::SnapshotSegment seg;
  seg.address = addr;
  seg.total_size_bytes = total_bytes;
  seg.allocated_size_bytes = allocated_bytes;
  seg.segment_type = "large";
  seg.blocks = std::move(blocks);
  return seg;
}

}  // namespace

TEST_CASE("series, peaks and the OOM of the handmade trace", "[viewer][model]") {
  const auto m = ViewerModel::from(handmade_trace());
  REQUIRE(m.entry_count() == 9);
  CHECK(m.reserved_at(0) == 0);
  CHECK(m.reserved_at(1) == 8 * kMiB);
  CHECK(m.allocated_at(4) == 6 * kMiB);
  CHECK(m.allocated_at(6) == 5 * kMiB);
  CHECK(m.peak_reserved_cursor() == 7);
  CHECK(m.peak_allocated_cursor() == 8);
  REQUIRE(m.oom_cursor());
  CHECK(*m.oom_cursor() == 9);
  CHECK(m.initial_cursor() == 9);
  const Summary s = summarize(m, m.state_at(9), 9);
  CHECK(s.reserved_unallocated_bytes == 3 * kMiB);
  CHECK(s.largest_free_extent_bytes == 2 * kMiB);
  REQUIRE(s.oom);
  CHECK(s.oom->requested_bytes == 5 * kMiB / 2);
  CHECK(s.verdict.rfind("FRAGMENTATION", 0) == 0);
}

TEST_CASE("state_at from checkpoints equals a replay from the start", "[viewer][model]") {
  const std::size_t n = 3 * kCheckpointEvery + 123;
  const auto t = random_trace(n, 7);
  const auto m = ViewerModel::from(t);
  MemoryState replay;
  for (std::size_t k = 0; k <= n; ++k) {
    if (k % 97 == 0 || k % kCheckpointEvery <= 1 || k == n) {
      const MemoryState s = m.state_at(k);
      REQUIRE(s.check_invariants());
      CHECK(s.allocated_bytes == replay.allocated_bytes);
      CHECK(s.blocks.size() == replay.blocks.size());
      CHECK(s.allocated_bytes == m.allocated_at(k));
      CHECK(s.reserved_bytes == m.reserved_at(k));
    }
    if (k < n) replay.apply(t.entries[k], k);
  }
}

TEST_CASE("a missing file is one clear error", "[viewer][model]") {
  CHECK_THROWS_AS(ViewerModel::open("/nonexistent/trace.csv.gz"), gpumem::forensics::ForensicsError);
}

TEST_CASE("the shared OOM snapshot opens on PyTorch's own numbers", "[viewer][model][shared]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  const auto m = ViewerModel::open(*dir + "/traces/native/oom.snapshot.pickle");
  m.wait_for_oom_report();
  REQUIRE(m.is_snapshot());
  REQUIRE(m.oom_cursor());
  CHECK(m.initial_cursor() == *m.oom_cursor());
  const Summary s = summarize(m, m.state_at(m.initial_cursor()), m.initial_cursor());
  REQUIRE(s.oom);
  // oom.json: "Tried to allocate 200.00 MiB ... 692.00 MiB is reserved by PyTorch but unallocated."
  CHECK(s.oom->requested_bytes == 200 * kMiB);
  CHECK(s.reserved_unallocated_bytes == 692 * kMiB);
  CHECK(s.reserved_bytes == m.snapshot_totals()->reserved_bytes);
  CHECK(s.allocated_bytes == m.snapshot_totals()->allocated_bytes);
  CHECK(s.largest_free_extent_bytes < s.oom->requested_bytes);
  CHECK(s.verdict.rfind("FRAGMENTATION", 0) == 0);
  // The verdict is the forensics OOM report's.
  REQUIRE(m.oom_report());
  CHECK(m.oom_report()->verdict == "fragmentation");
  CHECK(m.oom_report()->request_bytes == 200 * kMiB);
  CHECK_FALSE(s.advice.empty());
  CHECK(s.verdict_source.find("forensics") != std::string::npos);
}

TEST_CASE("the shared OOM trace in CSV opens on the same verdict", "[viewer][model][shared]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  const auto m = ViewerModel::open(*dir + "/traces/native/oom.trace.csv.gz");
  m.wait_for_oom_report();
  REQUIRE(m.oom_cursor());
  REQUIRE(m.oom_report());
  CHECK(m.oom_report()->verdict == "fragmentation");
  const Summary s = summarize(m, m.state_at(*m.oom_cursor()), *m.oom_cursor());
  CHECK(s.reserved_bytes == 8579448832ull);  // the snapshot's segments at the OOM (gpumem report)
  // Its blocks are sized as the report's rebuilt segments size them, so the viewer's allocated
  // bytes at the OOM are the report's of the same CSV and the pickle's of the same run.
  const auto report = gpumem::forensics::build_report(gpumem::forensics::load_snapshot(*dir + "/traces/native/oom.trace.csv.gz"));
  CHECK(s.allocated_bytes == report.fragmentation.allocated_bytes);
  const auto pickle = ViewerModel::open(*dir + "/traces/native/oom.snapshot.pickle");
  CHECK(s.allocated_bytes == pickle.allocated_at(*pickle.oom_cursor()));
}

TEST_CASE("a CSV trace's blocks get PyTorch's split rule: a remainder of at most 1 MiB stays in the block",
          "[viewer][model]") {
  Trace t;
  add(t, TraceAction::segment_alloc, kSeg1, 20 * kMiB, 0);
  add(t, TraceAction::alloc, kSeg1, 19 * kMiB + kMiB / 2, 1, "a.py:1:x");         // 0.5 MiB left: whole segment
  add(t, TraceAction::segment_alloc, kSeg1 + 64 * kMiB, 20 * kMiB, 2);
  add(t, TraceAction::alloc, kSeg1 + 64 * kMiB, 10 * kMiB + 100, 3, "a.py:2:y");  // split: rounded to 512 B
  const auto m = ViewerModel::from(t);
  CHECK(m.allocated_at(2) == 20 * kMiB);
  CHECK(m.allocated_at(4) == 20 * kMiB + 10 * kMiB + 512);
  // Without segment entries nothing can be rebuilt: requests rounded to 512 B.
  Trace bare;
  add(bare, TraceAction::alloc, kSeg1, 19 * kMiB + kMiB / 2, 1, "a.py:1:x");
  CHECK(ViewerModel::from(bare).allocated_at(1) == 19 * kMiB + kMiB / 2);
}

TEST_CASE("a shared CSV trace opens and replays to PyTorch's peaks", "[viewer][model][shared]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  const auto m = ViewerModel::open(*dir + "/traces/native/resnet50.trace.csv.gz");
  CHECK(m.entry_count() == 53934);
  CHECK_FALSE(m.oom_cursor());
  // README: peak reserved 7493124096 (segment sizes are exact in the trace).
  CHECK(m.reserved_at(m.peak_reserved_cursor()) == 7493124096ull);
  const MemoryState end = m.state_at(m.entry_count());
  CHECK(end.check_invariants());
}

TEST_CASE("gpumem JSON and pickle snapshots open, with ops on blocks", "[viewer][model]") {
  namespace fx = gpumem::forensics;
  fx::Snapshot snap;
  fx::SnapshotBlock a{kSeg1, 2 * kMiB, 2 * kMiB, "active_allocated", {{"forward", "model.py", 10}}, "aten::mm"};
  fx::SnapshotBlock b{kSeg1 + 2 * kMiB, 1 * kMiB, 1 * kMiB, "active_allocated", {{"step", "optim.py", 5}}, "aten::add_"};
  fx::SnapshotBlock c{kSeg1 + 3 * kMiB, 1 * kMiB, 0, "inactive", {}, ""};
  snap.segments = {large_segment(kSeg1, 4 * kMiB, 3 * kMiB, {a, b, c})};
  const auto entry = snapshot_entry;
  snap.device_traces = {{entry(TraceAction::segment_alloc, kSeg1, 4 * kMiB, 1, ""),
                         entry(TraceAction::alloc, kSeg1, 2 * kMiB, 2, "aten::mm"),
                         entry(TraceAction::alloc, kSeg1 + 2 * kMiB, 1 * kMiB, 3, "aten::add_")}};
  const std::string dir = std::filesystem::temp_directory_path() / ("gpumem-viewer-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  for (const std::string name : {"snap.json", "snap.pickle"}) {
    INFO(name);
    const std::string path = dir + "/" + name;
    fx::write_snapshot(snap, path);
    const auto m = ViewerModel::open(path);
    CHECK(m.is_snapshot());
    CHECK(m.entry_count() == 3);
    REQUIRE(m.has_ops());
    const MemoryState s = m.state_at(m.entry_count());
    CHECK(s.allocated_bytes == 3 * kMiB);
    const auto groups = live_groups(m, s, GroupBy::op, SortBy::bytes, "");
    REQUIRE(groups.size() == 2);
    CHECK(groups[0].name == "aten::mm");
    CHECK(groups[1].name == "aten::add_");
    CHECK(live_groups(m, s, GroupBy::op, SortBy::bytes, "ADD").size() == 1);
    // g cycles call site -> function -> op when the file records ops.
    ViewState st = initial_state(m, Size{80, 24});
    st.view = View::live;
    st = reduce(reduce(st, Key::chr(U'g'), m), Key::chr(U'g'), m);
    CHECK(st.group_by == GroupBy::op);
    CHECK(render(st, m, st.screen).to_text().find("aten::mm") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a private pool's segments are marked in the segment lists", "[viewer][model][pools]") {
  namespace fx = gpumem::forensics;
  fx::Snapshot snap;
  const std::uint64_t pool_seg = kSeg1 + 64 * kMiB;
  auto half_used = [](std::uint64_t addr) {
    return large_segment(addr, 2 * kMiB, 1 * kMiB,
                         {fx::SnapshotBlock{addr, 1 * kMiB, 1 * kMiB, "active_allocated", {}, ""},
                          fx::SnapshotBlock{addr + 1 * kMiB, 1 * kMiB, 0, "inactive", {}, ""}});
  };
  fx::SnapshotSegment graph = half_used(pool_seg);  // a CUDA graph's pool (segment_pool_id (0, 5))
  graph.pool_id = {0, 5};
  snap.segments = {half_used(kSeg1), graph};
  const std::string path =
      std::filesystem::temp_directory_path() / ("gpumem-viewer-pools-" + std::to_string(getpid()) + ".pickle");
  fx::write_snapshot(snap, path);
  const auto m = ViewerModel::open(path);
  std::filesystem::remove(path);
  CHECK(!m.pool_of(kSeg1).has_value());
  CHECK(!m.pool_of(kSeg1 + 2 * kMiB).has_value());
  REQUIRE(m.pool_of(pool_seg + kMiB).has_value());
  CHECK(*m.pool_of(pool_seg + kMiB) == std::pair<std::int64_t, std::int64_t>{0, 5});
  CHECK(!m.pool_of(pool_seg + 2 * kMiB).has_value());
  // The Pins view lists both segments; only the pool's carries the marker.
  ViewState st = initial_state(m, Size{120, 30});
  st.view = View::pins;
  const std::string text = render(st, m, st.screen).to_text();
  CHECK(text.find("private pool (0, 5)") != std::string::npos);
  CHECK(text.find("private pool (0, 0)") == std::string::npos);
}

TEST_CASE("allocations outside every segment: true numbers, said in the summary, inside the chart", "[viewer][model]") {
  // The regression input of tests/forensics/test_hostile_inputs.cpp (a CSV with allocations and no
  // segment lines; the viewer showed 12 EiB), plus a free of a block the file never
  // allocated, which must not wrap allocated below zero.
  const std::string dir = std::filesystem::temp_directory_path() / ("gpumem-viewer-noseg-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/noseg.csv";
  {
    std::ofstream out(path);
    out << "action,addr,size,stream,time_us,where\n"
           "free_requested,138000000000000,1000,0,100,train.py:9:main\n"
           "free_completed,138000000000000,1000,0,100,train.py:9:main\n"
           "alloc,139000000000000,1000,0,101,train.py:11:main\n"
           "alloc,139000000002000,5000,0,102,train.py:11:main\n";
  }
  const auto m = ViewerModel::open(path);
  std::filesystem::remove_all(dir);
  REQUIRE(m.entry_count() == 4);
  for (std::size_t i = 0; i <= m.entry_count(); ++i) {
    CHECK(m.allocated_at(i) <= 6 * 1024);  // never wrapped
    CHECK(m.reserved_at(i) == 0);
  }
  CHECK(m.allocated_at(m.entry_count()) == 1024 + 5120);  // both requests rounded to 512 B blocks
  const Summary sum = summarize(m, m.state_at(m.entry_count()), m.entry_count());
  CHECK(sum.outside_segment_block_count == 2);
  CHECK(sum.outside_segment_bytes == 1024 + 5120);
  const std::string text = text_report(m, 80);
  INFO(text);
  CHECK(text.find("EiB") == std::string::npos);
  CHECK(text.find("2 of the live blocks (6.00 KiB) lie in no segment") != std::string::npos);
  // Both timeline charts are scaled to the allocated peak, the larger here: the top label reads it.
  CHECK(text.find("\n  6.00 KiB") != std::string::npos);
  CHECK(text.find("\n       1 B") == std::string::npos);
}
