// gpumem's forensics on a live engine (CachingAllocator on HostVmmSource, driven directly): ops
// recorded through OpStack, a deliberately fragmenting program whose OOM postmortem says
// fragmentation with numbers equal to the engine's, snapshots PyTorch's layout, and diff of
// two snapshots around a known allocation, and the trace ring shared with a composer (recorded once).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/host_vmm_source.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/forensics/engine_forensics.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/op_attribution.h"
#include "gpumem/forensics/pickle_reader.h"
#include "gpumem/forensics/snapshot_writer.h"
#include "gpumem/forensics/snapshot_diff.h"
#include "gpumem/forensics/snapshot_io.h"

using namespace gpumem;
using namespace gpumem::forensics;
using gpumem::forensics::testing::TempDir;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Engine {
  explicit Engine(alloc::Config c) : events(alloc::make_immediate_events()), engine(source, *events, c) {}
  alloc::HostVmmSource source;
  std::unique_ptr<alloc::StreamEvents> events;
  alloc::CachingAllocator engine;
};

// The engine's configuration and the forensics one (each layer's keys in its own type).
struct Setup {
  alloc::Config engine;
  forensics::Config forensics;
};

Setup classic_config(const std::string& dir) {
  Setup c;
  c.engine.expandable_segments = false;
  c.engine.memory_limit_bytes = 160 * kMiB;
  c.engine.va_reserve_bytes = 1024 * kMiB;
  c.engine.thread_cache = false;
  c.forensics.trace_entries = 100000;
  c.forensics.record_ops = true;
  c.forensics.oom_report_dir = dir;
  return c;
}

}  // namespace

TEST_CASE("a fragmenting program's OOM postmortem says fragmentation, with the engine's numbers", "[engine][oom]") {
  TempDir dir;
  const Setup config = classic_config(dir.file(""));
  Engine e(config.engine);
  EngineForensics fx(e.engine, config.forensics);
  REQUIRE(fx.trace_ring() != nullptr);

  // 20 MiB temporaries (their own segments) each followed by an 11 MiB tensor kept alive, which
  // best-fit places in the free temporary: every segment ends 11 MiB used, 9 MiB free.
  std::vector<void*> kept;
  std::optional<alloc::OomInfo> oom;
  for (int i = 0; i < 64 && !oom; ++i) {
    void* big = nullptr;
    {
      ScopedOp op("aten::mm");
      auto r = e.engine.allocate(20 * kMiB, 0);
      if (!r.ok()) {
        oom = r.oom;
        auto files = fx.on_oom(*r.oom);
        REQUIRE(files.has_value());
        CHECK(files->verdict == "fragmentation");
        CHECK(files->message.find(files->report_path) != std::string::npos);
        CHECK(std::filesystem::exists(files->snapshot_path));
        CHECK(std::filesystem::exists(files->json_path));

        const Snapshot snap = load_snapshot(files->snapshot_path);
        ReportOptions options;
        options.replay = false;
        const MemoryReport rep = build_report(snap, options);
        REQUIRE(rep.oom.has_value());
        CHECK(rep.oom->verdict == "fragmentation");
        CHECK(rep.oom->op == "aten::mm");
        CHECK(rep.oom->request_bytes == 20 * kMiB);
        // The numbers add up to the engine's own.
        const alloc::EngineTotals t = e.engine.totals();
        CHECK(rep.fragmentation.allocated_bytes == t.allocated_bytes);
        CHECK(rep.fragmentation.allocated_bytes == r.oom->allocated_bytes);
        CHECK(rep.fragmentation.reserved_bytes == t.reserved_bytes);
        CHECK(rep.fragmentation.reserved_bytes == r.oom->reserved_bytes);
        CHECK(rep.fragmentation.free_bytes == t.cached_free_bytes);
        CHECK(rep.fragmentation.largest_free_extent_bytes == t.largest_free_extent_bytes);
        CHECK(rep.fragmentation.largest_free_extent_bytes < 20 * kMiB);
        CHECK(rep.fragmentation.free_bytes >= 20 * kMiB);
        CHECK(rep.oom->cap_bytes == 160 * kMiB);
        CHECK(rep.state.rolled_back_entries == 0);
        // Live memory is the kept tensors, by op.
        REQUIRE(!rep.ops.empty());
        CHECK(rep.ops.front().name == "aten::add");
        CHECK(rep.ops.front().live_bytes == kept.size() * 11 * kMiB);
        // The per-op table is built from the snapshot's trace.
        bool mm = false;
        for (const auto& row : rep.ops) {
          if (row.name == "aten::mm") {
            mm = true;
            CHECK(row.trace_allocs == kept.size());
            CHECK(row.reserved_growth_bytes >= kept.size() * 20 * kMiB);
          }
        }
        CHECK(mm);
        std::ifstream txt(files->report_path);
        std::stringstream ss;
        ss << txt.rdbuf();
        CHECK(ss.str().find("verdict fragmentation") != std::string::npos);
        break;
      }
      big = r.ptr;
    }
    {
      ScopedOp op("aten::add");
      e.engine.free(big);
      auto r = e.engine.allocate(11 * kMiB, 0);
      REQUIRE(r.ok());
      kept.push_back(r.ptr);
    }
  }
  REQUIRE(oom.has_value());
  CHECK(kept.size() >= 4);
  for (void* p : kept) e.engine.free(p);
}

TEST_CASE("engine snapshots carry ops on blocks and entries, in PyTorch's layout", "[engine][snapshot]") {
  Setup config = classic_config("");
  config.engine.expandable_segments = true;
  config.engine.memory_limit_bytes = 0;
  Engine e(config.engine);
  EngineForensics fx(e.engine, config.forensics);
  void* a;
  void* b;
  {
    ScopedOp scope("train_step", /*user_scope=*/true);
    ScopedOp op("aten::mm");
    a = e.engine.allocate(3 * kMiB, 0).ptr;
  }
  {
    ScopedOp op("aten::relu");
    b = e.engine.allocate(4096, 0).ptr;
  }
  REQUIRE(a);
  REQUIRE(b);
  const Snapshot s = fx.snapshot();
  CHECK(s.gpumem.version == GpumemSnapshotInfo::kVersion);
  CHECK(s.expandable_segments);
  std::size_t allocs = 0;
  for (const auto& entry : s.device_traces.at(0)) {
    if (entry.action != TraceAction::alloc) continue;
    ++allocs;
    if (entry.addr == reinterpret_cast<std::uintptr_t>(a)) {
      CHECK(entry.op == "aten::mm");
      CHECK(entry.user_metadata == "train_step");
      CHECK(entry.size_bytes == 3 * kMiB);
    } else {
      CHECK(entry.op == "aten::relu");
    }
  }
  CHECK(allocs == 2);
  std::size_t live = 0;
  for (const auto& seg : s.segments) {
    std::uint64_t next = seg.address, total = 0;
    for (const auto& blk : seg.blocks) {
      CHECK(blk.address == next);  // blocks tile the segment (the viewer recomputes addresses)
      next += blk.size_bytes;
      total += blk.size_bytes;
      if (blk.state == "active_allocated") {
        ++live;
        CHECK(!blk.op.empty());
      }
    }
    CHECK(total == seg.total_size_bytes);
  }
  CHECK(live == 2);
  // Written, the blocks and entries carry frames naming their op (for PyTorch's viewer); read
  // back, those frames are gone again.
  CHECK(s.gpumem.op_frames);
  const PickleValue raw = parse_pickle(snapshot_to_pickle(s), "engine");
  std::size_t named = 0;
  for (const auto& seg : raw.find("segments")->items()) {
    for (const auto& blk : seg.find("blocks")->items()) {
      if (blk.find("state")->as_string() != "active_allocated") continue;
      const auto& frames = blk.find("frames")->items();
      REQUIRE(frames.size() == 1);
      CHECK(frames[0].find("name")->as_string() == blk.find("op")->as_string());
      ++named;
    }
  }
  CHECK(named == 2);
  for (const auto& entry : raw.find("device_traces")->items()[0].items()) {
    if (entry.find("action")->as_string() != "alloc") continue;
    const auto& frames = entry.find("frames")->items();
    REQUIRE(!frames.empty());
    CHECK(frames[0].find("name")->as_string() == entry.find("op")->as_string());
  }
  const Snapshot back = parse_snapshot(snapshot_to_pickle(s), "engine");
  for (const auto& entry : back.device_traces.at(0)) CHECK(entry.frames.empty());
  // The per-op table, built from the trace.
  const MemoryReport report = build_report(s);
  bool mm = false;
  for (const auto& row : report.ops) {
    if (row.name == "aten::mm") {
      mm = true;
      CHECK(row.trace_allocs == 1);
      CHECK(row.live_bytes == 3 * kMiB);
      CHECK(row.reserved_growth_bytes > 0);
    }
  }
  CHECK(mm);
  e.engine.free(a);
  e.engine.free(b);
}

TEST_CASE("diff of two snapshots around a known allocation", "[engine][diff]") {
  Setup config = classic_config("");
  config.engine.memory_limit_bytes = 0;
  Engine e(config.engine);
  EngineForensics fx(e.engine, config.forensics);
  void* base;
  {
    ScopedOp op("aten::empty");
    base = e.engine.allocate(30 * kMiB, 0).ptr;
  }
  const Snapshot a = fx.snapshot();
  void* extra;
  {
    ScopedOp op("aten::linear");
    extra = e.engine.allocate(64 * kMiB, 0).ptr;
  }
  const Snapshot b = fx.snapshot();
  const SnapshotDiff d = diff_snapshots(a, b);
  INFO(render_diff_text(d));
  REQUIRE(d.ops.size() == 1);
  CHECK(d.ops.front().name == "aten::linear");
  CHECK(d.ops.front().a_bytes == 0);
  CHECK(d.ops.front().b_bytes == 64 * kMiB);
  CHECK(d.segments_added.size() == 1);
  CHECK(d.segments_added.front().total_size_bytes == 64 * kMiB);
  CHECK(d.segments_removed.empty());
  CHECK(d.b.fragmentation.reserved_bytes - d.a.fragmentation.reserved_bytes == 64 * kMiB);
  CHECK(render_diff_text(d).find("aten::linear") != std::string::npos);
  CHECK(render_diff_json(d).find("\"delta_bytes\":67108864") != std::string::npos);
  e.engine.free(base);
  e.engine.free(extra);
}

TEST_CASE("with the composer's trace ring, every event is recorded once, and the postmortem's floor is kept",
          "[engine][ring]") {
  TempDir dir;
  Setup config = classic_config(dir.file(""));
  config.engine.memory_limit_bytes = 64 * kMiB;
  config.forensics.trace_entries = 0;  // no history asked for: the postmortem still needs one
  config.forensics.record_ops = false;
  Engine e(config.engine);
  // The composer's ring (the torch adapter's: PyTorch's history), attached once.
  auto ring = std::make_shared<TraceRing>();
  ring->leave_oom_to_caller(true);
  e.engine.attach_observer(ring);
  {
    EngineForensics fx(e.engine, config.forensics, ring, "recycle:True,oom_report_dir:x");
    REQUIRE(fx.trace_ring() == ring.get());
    CHECK(ring->capacity() == EngineForensics::kPostmortemTrace);  // the postmortem's floor
    CHECK(ring->history().empty());   // nothing for PyTorch's history: it was not asked for

    void* p = e.engine.allocate(3 * kMiB, 0).ptr;
    REQUIRE(p != nullptr);
    REQUIRE(e.engine.free(p) == alloc::FreeStatus::ok);
    std::size_t allocs = 0;
    for (const auto& r : ring->records()) allocs += r.event.kind == alloc::EventKind::alloc;
    CHECK(allocs == 1);

    // The OOM: the caller records it (with the provider's free bytes) and the postmortem reads it.
    const alloc::AllocResult big = e.engine.allocate(100 * kMiB, 0);
    REQUIRE_FALSE(big.ok());
    alloc::AllocEvent fallback;
    fallback.kind = alloc::EventKind::oom;
    ring->record_oom(fallback, big.oom->provider.free_bytes);
    const auto records = ring->records();
    REQUIRE(records.back().event.kind == alloc::EventKind::oom);
    CHECK(records.back().event.requested_bytes == 100 * kMiB);  // the engine's event, not the fallback
    CHECK(std::count_if(records.begin(), records.end(),
                        [](const TraceRecord& r) { return r.event.kind == alloc::EventKind::oom; }) == 1);
    const auto files = fx.on_oom(*big.oom);
    REQUIRE(files.has_value());
    INFO(files->message);
    CHECK(files->verdict == "capacity");
    const Snapshot snap = load_snapshot(files->snapshot_path);
    CHECK(snap.gpumem.settings == "recycle:True,oom_report_dir:x");  // the composer's settings text
    REQUIRE_FALSE(snap.device_traces.empty());
    const auto& trace = snap.device_traces[0];
    CHECK(std::count_if(trace.begin(), trace.end(),
                        [](const SnapshotTraceEntry& t) { return t.action == TraceAction::oom; }) == 1);
  }
  // EngineForensics gone: the ring is the composer's again, without the floor.
  CHECK(ring->capacity() == 0);
  CHECK_FALSE(ring->active());
}

TEST_CASE("a private pool's engine: snapshots hold its segments tagged with its pool, the report totals each pool",
          "[engine][snapshot][pools]") {
  // The torch adapter's graph pools: an engine per private pool, sharing the device's trace ring.
  Setup config = classic_config("");
  config.engine.expandable_segments = true;
  Engine main_engine(config.engine);
  Engine pool_engine(config.engine);
  auto ring = std::make_shared<TraceRing>(100000, true);
  main_engine.engine.attach_observer(ring);
  pool_engine.engine.attach_observer(ring);
  EngineForensics fx(main_engine.engine, config.forensics, ring, "");
  const std::pair<std::int64_t, std::int64_t> pool_id{0, 7};
  fx.set_pool_engines([&] {
    std::vector<PoolEngineView> pools(1);
    pools[0].pool_id = pool_id;
    pools[0].engine = pool_engine.engine.snapshot();
    return pools;
  });

  void* outside = nullptr;
  void* inside = nullptr;
  {
    ScopedOp op("aten::mm");
    outside = main_engine.engine.allocate(6 * kMiB, 0).ptr;
  }
  {
    ScopedOp op("aten::relu");
    inside = pool_engine.engine.allocate(3 * kMiB, 0).ptr;
  }
  REQUIRE((outside != nullptr && inside != nullptr));
  const Snapshot snap = fx.snapshot();
  std::uint64_t pool_reserved = 0;
  bool found_inside = false, found_outside = false;
  for (const auto& seg : snap.segments) {
    for (const auto& b : seg.blocks) {
      if (b.address == reinterpret_cast<std::uintptr_t>(inside)) {
        found_inside = true;
        CHECK(seg.pool_id == pool_id);
        CHECK(b.op == "aten::relu");  // the shared ring's record, matched by seq and address
      }
      if (b.address == reinterpret_cast<std::uintptr_t>(outside)) {
        found_outside = true;
        CHECK(seg.pool_id == std::pair<std::int64_t, std::int64_t>{0, 0});
        CHECK(b.op == "aten::mm");
      }
    }
    if (seg.pool_id == pool_id) pool_reserved += seg.total_size_bytes;
  }
  CHECK(found_inside);
  CHECK(found_outside);
  CHECK(pool_reserved == pool_engine.engine.totals().reserved_bytes);

  // Through a file, as `gpumem report` reads it: one row per pool.
  TempDir dir;
  const std::string path = dir.file("pools.pickle");
  write_snapshot(snap, path);
  ReportOptions options;
  options.replay = false;
  const MemoryReport rep = build_report(load_snapshot(path), options);
  REQUIRE(rep.pools.size() == 2);
  CHECK(rep.pools[0].pool_id == std::pair<std::int64_t, std::int64_t>{0, 0});
  CHECK(rep.pools[0].reserved_bytes == main_engine.engine.totals().reserved_bytes);
  CHECK(rep.pools[0].allocated_bytes == main_engine.engine.totals().allocated_bytes);
  CHECK(rep.pools[1].pool_id == pool_id);
  CHECK(rep.pools[1].reserved_bytes == pool_engine.engine.totals().reserved_bytes);
  CHECK(rep.pools[1].allocated_bytes == pool_engine.engine.totals().allocated_bytes);
  CHECK(rep.fragmentation.reserved_bytes ==
        main_engine.engine.totals().reserved_bytes + pool_engine.engine.totals().reserved_bytes);
  const std::string text = render_report_text(rep);
  CHECK(text.find("memory by pool") != std::string::npos);
  CHECK(text.find("private pool (0, 7)") != std::string::npos);
  CHECK(render_report_json(rep).find("\"pool_id\":[0,7]") != std::string::npos);

  main_engine.engine.free(outside);
  pool_engine.engine.free(inside);
  main_engine.engine.detach_observer(ring.get());
  pool_engine.engine.detach_observer(ring.get());
}

TEST_CASE("a snapshot's trace holds the allocation of every live block after the ring evicted it", "[engine][ring]") {
  alloc::Config ec;
  ec.va_reserve_bytes = 1024 * kMiB;
  ec.thread_cache = false;
  Engine e(ec);
  forensics::Config fc;
  fc.trace_entries = 64;  // far fewer records than the program makes
  fc.record_ops = true;
  EngineForensics fx(e.engine, fc);
  std::vector<void*> kept;
  {
    ScopedOp op("test::kept");
    for (std::size_t i = 0; i < 10; ++i) kept.push_back(e.engine.allocate((i + 1) * 4096 + 7, 0).ptr);
  }
  {
    ScopedOp op("test::churn");
    for (int i = 0; i < 500; ++i) e.engine.free(e.engine.allocate(8192, 0).ptr);
  }
  REQUIRE(fx.trace_ring()->dropped() > 0);
  const Snapshot snap = fx.snapshot();
  REQUIRE(!snap.device_traces.empty());
  const auto& trace = snap.device_traces.front();
  REQUIRE(trace.size() > 10);
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const auto it = std::find_if(trace.begin(), trace.end(), [&](const SnapshotTraceEntry& t) {
      return t.action == TraceAction::alloc && t.addr == reinterpret_cast<std::uintptr_t>(kept[i]);
    });
    REQUIRE(it != trace.end());
    CHECK(it->size_bytes == (i + 1) * 4096 + 7);
    CHECK(it->op == "test::kept");
  }
  // In time order, the kept blocks first (they are older than every record the ring holds).
  CHECK(std::is_sorted(trace.begin(), trace.end(),
                       [](const SnapshotTraceEntry& a, const SnapshotTraceEntry& b) { return a.time_us < b.time_us; }));
  CHECK(trace.front().addr == reinterpret_cast<std::uintptr_t>(kept.front()));
  // Blocks freed since are not brought back: only the 10 kept ones precede the ring's window.
  CHECK(trace.size() == 10 + fx.trace_ring()->size());
  for (void* p : kept) e.engine.free(p);
}
