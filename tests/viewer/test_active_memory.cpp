// ActiveMemory and TimeWindow: the Active view's model. Live bytes over time grouped by call site,
// function or op; time buckets, zoom, the moment each column shows.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "catch.h"
#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/snapshot_writer.h"
#include "gpumem/forensics/vocabulary.h"
#include "gpumem/view/active_memory.h"
#include "gpumem/view/live_groups.h"
#include "gpumem/view/time_window.h"
#include "gpumem/view/viewer_model.h"
#include "viewer_test_support.h"

using namespace gpumem::view;
using namespace gpumem::view::testing;

namespace {

// A trace of n entries over `sites` call sites with uneven sizes, uneven times (bursts and idle
// gaps), frees of addresses the trace never allocated, and re-allocations of live addresses.
Trace grouped_trace(std::size_t n, int sites, unsigned seed) {
  Trace t;
  t.source = "grouped.csv";
  std::mt19937_64 rng(seed);
  add(t, TraceAction::segment_alloc, kSeg1, 4096 * kMiB, 0);
  std::vector<std::uint64_t> live;
  std::int64_t now = 0;
  while (t.entries.size() < n) {
    now += rng() % 50 == 0 ? 5000 + static_cast<std::int64_t>(rng() % 20000) : static_cast<std::int64_t>(rng() % 4);
    const auto r = rng() % 100;
    if (r < 2) {
      add(t, TraceAction::free_completed, kSeg2 + (rng() % 64) * 4096, 4096, now);  // never allocated
    } else if (r < 4 && !live.empty()) {
      // An alloc at a live address replaces that block (as MemoryState does).
      const auto site = std::to_string(rng() % static_cast<unsigned>(sites));
      add(t, TraceAction::alloc, live[rng() % live.size()], 512 + rng() % (8 * kMiB), now, "site" + site + ".py:" + site + ":f" + site);
    } else if (!live.empty() && (r < 50 || live.size() > 400)) {
      const std::size_t k = rng() % live.size();
      add(t, TraceAction::free_requested, live[k], 0, now);
      add(t, TraceAction::free_completed, live[k], 0, now);
      live.erase(live.begin() + static_cast<long>(k));
    } else {
      const std::uint64_t addr = kSeg1 + (rng() % 4000) * kMiB;
      if (std::find(live.begin(), live.end(), addr) != live.end()) continue;
      // Site k allocates blocks of about (k + 1) * 64 KiB; some sites are rare.
      const int site = static_cast<int>(rng() % static_cast<unsigned>(sites));
      add(t, TraceAction::alloc, addr, (static_cast<std::uint64_t>(site) + 1) * 65536 + rng() % 4096, now,
          "site" + std::to_string(site) + ".py:" + std::to_string(site) + ":f" + std::to_string(site));
      live.push_back(addr);
    }
  }
  return t;
}

// Each group's live bytes at a cursor, straight from the replayed state (what the Live view shows).
std::map<std::string, std::uint64_t> groups_at(const ViewerModel& m, std::size_t cursor, GroupBy by) {
  std::map<std::string, std::uint64_t> out;
  for (const auto& g : live_groups(m, m.state_at(cursor), by, SortBy::bytes, "")) out[g.name] = g.bytes;
  return out;
}

// Checks the slots against the replayed state at a cursor: named slots equal their group, "other"
// the rest, and the slots sum to allocated.
void check_slots_at(const ViewerModel& m, const ActiveMemory& am, std::size_t cursor) {
  const auto slots = am.live_at(cursor);
  const auto truth = groups_at(m, cursor, am.group_by());
  std::uint64_t named = 0, sum = 0;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    sum += slots[i];
    if (am.slots()[i].other) continue;
    const auto it = truth.find(am.slots()[i].name);
    INFO("cursor " << cursor << " slot " << am.slots()[i].name);
    CHECK(slots[i] == (it == truth.end() ? 0 : it->second));
    named += slots[i];
  }
  std::uint64_t all = 0;
  for (const auto& [name, bytes] : truth) all += bytes;
  CHECK(sum == m.allocated_at(cursor));
  CHECK(sum == all);
  if (!am.slots().empty() && am.slots().back().other) CHECK(slots.back() == all - named);
}

// The trace's live bytes after every entry stamped before each bucket's end, by a replay from the
// start that shares nothing with the model's indexes.
std::vector<std::uint64_t> replayed_bucket_ends(const ViewerModel& m, const TimeWindow& w) {
  MemoryState state = m.state_at(0);
  const auto& entries = m.trace().entries;
  const std::int64_t t0 = entries.empty() ? 0 : entries.front().time_us;
  std::int64_t latest = 0;
  std::size_t i = 0;
  std::vector<std::uint64_t> out;
  for (int k = 0; k < w.columns; ++k) {
    const std::int64_t edge = w.edge_us(k + 1);
    while (i < entries.size() && std::max(latest, entries[i].time_us - t0) < edge) {
      latest = std::max(latest, entries[i].time_us - t0);
      state.apply(entries[i], i, m.entry_block_bytes(i), m.entry_op(i));
      ++i;
    }
    out.push_back(state.allocated_bytes);
  }
  return out;
}

// Bucket ends: the samples' sums equal the replayed live bytes, at every zoom level and at a few
// window positions; the replay work stays within one checkpoint interval per column.
void check_bucket_ends(const ViewerModel& m, GroupBy by, int columns) {
  const ActiveMemory& am = m.active_memory(by);
  REQUIRE(am.check_invariants(m));
  const int deepest = max_zoom(m.span_us(), columns);
  for (int z = 0; z <= deepest; z += std::max(1, deepest / 4)) {
    for (const std::int64_t start : {std::int64_t{0}, m.span_us() / 3, m.span_us()}) {
      const TimeWindow w = make_window(m.span_us(), columns, z, start);
      INFO("zoom " << z << " start " << w.start_us << " span " << w.span_us);
      const auto buckets = window_buckets(m, w, BucketMoment::end);
      std::vector<std::size_t> moments;
      for (const auto& b : buckets) moments.push_back(b.shown);
      std::size_t replayed = 0;
      const auto samples = am.sample(moments, &replayed);
      const auto truth = replayed_bucket_ends(m, w);
      REQUIRE(samples.size() == truth.size());
      for (std::size_t k = 0; k < samples.size(); ++k) {
        INFO("column " << k);
        CHECK(samples[k].total_bytes == truth[k]);
        CHECK(samples[k].total_bytes == std::accumulate(samples[k].slot_bytes.begin(), samples[k].slot_bytes.end(), std::uint64_t{0}));
      }
      // At most one checkpoint interval (two changes per entry at most) per column.
      CHECK(replayed <= static_cast<std::size_t>(columns) * 2 * kActiveCheckpointEvery);
    }
  }
}

}  // namespace

TEST_CASE("time windows: edges, columns, zoom, clamping", "[viewer][active]") {
  for (const std::int64_t span : {std::int64_t{1}, std::int64_t{7}, std::int64_t{68}, std::int64_t{1000}, std::int64_t{1'887'123}}) {
    for (const int columns : {1, 68, 200}) {
      INFO("span " << span << " columns " << columns);
      const int deepest = max_zoom(span, columns);
      CHECK(zoomed_span_us(span, columns, 0) == span);
      CHECK(zoomed_span_us(span, columns, deepest) >= std::min<std::int64_t>(span, columns));
      CHECK(zoomed_span_us(span, columns, deepest + 5) == zoomed_span_us(span, columns, deepest));
      if (span >= 2 * columns) CHECK(deepest > 0);
      if (span <= columns) CHECK(deepest == 0);  // one microsecond per column at most
      for (int z = 1; z <= deepest; ++z) CHECK(zoomed_span_us(span, columns, z) < zoomed_span_us(span, columns, z - 1));
      for (int z = 0; z <= deepest; ++z) {
        const TimeWindow w = make_window(span, columns, z, span / 2);
        CHECK(w.start_us >= 0);
        CHECK(w.end_us() <= std::max(span, w.span_us));
        CHECK(w.edge_us(0) == w.start_us);
        CHECK(w.edge_us(columns) == w.end_us());
        for (std::int64_t k = -3; k < columns + 3; ++k) {
          CHECK(w.edge_us(k) <= w.edge_us(k + 1));
          if (w.edge_us(k + 1) > w.edge_us(k)) {
            CHECK(w.column_of(w.edge_us(k)) == k);
            CHECK(w.column_of(w.edge_us(k + 1) - 1) == k);
          }
        }
      }
    }
  }
}

TEST_CASE("buckets partition the cursors; each shows its peak or its end", "[viewer][active]") {
  const auto m = ViewerModel::from(grouped_trace(6000, 9, 7));
  for (const int zoom : {0, 2, 5}) {
    const TimeWindow w = make_window(m.span_us(), 50, zoom, m.span_us() / 4);
    const auto peaks = window_buckets(m, w, BucketMoment::peak);
    const auto ends = window_buckets(m, w, BucketMoment::end);
    std::size_t next = peaks.front().empty ? peaks.front().shown : peaks.front().first;
    for (std::size_t k = 0; k < peaks.size(); ++k) {
      const Bucket& p = peaks[k];
      INFO("zoom " << zoom << " column " << k);
      CHECK(ends[k].last == p.last);
      if (p.empty) {
        CHECK(p.peak_bytes == m.allocated_at(p.shown));
        continue;
      }
      CHECK(p.first == next);  // contiguous: no cursor belongs to two buckets or to none
      next = p.last + 1;
      std::uint64_t best = 0;
      for (std::size_t c = p.first; c <= p.last; ++c) best = std::max(best, m.allocated_at(c));
      CHECK(p.peak_bytes == best);
      CHECK(m.allocated_at(p.shown) == best);
      CHECK(ends[k].shown == p.last);
      // Every cursor of the bucket lies in its time range.
      CHECK(w.column_of(m.cursor_elapsed_us(p.first)) == static_cast<std::int64_t>(k));
      CHECK(w.column_of(m.cursor_elapsed_us(p.last)) == static_cast<std::int64_t>(k));
    }
  }
  // The whole trace: the buckets cover every cursor, 0 through the last.
  const TimeWindow all = make_window(m.span_us(), 50, 0, 0);
  const auto b = window_buckets(m, all, BucketMoment::end);
  CHECK(b.front().first == 0);
  CHECK(b.back().last == m.entry_count());
}

TEST_CASE("stepping bucket by bucket visits each column's moment in order", "[viewer][active]") {
  const auto m = ViewerModel::from(grouped_trace(3000, 5, 11));
  for (const BucketMoment moment : {BucketMoment::peak, BucketMoment::end}) {
    const TimeWindow w = make_window(m.span_us(), 40, 0, 0);
    std::vector<std::size_t> expected;
    for (const auto& b : window_buckets(m, w, moment)) {
      if (!b.empty && b.shown > 0 && (expected.empty() || b.shown > expected.back())) expected.push_back(b.shown);
    }
    std::vector<std::size_t> forward;
    for (std::size_t c = 0;;) {
      const std::size_t next = step_bucket(m, w, c, true, moment);
      if (next == c) break;
      CHECK(next > c);
      forward.push_back(c = next);
    }
    CHECK(forward == expected);
    // And back again.
    std::vector<std::size_t> backward;
    for (std::size_t c = forward.empty() ? 0 : forward.back();;) {
      const std::size_t prev = step_bucket(m, w, c, false, moment);
      if (prev == c) break;
      CHECK(prev < c);
      backward.push_back(c = prev);
    }
    std::vector<std::size_t> reversed(expected.rbegin(), expected.rend());
    if (!reversed.empty()) reversed.erase(reversed.begin());
    if (!backward.empty() && backward.back() == 0 && (reversed.empty() || reversed.back() != 0)) backward.pop_back();
    CHECK(backward == reversed);
  }
}

TEST_CASE("the handmade trace by call site: three groups, their peaks, sums at every cursor", "[viewer][active]") {
  const auto m = ViewerModel::from(handmade_trace());
  const ActiveMemory& am = m.active_memory(GroupBy::call_site);
  REQUIRE(am.check_invariants(m));
  REQUIRE(am.slots().size() == 3);
  CHECK(am.group_count() == 3);
  CHECK_FALSE(am.nothing_recorded());
  CHECK(am.slots()[0].name == "model.py:10:forward");
  CHECK(am.slots()[0].peak_bytes == 5 * kMiB);
  CHECK(am.slots()[1].name == "optim.py:5:step");
  CHECK(am.slots()[1].peak_bytes == 2 * kMiB);
  CHECK(am.slots()[2].name == "model.py:20:backward");
  CHECK(am.slots()[2].peak_bytes == 1 * kMiB);
  for (std::size_t c = 0; c <= m.entry_count(); ++c) check_slots_at(m, am, c);
  // By function: forward's two... one site; backward and step: three groups still.
  CHECK(m.active_memory(GroupBy::function).slots().size() == 3);
  // Built once per grouping: the same object every time.
  CHECK(&m.active_memory(GroupBy::call_site) == &am);
}

TEST_CASE("more groups than slots: the top six by peak, the rest as other", "[viewer][active]") {
  const auto m = ViewerModel::from(grouped_trace(20000, 11, 3));
  for (const GroupBy by : {GroupBy::call_site, GroupBy::function}) {
    const ActiveMemory& am = m.active_memory(by);
    REQUIRE(am.check_invariants(m));
    REQUIRE(am.slots().size() == kActiveTopGroups + 1);
    CHECK(am.group_count() == 11);
    CHECK(am.slots().back().other);
    CHECK(am.slots().back().group_count == 11 - kActiveTopGroups);
    // The named slots are the groups with the highest own peaks, in order.
    std::map<std::string, std::uint64_t> peak;
    for (std::size_t c = 0; c <= m.entry_count(); c += 7) {
      for (const auto& [name, bytes] : groups_at(m, c, by)) peak[name] = std::max(peak[name], bytes);
    }
    for (std::size_t i = 0; i + 1 < am.slots().size(); ++i) {
      for (const auto& [name, p] : peak) {
        const bool named = std::any_of(am.slots().begin(), am.slots().end(), [&](const ActiveSlot& s) { return s.name == name; });
        if (!named) CHECK(p <= am.slots()[i].peak_bytes);
      }
    }
    std::mt19937 rng(5);
    for (int i = 0; i < 60; ++i) check_slots_at(m, am, rng() % (m.entry_count() + 1));
    check_slots_at(m, am, m.entry_count());
    check_bucket_ends(m, by, 68);
  }
}

TEST_CASE("a trace without call sites is one group, and says so", "[viewer][active]") {
  Trace t;
  add(t, TraceAction::segment_alloc, kSeg1, 8 * kMiB, 0);
  add(t, TraceAction::alloc, kSeg1, kMiB, 10);
  add(t, TraceAction::alloc, kSeg1 + kMiB, 2 * kMiB, 20);
  add(t, TraceAction::free_completed, kSeg1, kMiB, 30);
  const auto m = ViewerModel::from(t);
  const ActiveMemory& am = m.active_memory(GroupBy::call_site);
  REQUIRE(am.slots().size() == 1);
  CHECK(am.nothing_recorded());
  CHECK(am.slots()[0].name == gpumem::forensics::kNotRecorded);
  CHECK(am.slots()[0].peak_bytes == 3 * kMiB);
  for (std::size_t c = 0; c <= m.entry_count(); ++c) check_slots_at(m, am, c);
  // And an empty trace: no slots, nothing to sample.
  const auto empty = ViewerModel::from(Trace{});
  CHECK(empty.active_memory(GroupBy::call_site).slots().empty());
  CHECK(empty.active_memory(GroupBy::call_site).live_at(0).empty());
}

TEST_CASE("ops of a snapshot, with a block live before the trace began", "[viewer][active]") {
  namespace fx = gpumem::forensics;
  fx::Snapshot snap;
  fx::SnapshotSegment seg;
  seg.address = kSeg1;
  seg.total_size_bytes = 8 * kMiB;
  seg.allocated_size_bytes = 3 * kMiB;
  seg.segment_type = "large";
  // a: live before the trace (its alloc is not in it); b: allocated in the trace; c freed in it.
  seg.blocks = {{kSeg1, 2 * kMiB, 2 * kMiB, "active_allocated", {{"forward", "model.py", 10}}, "aten::mm"},
                {kSeg1 + 2 * kMiB, 1 * kMiB, 1 * kMiB, "active_allocated", {{"step", "optim.py", 5}}, "aten::add_"},
                {kSeg1 + 3 * kMiB, 5 * kMiB, 0, "inactive", {}, ""}};
  snap.segments = {seg};
  const auto entry = snapshot_entry;
  snap.device_traces = {{entry(TraceAction::alloc, kSeg1 + 3 * kMiB, 4 * kMiB, 100, "aten::relu"),
                         entry(TraceAction::alloc, kSeg1 + 2 * kMiB, 1 * kMiB, 200, "aten::add_"),
                         entry(TraceAction::free_completed, kSeg1 + 3 * kMiB, 4 * kMiB, 300, "aten::relu")}};
  const std::string dir = std::filesystem::temp_directory_path() / ("gpumem-active-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/snap.json";
  fx::write_snapshot(snap, path);
  const auto m = ViewerModel::open(path);
  std::filesystem::remove_all(dir);
  REQUIRE(m.has_ops());
  const ActiveMemory& am = m.active_memory(GroupBy::op);
  REQUIRE(am.check_invariants(m));
  REQUIRE(am.slots().size() == 3);
  CHECK(am.slots()[0].name == "aten::relu");  // 4 MiB at its peak
  CHECK(am.slots()[0].peak_bytes == 4 * kMiB);
  CHECK(am.slots()[1].name == "aten::mm");    // live from before the trace to its end
  CHECK(am.live_at(0) == std::vector<std::uint64_t>{0, 2 * kMiB, 0});
  CHECK(am.live_at(1) == std::vector<std::uint64_t>{4 * kMiB, 2 * kMiB, 0});
  CHECK(am.live_at(3) == std::vector<std::uint64_t>{0, 2 * kMiB, 1 * kMiB});
  for (std::size_t c = 0; c <= m.entry_count(); ++c) check_slots_at(m, am, c);
}

TEST_CASE("the repository's ResNet-50 trace: bucket ends, groups, bounded work", "[viewer][active]") {
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  REQUIRE(src != nullptr);
  const auto m = ViewerModel::open(std::string(src) + "/traces/resnet50.native.trace.csv.gz");
  REQUIRE(m.entry_count() > 50000);
  check_bucket_ends(m, GroupBy::call_site, 68);
  const ActiveMemory& am = m.active_memory(GroupBy::call_site);
  CHECK(am.slots().size() == kActiveTopGroups + 1);
  for (std::size_t c = 0; c <= m.entry_count(); c += 4999) check_slots_at(m, am, c);
  check_slots_at(m, am, m.peak_allocated_cursor());
}

TEST_CASE("the biggest shared trace: bucket ends at every zoom, bounded work", "[viewer][active][shared]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  const auto m = ViewerModel::open(*dir + "/traces/native/bert_varlen.trace.csv.gz");
  REQUIRE(m.entry_count() > 100000);
  check_bucket_ends(m, GroupBy::call_site, 188);
  check_bucket_ends(m, GroupBy::function, 68);
  const ActiveMemory& am = m.active_memory(GroupBy::call_site);
  for (std::size_t c = 0; c <= m.entry_count(); c += 9973) check_slots_at(m, am, c);
}

TEST_CASE("PyTorch's own OOM snapshot (pickle): exact block sizes, blocks from before the trace", "[viewer][active][shared]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  const auto m = ViewerModel::open(*dir + "/traces/native/oom.snapshot.pickle");
  REQUIRE(m.is_snapshot());
  check_bucket_ends(m, GroupBy::call_site, 68);
  const ActiveMemory& am = m.active_memory(GroupBy::call_site);
  for (std::size_t c = 0; c <= m.entry_count(); c += 997) check_slots_at(m, am, c);
  check_slots_at(m, am, *m.oom_cursor());
  // At the OOM the layers hold the 7.31 GiB allocated that `gpumem report` gives there.
  const auto at_oom = am.live_at(*m.oom_cursor());
  CHECK(gpumem::forensics::format_bytes(std::accumulate(at_oom.begin(), at_oom.end(), std::uint64_t{0})) == "7.31 GiB");
}
