// The torch-free parts of the adapter: the trace ring, mapped runs of snapshot segments, and the
// pointer registry (with its registering source). No torch header here.
#include <algorithm>
#include <memory>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/sim_source.h"
#include "pointer_registry.h"
#include "snapshot_ranges.h"
#include "trace_ring.h"

using namespace gpumem;
using gpumem::torch::detail::TraceRecord;
using gpumem::torch::detail::TraceRing;
using gpumem::torch::detail::TraceSettings;

namespace {

alloc::AllocEvent event(alloc::EventKind kind, std::uintptr_t addr, std::uint64_t seq) {
  alloc::AllocEvent e;
  e.kind = kind;
  e.addr = addr;
  e.size_bytes = 512;
  e.seq = seq;
  return e;
}

std::vector<std::uint64_t> seqs(const std::vector<TraceRecord>& records) {
  std::vector<std::uint64_t> out;
  for (const auto& r : records) out.push_back(r.event.seq);
  return out;
}

}  // namespace

TEST_CASE("trace ring keeps nothing and costs one load while inactive") {
  TraceRing ring;
  CHECK_FALSE(ring.active());
  std::vector<alloc::AllocEvent> events{event(alloc::EventKind::alloc, 0x1000, 1)};
  ring.on_events(events);
  CHECK(ring.records().empty());
}

TEST_CASE("trace ring overwrites the oldest records and returns them oldest first") {
  TraceRing ring;
  ring.configure(TraceSettings{3, 0, false}, true);
  REQUIRE(ring.active());
  for (std::uint64_t i = 1; i <= 5; ++i) {
    std::vector<alloc::AllocEvent> batch{event(alloc::EventKind::alloc, 0x1000 * i, i)};
    ring.on_events(batch);
  }
  CHECK(seqs(ring.records()) == std::vector<std::uint64_t>{3, 4, 5});

  SECTION("a larger capacity keeps the order and grows") {
    ring.configure(TraceSettings{5, 0, false}, false);
    std::vector<alloc::AllocEvent> batch{event(alloc::EventKind::free_requested, 0x1000, 6)};
    ring.on_events(batch);
    CHECK(seqs(ring.records()) == std::vector<std::uint64_t>{3, 4, 5, 6});
  }
  SECTION("clear drops everything") {
    ring.configure(TraceSettings{3, 0, false}, true);
    CHECK(ring.records().empty());
  }
}

TEST_CASE("trace ring skips masked kinds and leaves the engine's oom event to the adapter") {
  TraceRing ring;
  ring.configure(TraceSettings{10, gpumem::torch::detail::skip_bit(alloc::EventKind::free_requested), false}, true);
  std::vector<alloc::AllocEvent> batch{event(alloc::EventKind::alloc, 0x1000, 1),
                                       event(alloc::EventKind::free_requested, 0x1000, 2),
                                       event(alloc::EventKind::free_completed, 0x1000, 3),
                                       event(alloc::EventKind::oom, 0, 4)};
  ring.on_events(batch);
  CHECK(seqs(ring.records()) == std::vector<std::uint64_t>{1, 3});

  TraceRecord oom;
  oom.event = event(alloc::EventKind::oom, 0, 5);
  oom.device_free_bytes = 12345;
  ring.record(oom);
  const auto records = ring.records();
  REQUIRE(records.size() == 3);
  CHECK(records.back().device_free_bytes == 12345);
}

TEST_CASE("trace ring attaches the thread's context to alloc records only when asked") {
  TraceRing ring;
  auto context = std::make_shared<int>(42);
  std::vector<alloc::AllocEvent> batch{event(alloc::EventKind::alloc, 0x1000, 1),
                                       event(alloc::EventKind::free_requested, 0x1000, 2)};

  ring.configure(TraceSettings{10, 0, true}, true);
  TraceRing::set_thread_context(context);
  ring.on_events(batch);
  auto records = ring.records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].context == context);
  CHECK(records[1].context == nullptr);

  // The context is consumed by the batch it was set for.
  ring.on_events(batch);
  CHECK(ring.records()[2].context == nullptr);

  ring.configure(TraceSettings{10, 0, false}, true);
  TraceRing::set_thread_context(context);
  ring.on_events(batch);
  CHECK(ring.records()[0].context == nullptr);
  TraceRing::set_thread_context(nullptr);
}

TEST_CASE("trace ring hooks see records even at capacity 0, with metadata and compile context") {
  TraceRing ring;
  std::vector<TraceRecord> seen;
  ring.add_hook([&](const TraceRecord& r) { seen.push_back(r); });
  REQUIRE(ring.active());
  ring.set_user_metadata("step=3");
  ring.push_compile_context("graph_1");
  std::vector<alloc::AllocEvent> batch{event(alloc::EventKind::alloc, 0x1000, 1)};
  ring.on_events(batch);
  ring.pop_compile_context();
  ring.on_events(batch);
  CHECK(ring.records().empty());
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].user_metadata == "step=3");
  CHECK(seen[0].compile_context == "graph_1");
  CHECK(seen[1].compile_context.empty());
}

TEST_CASE("mapped runs split expandable regions at unmapped blocks and tile each run") {
  alloc::SegmentView segment;
  segment.base = 0x10000000;
  segment.expandable = true;
  auto add = [&](std::size_t size, alloc::BlockState state, std::size_t requested = 0) {
    std::uintptr_t addr = segment.base + segment.size_bytes;
    segment.blocks.push_back(alloc::BlockView{addr, size, requested, state, 0});
    segment.size_bytes += size;
  };
  add(1024, alloc::BlockState::allocated, 1000);
  add(2048, alloc::BlockState::free);
  add(512, alloc::BlockState::pending_free, 500);
  add(4096, alloc::BlockState::unmapped);
  add(512, alloc::BlockState::allocated, 512);
  add(8192, alloc::BlockState::unmapped);

  const auto runs = gpumem::torch::detail::mapped_runs(segment);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].base == segment.base);
  CHECK(runs[0].size_bytes == 1024 + 2048 + 512);
  CHECK(runs[0].allocated_bytes == 1024);
  CHECK(runs[0].active_bytes == 1024 + 512);
  CHECK(runs[0].requested_bytes == 1000);
  CHECK(runs[0].blocks.size() == 3);
  CHECK(runs[1].base == segment.base + 1024 + 2048 + 512 + 4096);
  CHECK(runs[1].size_bytes == 512);
  for (const auto& run : runs) {
    std::uintptr_t next = run.base;
    for (const auto& b : run.blocks) {
      CHECK(b.addr == next);
      next += b.size_bytes;
    }
    CHECK(next == run.base + run.size_bytes);
  }
}

TEST_CASE("pointer registry answers the owner of addresses inside registered ranges") {
  gpumem::torch::detail::PointerRegistry registry;
  registry.add(alloc::VaRange{0x1000, 0x1000}, 0);
  registry.add(alloc::VaRange{0x4000, 0x2000}, 3);
  CHECK(registry.owner_of(reinterpret_cast<void*>(0x0fff)) == -1);
  CHECK(registry.owner_of(reinterpret_cast<void*>(0x1000)) == 0);
  CHECK(registry.owner_of(reinterpret_cast<void*>(0x1fff)) == 0);
  CHECK(registry.owner_of(reinterpret_cast<void*>(0x2000)) == -1);
  CHECK(registry.owner_of(reinterpret_cast<void*>(0x5fff)) == 3);
  CHECK(registry.owner_of(reinterpret_cast<void*>(0x6000)) == -1);
  registry.remove(alloc::VaRange{0x4000, 0x2000});
  CHECK(registry.owner_of(reinterpret_cast<void*>(0x4000)) == -1);
  CHECK(registry.ranges() == 1);
}

TEST_CASE("registering source records what its inner source reserves, until released") {
  gpumem::torch::detail::PointerRegistry registry;
  gpumem::torch::detail::RegisteringSource source(std::make_unique<alloc::SimSource>(), registry, 7);
  auto range = source.reserve(std::size_t{64} << 20, 0);
  REQUIRE(range.ok());
  CHECK(registry.owner_of(reinterpret_cast<void*>(range.value.base + 12345)) == 7);
  auto piece = source.create(std::size_t{2} << 20);
  REQUIRE(piece.ok());
  REQUIRE(source.map(range.value.base, std::size_t{2} << 20, piece.value) == alloc::SourceStatus::ok);
  REQUIRE(source.unmap(range.value.base, std::size_t{2} << 20) == alloc::SourceStatus::ok);
  REQUIRE(source.destroy(piece.value) == alloc::SourceStatus::ok);
  REQUIRE(source.release(range.value) == alloc::SourceStatus::ok);
  CHECK(registry.owner_of(reinterpret_cast<void*>(range.value.base)) == -1);
  CHECK(std::string(source.caps().name) == "sim");
}
