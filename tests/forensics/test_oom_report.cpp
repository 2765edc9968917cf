// The report on PyTorch's own OOM snapshot ($GPUMEM_SHARED_DIR/traces/native/oom.snapshot.pickle): the
// 200 MiB request, the largest free extent, the 692 MiB reserved-but-unallocated of PyTorch's
// message, verdict fragmentation; the same from the CSV trace (segments rebuilt) and from a
// snapshot taken after the exception unwound (frees after the oom entry rolled back).
#include <algorithm>
#include <string_view>
#include <cstdlib>
#include <sstream>
#include <fstream>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/vocabulary.h"

using namespace gpumem::forensics;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

std::optional<std::string> trace_file(const char* name) {
  auto dir = gpumem::forensics::testing::shared_dir();
  if (!dir) return std::nullopt;
  return *dir + "/traces/native/" + name;
}

// PyTorch's message: "Tried to allocate 200.00 MiB ... 692.00 MiB is reserved by PyTorch but
// unallocated". The largest free block in the snapshot's segments is the 196 MiB left in the
// 200 MiB segment a 4 MiB block pins.
void check_pytorch_oom(const MemoryReport& r) {
  REQUIRE(r.oom.has_value());
  CHECK(r.oom->verdict == "fragmentation");
  CHECK(r.oom->request_bytes == 200 * kMiB);
  CHECK(r.oom->rounded_request_bytes == 200 * kMiB);
  CHECK(r.fragmentation.reserved_unallocated_bytes() == 692 * kMiB);
  CHECK(r.fragmentation.largest_free_extent_bytes == 196 * kMiB);
  CHECK(r.oom->largest_usable_extent_bytes == 196 * kMiB);
  CHECK(r.fragmentation.reserved_bytes == 8579448832ull);  // PyTorch's peak_reserved (oom.json)
  // The parts of reserved - requested add up.
  const auto& f = r.fragmentation;
  CHECK(f.reserved_bytes - f.requested_bytes ==
        f.rounding_bytes + f.pending_free_bytes + f.inactive_split_bytes + f.cached_free_bytes);
  CHECK(f.free_bytes == f.reserved_bytes - f.allocated_bytes - f.pending_free_bytes);
  CHECK(f.external_fragmentation > 0.5);
  REQUIRE(!f.pinned.empty());
  CHECK(f.pinned.front().free_bytes == 196 * kMiB);
  CHECK(f.pinned.front().blocks.front().size_bytes == 4 * kMiB);
  CHECK(f.pinned.front().blocks.front().age_us.has_value());
}

// Marks `count` live blocks free in the segments (merging free neighbours) and appends their
// free_requested + free_completed after the oom entry: what a snapshot taken after the
// exception unwound looks like.
Snapshot unwound(Snapshot s, std::size_t count) {
  auto& trace = s.device_traces.at(0);
  std::int64_t t = trace.back().time_us;
  std::size_t done = 0;
  for (auto& seg : s.segments) {
    for (auto& b : seg.blocks) {
      if (done == count) break;
      if (b.state != "active_allocated") continue;
      for (auto action : {TraceAction::free_requested, TraceAction::free_completed}) {
        SnapshotTraceEntry e;
        e.action = action;
        e.addr = b.address;
        e.size_bytes = b.requested_bytes;
        e.time_us = ++t;
        e.frames = b.frames;
        trace.push_back(e);
      }
      b.state = "inactive";
      ++done;
    }
    // Merge free neighbours as the allocator would.
    std::vector<SnapshotBlock> merged;
    for (auto& b : seg.blocks) {
      if (!merged.empty() && merged.back().state == "inactive" && b.state == "inactive") {
        merged.back().size_bytes += b.size_bytes;
      } else {
        merged.push_back(b);
      }
    }
    for (auto& b : merged) {
      if (b.state == "inactive") {
        b.requested_bytes = 0;
        b.frames.clear();
      }
    }
    seg.blocks = merged;
  }
  REQUIRE(done == count);
  return s;
}

}  // namespace

TEST_CASE("PyTorch's OOM snapshot: 200 MiB request, 692 MiB reserved-unallocated, fragmentation", "[report][traces]") {
  const auto path = trace_file("oom.snapshot.pickle");
  if (!path) GPUMEM_SKIP("GPUMEM_SHARED_DIR with traces/ not set");
  ReportOptions options;
  options.replay = true;
  const MemoryReport r = build_report(load_snapshot(*path), options);
  check_pytorch_oom(r);
  CHECK(r.state.rolled_back_entries == 0);
  CHECK(r.oom->device_free_bytes == 140978028544ull);
  CHECK(r.oom->site == "oom_repro.py:111:oom");
  // The advice is computed: the replay under gpumem's policy with the same memory.
  const bool has_replay_advice = std::any_of(r.oom->advice.begin(), r.oom->advice.end(), [](const std::string& a) {
    return a.find("gpumem's default policy") != std::string::npos;
  });
  CHECK(has_replay_advice);

  const std::string json = render_report_json(r);
  for (const char* key : {"\"verdict\":\"fragmentation\"", "\"request_bytes\":209715200",
                          "\"rounded_request_bytes\":209715200", "\"largest_free_extent_bytes\":205520896",
                          "\"reserved_unallocated_bytes\":725614592", "\"allocated_bytes\":7853834240",
                          "\"reserved_bytes\":8579448832", "\"top_ops\":[", "\"top_sites\":["}) {
    INFO(key);
    CHECK(json.find(key) != std::string::npos);
  }
  const std::string text = render_report_text(r);
  CHECK(text.find("verdict fragmentation") != std::string::npos);
  CHECK(text.find("692.00 MiB") != std::string::npos);
}

TEST_CASE("the CSV of the same OOM rebuilds the segments PyTorch had", "[report][traces]") {
  const auto path = trace_file("oom.trace.csv.gz");
  if (!path) GPUMEM_SKIP("GPUMEM_SHARED_DIR with traces/ not set");
  ReportOptions options;
  options.replay = false;
  const MemoryReport r = build_report(load_snapshot(*path), options);
  CHECK(r.state.reconstructed);
  CHECK(r.state.skipped_entries == 0);
  check_pytorch_oom(r);
  CHECK(r.fragmentation.allocated_bytes == 7853834240ull);
  REQUIRE(!r.notes.empty());
  CHECK(r.notes.front().find("rebuilt") != std::string::npos);
}

TEST_CASE("frees recorded after the oom entry are rolled back, and the report says so", "[report][traces]") {
  const auto path = trace_file("oom.snapshot.pickle");
  if (!path) GPUMEM_SKIP("GPUMEM_SHARED_DIR with traces/ not set");
  const Snapshot original = load_snapshot(*path);
  ReportOptions options;
  options.replay = false;
  const MemoryReport before = build_report(original, options);
  const Snapshot late = unwound(original, 1500);
  // Without rolling back, the state would be the unwound one: lots of free memory.
  const MemoryReport r = build_report(late, options);
  CHECK(r.state.rolled_back_entries == 3000);
  CHECK(r.state.rolled_back_frees == 1500);
  REQUIRE(r.oom.has_value());
  CHECK(r.oom->verdict == "fragmentation");
  CHECK(r.oom->request_bytes == 200 * kMiB);
  CHECK(r.fragmentation.reserved_bytes == before.fragmentation.reserved_bytes);
  CHECK(r.fragmentation.requested_bytes == before.fragmentation.requested_bytes);
  CHECK(r.fragmentation.live_blocks == before.fragmentation.live_blocks);
  CHECK(r.fragmentation.largest_free_extent_bytes == before.fragmentation.largest_free_extent_bytes);
  // The trace records requested sizes only: a restored block whose freed extent merged with a
  // free neighbour gets the rounded request, without the up to 1 MiB remainder PyTorch may have
  // left unsplit in it. A few such blocks among the 1500 restored.
  const std::uint64_t a = r.fragmentation.allocated_bytes, b = before.fragmentation.allocated_bytes;
  CHECK(a <= b);
  CHECK(b - a <= 4 * kMiB);
  CHECK(r.fragmentation.free_bytes - before.fragmentation.free_bytes == b - a);
  const bool said = std::any_of(r.notes.begin(), r.notes.end(),
                                [](const std::string& n) { return n.find("were undone") != std::string::npos; });
  CHECK(said);
  CHECK(render_report_json(r).find("\"rolled_back_frees\":1500") != std::string::npos);
}

TEST_CASE("a report without an OOM has no verdict but the fragmentation numbers", "[report][traces]") {
  const auto path = trace_file("resnet50.trace.csv.gz");
  if (!path) GPUMEM_SKIP("GPUMEM_SHARED_DIR with traces/ not set");
  ReportOptions options;
  options.top = 5;
  const MemoryReport r = build_report(load_snapshot(*path), options);
  CHECK(!r.oom.has_value());
  CHECK(r.state.reconstructed);
  CHECK(r.sites.size() <= 5);
  CHECK(!r.sites.empty());
  // Without an OOM the verdict says where reserved memory beyond the request goes.
  REQUIRE(r.at_moment.has_value());
  CHECK(r.moment.kind == MomentSpec::Kind::peak_reserved);
  CHECK(!r.verdict().empty());
  CHECK(render_report_json(r).find("\"verdict\":\"" + r.verdict() + "\"") != std::string::npos);
}

TEST_CASE("every term and verdict reports print is defined once in docs/forensics.md", "[report][vocabulary]") {
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  if (!src || !*src) GPUMEM_SKIP("GPUMEM_SOURCE_DIR not set");
  std::ifstream in(std::string(src) + "/docs/forensics.md");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const auto vocab = doc.find("## Vocabulary");
  REQUIRE(vocab != std::string::npos);
  for (std::string_view term : kTerms) {
    const std::string defined = "- **" + std::string(term) + "**:";
    INFO(defined);
    const auto at = doc.find(defined);
    CHECK(at != std::string::npos);
    CHECK(at > vocab);
    CHECK(doc.find(defined, at + 1) == std::string::npos);  // once
  }
  for (std::string_view verdict : kVerdicts) {
    INFO(verdict);
    CHECK(doc.find("| `" + std::string(verdict) + "` |") != std::string::npos);
  }
  CHECK(doc.find(std::string(kNotRecorded)) != std::string::npos);
  CHECK(doc.find(std::string(kBeforeTrace)) != std::string::npos);
}

TEST_CASE("one number format", "[report][vocabulary]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(725614592) == "692.00 MiB");
  CHECK(format_signed_bytes(-1024) == "-1.00 KiB");
  CHECK(format_signed_bytes(0) == "0 B");
}

TEST_CASE("a private pool's free memory is not counted as free for a default-pool request", "[report][pools]") {
  // The default pool: one 20 MiB segment, 18 MiB live, 2 MiB free. A private pool (a CUDA graph's):
  // 100 MiB, all free. The request, 10 MiB, can use only the default pool: no fragmentation there,
  // the live memory is too large (capacity), whatever the private pool holds.
  Snapshot snap;
  auto segment = [](std::uint64_t addr, std::uint64_t live, std::uint64_t free, std::pair<std::int64_t, std::int64_t> pool) {
    SnapshotSegment seg;
    seg.address = addr;
    seg.segment_type = "large";
    seg.pool_id = pool;
    if (live) seg.blocks.push_back(SnapshotBlock{addr, live, live, "active_allocated", {}, ""});
    seg.blocks.push_back(SnapshotBlock{addr + live, free, 0, "inactive", {}, ""});
    recompute_sizes(seg);
    return seg;
  };
  snap.segments.push_back(segment(0x100000000, 18 * kMiB, 2 * kMiB, {0, 0}));
  snap.segments.push_back(segment(0x200000000, 0, 100 * kMiB, {0, 3}));
  SnapshotTraceEntry alloc;
  alloc.action = TraceAction::alloc;
  alloc.addr = 0x100000000;
  alloc.size_bytes = 18 * kMiB;
  alloc.time_us = 1;
  SnapshotTraceEntry oom;
  oom.action = TraceAction::oom;
  oom.size_bytes = 10 * kMiB;
  oom.time_us = 2;
  snap.device_traces = {{alloc, oom}};
  ReportOptions options;
  options.replay = false;
  const MemoryReport r = build_report(snap, options);
  REQUIRE(r.oom.has_value());
  CHECK(r.oom->verdict == "capacity");
  CHECK(r.fragmentation.free_bytes == 102 * kMiB);  // the device's numbers still count every pool
  const auto& ev = r.oom->evidence;
  CHECK(std::any_of(ev.begin(), ev.end(), [](const std::string& e) {
    return e.find("100.00 MiB of free and pending free memory is in private pools") != std::string::npos;
  }));
  // Without the private pool's segment the verdict is the same.
  snap.segments.pop_back();
  CHECK(build_report(snap, options).oom->verdict == "capacity");
}
