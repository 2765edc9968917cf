// The torch-free parts of the adapter: mapped runs of snapshot segments, the pointer registry
// (with its registering source), when a device's trace ring is attached to its engine, and when
// the current device is asked for. No
// torch header here. (The trace ring the adapter uses is forensics' TraceRing:
// tests/forensics/test_observers.cpp.)
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "catch.h"
#include "current_device.h"
#include "device_engine.h"
#include "gpumem/alloc/sim_source.h"
#include "pointer_registry.h"
#include "snapshot_ranges.h"

using namespace gpumem;

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

TEST_CASE("a device's trace ring is attached to its engine only while it records") {
  ::setenv("GPUMEM_ALLOW_SIM", "1", 1);
  auto parsed = gpumem::torch::parse_config("source:sim");
  REQUIRE(std::holds_alternative<gpumem::torch::Config>(parsed));
  gpumem::torch::detail::PointerRegistry registry;
  std::string error;
  auto de = gpumem::torch::detail::make_cuda_engine(std::get<gpumem::torch::Config>(parsed), 5, registry, &error);
  REQUIRE(de != nullptr);
  auto pair = [&] {
    const alloc::AllocResult r = de->engine->allocate(4096, 0);
    REQUIRE(r.ok());
    REQUIRE(de->engine->free(r.ptr) == alloc::FreeStatus::ok);
  };
  forensics::TraceSettings on;
  on.capacity = 100;

  // trace_entries:0 and no hook: the ring is idle, so it is not attached. Turned on behind the
  // adapter's back (no sync), it still sees nothing: attachment is what feeds it.
  pair();
  de->trace->configure(on, /*clear=*/true);
  pair();
  CHECK(de->trace->history().empty());

  // Synced while it records: every call reaches it (alloc, free_requested, free_completed).
  de->sync_trace_observer();
  de->sync_trace_observer();  // idempotent: attached once
  pair();
  CHECK(de->trace->history().size() == 3);

  // Off and synced: detached; turned on again without a sync, it sees nothing new.
  de->trace->configure(forensics::TraceSettings{}, /*clear=*/true);
  de->sync_trace_observer();
  pair();
  de->trace->configure(on, /*clear=*/true);
  pair();
  CHECK(de->trace->history().empty());
  de->sync_trace_observer();
  pair();
  CHECK(de->trace->history().size() == 3);
}

TEST_CASE("the current device is asked for unless exactly one device is visible") {
  int asked = 0;
  auto ask = [&] {
    ++asked;
    return static_cast<signed char>(3);  // c10's answer on a machine with several devices
  };
  // One visible device: it is device 0, and nobody is asked.
  CHECK(gpumem::torch::detail::current_device_of(1, ask) == 0);
  CHECK(asked == 0);
  // Several devices: c10 answers, every time (the thread may have switched devices since).
  CHECK(gpumem::torch::detail::current_device_of(2, ask) == 3);
  CHECK(gpumem::torch::detail::current_device_of(8, ask) == 3);
  CHECK(asked == 2);
  // Before init() says how many: c10 answers.
  CHECK(gpumem::torch::detail::current_device_of(0, ask) == 3);
  CHECK(asked == 3);
}
