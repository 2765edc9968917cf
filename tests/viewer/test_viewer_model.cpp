// ViewerModel: series, peaks, OOM, checkpointed state_at, snapshot opening.
#include <random>

#include "catch.h"
#include "gpumem/forensics/error.h"
#include "gpumem/view/summary.h"
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
