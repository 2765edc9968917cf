// The observers on handmade event streams: TraceRing's bounds, order and
// op tags (also under concurrent publishers), its history settings, hooks, attached notes and the
// floor a postmortem keeps, FragmentationTracker's counters and its flat live-block table, OpStack depth.
#include <memory>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/address_table.h"
#include "gpumem/forensics/fragmentation_tracker.h"
#include "gpumem/forensics/op_attribution.h"
#include "gpumem/forensics/alloc_context.h"
#include "gpumem/forensics/trace_ring.h"

using namespace gpumem;
using namespace gpumem::forensics;

namespace {

alloc::AllocEvent ev(alloc::EventKind kind, std::uintptr_t addr, std::size_t size, std::uint64_t seq) {
  alloc::AllocEvent e;
  e.kind = kind;
  e.addr = addr;
  e.size_bytes = size;
  e.requested_bytes = size;
  e.seq = seq;
  return e;
}

}  // namespace

TEST_CASE("TraceRing keeps the newest records, oldest first, and counts what it dropped", "[ring]") {
  TraceRing ring(4);
  std::vector<alloc::AllocEvent> batch;
  for (std::uint64_t i = 0; i < 6; ++i) batch.push_back(ev(alloc::EventKind::alloc, 0x1000 + i, 512, i));
  ring.on_events(batch);
  const auto recs = ring.records();
  REQUIRE(recs.size() == 4);
  CHECK(recs.front().event.seq == 2);
  CHECK(recs.back().event.seq == 5);
  CHECK(ring.dropped() == 2);
  CHECK(recs.front().op == 0);  // ops not recorded
  ring.clear();
  CHECK(ring.size() == 0);
}

TEST_CASE("TraceRing tags events with the publishing thread's op and scope", "[ring][ops]") {
  TraceRing ring(1000, /*record_ops=*/true);
  auto publish = [&](int thread) {
    ScopedOp scope(thread == 0 ? "step0" : "step1", true);
    ScopedOp op(thread == 0 ? "aten::mm" : "aten::conv2d");
    for (std::uint64_t i = 0; i < 100; ++i) {
      alloc::AllocEvent e = ev(alloc::EventKind::alloc, 0x1000 + i, 512, i);
      e.device = static_cast<std::int8_t>(thread);
      ring.on_events(std::span<const alloc::AllocEvent>(&e, 1));
    }
  };
  std::thread t0(publish, 0), t1(publish, 1);
  t0.join();
  t1.join();
  const auto recs = ring.records();
  REQUIRE(recs.size() == 200);
  const auto& reg = OpRegistry::global();
  for (const auto& r : recs) {
    if (r.event.device == 0) {
      CHECK(reg.name(r.op) == "aten::mm");
      CHECK(reg.name(r.scope) == "step0");
    } else {
      CHECK(reg.name(r.op) == "aten::conv2d");
      CHECK(reg.name(r.scope) == "step1");
    }
  }
  CHECK(OpStack::current_op() == 0);  // the main thread is in no op
}

std::vector<std::uint64_t> seqs(const std::vector<TraceRecord>& records) {
  std::vector<std::uint64_t> out;
  for (const auto& r : records) out.push_back(r.event.seq);
  return out;
}

TEST_CASE("TraceRing keeps nothing and costs one load while inactive", "[ring]") {
  TraceRing ring;
  CHECK_FALSE(ring.active());
  std::vector<alloc::AllocEvent> events{ev(alloc::EventKind::alloc, 0x1000, 512, 1)};
  ring.on_events(events);
  CHECK(ring.records().empty());
  CHECK(ring.history().empty());
}

TEST_CASE("TraceRing history overwrites the oldest records and returns them oldest first", "[ring]") {
  TraceRing ring;
  ring.configure(TraceSettings{3, 0, false}, true);
  REQUIRE(ring.active());
  for (std::uint64_t i = 1; i <= 5; ++i) {
    std::vector<alloc::AllocEvent> batch{ev(alloc::EventKind::alloc, 0x1000 * i, 512, i)};
    ring.on_events(batch);
  }
  CHECK(seqs(ring.history()) == std::vector<std::uint64_t>{3, 4, 5});
  CHECK(seqs(ring.records()) == std::vector<std::uint64_t>{3, 4, 5});

  SECTION("a larger capacity keeps the order and grows") {
    ring.configure(TraceSettings{5, 0, false}, false);
    std::vector<alloc::AllocEvent> batch{ev(alloc::EventKind::free_requested, 0x1000, 512, 6)};
    ring.on_events(batch);
    CHECK(seqs(ring.history()) == std::vector<std::uint64_t>{3, 4, 5, 6});
  }
  SECTION("a smaller capacity keeps the newest records that fit") {
    ring.configure(TraceSettings{2, 0, false}, false);
    CHECK(seqs(ring.history()) == std::vector<std::uint64_t>{4, 5});
  }
  SECTION("clear drops everything") {
    ring.configure(TraceSettings{3, 0, false}, true);
    CHECK(ring.history().empty());
    CHECK(ring.records().empty());
  }
}

TEST_CASE("TraceRing skips masked kinds and leaves the engine's oom event to the caller", "[ring]") {
  TraceRing ring;
  ring.leave_oom_to_caller(true);
  ring.configure(TraceSettings{10, skip_bit(alloc::EventKind::free_requested), false}, true);
  std::vector<alloc::AllocEvent> batch{ev(alloc::EventKind::alloc, 0x1000, 512, 1),
                                       ev(alloc::EventKind::free_requested, 0x1000, 512, 2),
                                       ev(alloc::EventKind::free_completed, 0x1000, 512, 3),
                                       ev(alloc::EventKind::oom, 0, 4096, 4)};
  ring.on_events(batch);
  CHECK(seqs(ring.history()) == std::vector<std::uint64_t>{1, 3});

  // The caller adds the oom record: the engine's event (its seq), with the provider's free bytes.
  ring.record_oom(ev(alloc::EventKind::oom, 0, 4096, 0), 12345);
  const auto records = ring.history();
  REQUIRE(records.size() == 3);
  CHECK(records.back().event.kind == alloc::EventKind::oom);
  CHECK(records.back().event.seq == 4);
  CHECK(records.back().device_free_bytes() == 12345);

  // With no engine event held on this thread, the caller's own event is kept.
  ring.record_oom(ev(alloc::EventKind::oom, 0, 8192, 9), 777);
  CHECK(ring.history().back().event.seq == 9);
  CHECK(ring.history().back().device_free_bytes() == 777);
}

TEST_CASE("TraceRing keeps the engine's oom event itself by default", "[ring]") {
  TraceRing ring(8);
  std::vector<alloc::AllocEvent> batch{ev(alloc::EventKind::alloc, 0x1000, 512, 1), ev(alloc::EventKind::oom, 0, 4096, 2)};
  ring.on_events(batch);
  CHECK(seqs(ring.records()) == std::vector<std::uint64_t>{1, 2});
  CHECK(ring.records().back().device_free_bytes() == 0);
}

TEST_CASE("TraceRing attaches the thread's context to alloc records only when asked", "[ring]") {
  TraceRing ring;
  auto context = std::make_shared<int>(42);
  std::vector<alloc::AllocEvent> batch{ev(alloc::EventKind::alloc, 0x1000, 512, 1),
                                       ev(alloc::EventKind::free_requested, 0x1000, 512, 2)};

  ring.configure(TraceSettings{10, 0, true}, true);
  {
    AllocContext::Scope scope(context);
    ring.on_events(batch);
  }
  auto records = ring.history();
  REQUIRE(records.size() == 2);
  CHECK(records[0].stack_context() == context);
  CHECK(records[1].stack_context() == nullptr);

  // Outside the scope nothing is attached.
  ring.on_events(batch);
  CHECK(ring.history()[2].stack_context() == nullptr);

  // The adapter's form: set before the engine call, cleared after it.
  TraceRing::set_thread_context(context);
  ring.on_events(batch);
  TraceRing::set_thread_context(nullptr);
  CHECK(ring.history()[4].stack_context() == context);

  ring.configure(TraceSettings{10, 0, false}, true);
  AllocContext::Scope scope(context);
  ring.on_events(batch);
  CHECK(ring.history()[0].stack_context() == nullptr);
}

TEST_CASE("TraceRing hooks see records even at capacity 0, with metadata and compile context", "[ring]") {
  TraceRing ring;
  std::vector<TraceRecord> seen;
  ring.add_hook([&](const TraceRecord& r) { seen.push_back(r); });
  REQUIRE(ring.active());
  ring.set_user_metadata("step=3");
  ring.push_compile_context("graph_1");
  std::vector<alloc::AllocEvent> batch{ev(alloc::EventKind::alloc, 0x1000, 512, 1)};
  ring.on_events(batch);
  ring.pop_compile_context();
  ring.on_events(batch);
  CHECK(ring.history().empty());
  CHECK(ring.records().empty());
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].user_metadata() == "step=3");
  CHECK(seen[0].compile_context() == "graph_1");
  CHECK(seen[1].compile_context().empty());
  CHECK(seen[1].user_metadata() == "step=3");
}

TEST_CASE("TraceRing keeps the postmortem's floor whatever the history settings, and records once",
          "[ring]") {
  TraceRing ring;
  ring.keep_at_least(4);
  ring.configure(TraceSettings{2, skip_bit(alloc::EventKind::free_requested), false}, true);
  REQUIRE(ring.active());
  std::vector<alloc::AllocEvent> batch;
  for (std::uint64_t i = 1; i <= 6; ++i)
    batch.push_back(ev(i % 2 ? alloc::EventKind::alloc : alloc::EventKind::free_requested, 0x1000 * i, 512, i));
  ring.on_events(batch);
  // Every kind is kept for the floor; the history shows only what its settings ask for.
  CHECK(seqs(ring.records()) == std::vector<std::uint64_t>{3, 4, 5, 6});
  CHECK(seqs(ring.history()) == std::vector<std::uint64_t>{3, 5});
  CHECK(ring.capacity() == 4);
  CHECK(ring.dropped() == 2);

  // Clearing the history leaves the postmortem's records.
  ring.configure(TraceSettings{2, 0, false}, true);
  CHECK(ring.history().empty());
  CHECK(ring.records().size() == 4);
  std::vector<alloc::AllocEvent> more{ev(alloc::EventKind::free_requested, 0x9000, 512, 7)};
  ring.on_events(more);
  CHECK(seqs(ring.history()) == std::vector<std::uint64_t>{7});

  // History off: the floor still records; PyTorch's view is empty.
  ring.configure(TraceSettings{0, 0, false}, true);
  ring.on_events(more);
  CHECK(ring.history().empty());
  CHECK(ring.records().back().event.seq == 7);
  CHECK(ring.records().size() == 4);

  // Without the floor and the history the ring is inactive again.
  ring.keep_at_least(0);
  CHECK_FALSE(ring.active());
}

TEST_CASE("OpStack: nesting deeper than kMaxDepth stays balanced", "[ops]") {
  const std::uint32_t outer = OpRegistry::global().intern("outer");
  const std::uint32_t inner = OpRegistry::global().intern("inner");
  OpStack::push_op(outer);
  for (std::size_t i = 0; i < OpStack::kMaxDepth + 10; ++i) OpStack::push_op(inner);
  CHECK(OpStack::current_op() == inner);
  for (std::size_t i = 0; i < OpStack::kMaxDepth + 10; ++i) OpStack::pop_op();
  CHECK(OpStack::current_op() == outer);
  OpStack::pop_op();
  CHECK(OpStack::current_op() == 0);
  CHECK(OpRegistry::global().intern("outer") == outer);
}

TEST_CASE("FragmentationTracker counts allocated, pending, reserved and the unallocated peak", "[tracker]") {
  FragmentationTracker t;
  std::vector<alloc::AllocEvent> events = {
      ev(alloc::EventKind::segment_alloc, 0x100000, 20 << 20, 1),
      ev(alloc::EventKind::alloc, 0x100000, 8 << 20, 2),
      ev(alloc::EventKind::alloc, 0x900000, 4 << 20, 3),
      ev(alloc::EventKind::free_requested, 0x100000, 8 << 20, 4),
  };
  t.on_events(events);
  auto c = t.counters();
  CHECK(c.allocated_bytes == 4u << 20);
  CHECK(c.pending_free_bytes == 8u << 20);
  CHECK(c.reserved_bytes == 20u << 20);
  CHECK(c.live_blocks == 1);
  CHECK(c.reserved_unallocated_bytes() == 16u << 20);
  REQUIRE(t.live_block(0x900000).has_value());
  CHECK(!t.live_block(0x100000).has_value());
  alloc::AllocEvent done = ev(alloc::EventKind::free_completed, 0x100000, 8 << 20, 5);
  alloc::AllocEvent seg_free = ev(alloc::EventKind::segment_free, 0x100000, 20 << 20, 6);
  t.on_events(std::span<const alloc::AllocEvent>(&done, 1));
  t.on_events(std::span<const alloc::AllocEvent>(&seg_free, 1));
  c = t.counters();
  CHECK(c.pending_free_bytes == 0);
  CHECK(c.reserved_bytes == 0);
  CHECK(c.peak_reserved_unallocated_bytes == 20u << 20);  // after the segment, before the allocs
  CHECK(c.peak_reserved_unallocated_seq == 1);
}

TEST_CASE("AddressTable agrees with a hash map under churn, across growth and wrap-around", "[tracker]") {
  alloc::AddressTable<std::uint64_t> table(16);  // small: growth and probe chains that wrap
  std::unordered_map<std::uintptr_t, std::uint64_t> model;
  std::mt19937_64 rng(5);
  // Addresses of a few segments, 512-byte aligned, so that many share a home slot's neighbourhood.
  auto random_addr = [&] { return std::uintptr_t{0x7f0000000000} + 512 * (rng() % 4096); };
  for (int step = 0; step < 200000; ++step) {
    const std::uintptr_t addr = random_addr();
    const std::size_t slot = table.find(addr);
    const auto it = model.find(addr);
    REQUIRE((slot != table.npos) == (it != model.end()));
    if (slot != table.npos) {
      REQUIRE(table.at(slot) == it->second);
      if (rng() % 3 != 0) {
        table.erase(slot);
        model.erase(it);
        continue;
      }
    }
    const std::uint64_t value = rng();
    table.assign(addr, value);
    model[addr] = value;
    REQUIRE(table.size() == model.size());
    REQUIRE(table.size() * 2 <= table.capacity());
  }
  std::size_t seen = 0;
  table.for_each([&](std::uintptr_t addr, std::uint64_t value) {
    ++seen;
    REQUIRE(model.count(addr) == 1);
    CHECK(model[addr] == value);
  });
  CHECK(seen == model.size());
  CHECK(table.find(0) == table.npos);
}

TEST_CASE("FragmentationTracker keeps thousands of live blocks with their op and drops them on free", "[tracker]") {
  FragmentationTracker t(/*record_ops=*/true);
  ScopedOp op("aten::mm");
  std::vector<alloc::AllocEvent> allocs;
  for (std::uint64_t i = 0; i < 20000; ++i) allocs.push_back(ev(alloc::EventKind::alloc, 0x10000000 + i * 512, 512, i + 1));
  t.on_events(allocs);
  CHECK(t.counters().live_blocks == 20000);
  CHECK(t.live_blocks().size() == 20000);
  REQUIRE(t.live_block(0x10000000 + 19999 * 512).has_value());
  CHECK(t.live_block(0x10000000 + 19999 * 512)->op == OpRegistry::global().intern("aten::mm"));
  std::vector<alloc::AllocEvent> frees;
  for (std::uint64_t i = 0; i < 20000; i += 2) frees.push_back(ev(alloc::EventKind::free_requested, 0x10000000 + i * 512, 512, 30000 + i));
  t.on_events(frees);
  CHECK(t.counters().live_blocks == 10000);
  CHECK(!t.live_block(0x10000000).has_value());
  CHECK(t.live_block(0x10000000 + 512).has_value());
  CHECK(t.counters().allocated_bytes == 10000u * 512);
}
