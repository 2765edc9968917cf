// The observers on handmade event streams: OpTableBuilder's rows, TraceRing's bounds, order and
// op tags (also under concurrent publishers), FragmentationTracker's counters, OpStack depth.
#include <thread>

#include "catch.h"
#include "gpumem/forensics/fragmentation_tracker.h"
#include "gpumem/forensics/op_attribution.h"
#include "gpumem/forensics/op_table.h"
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

const OpRow& row(const std::vector<OpRow>& rows, const std::string& name) {
  for (const auto& r : rows) {
    if (r.name == name) return r;
  }
  FAIL("no row " << name);
  return rows.front();
}

}  // namespace

TEST_CASE("OpTableBuilder: calls, bytes, live, peak contribution, reserved growth, fragmentation", "[ops]") {
  OpTableBuilder b;
  // mm grows reserved by 100 and allocates 60 and 30; relu allocates 10; mm frees its 60 later.
  b.add(TraceAction::segment_alloc, "aten::mm", 1000, 100);
  b.add(TraceAction::alloc, "aten::mm", 1000, 60);
  b.add(TraceAction::alloc, "aten::mm", 1060, 30);
  b.add(TraceAction::alloc, "aten::relu", 1090, 10);  // peak: 100 live (mm 90, relu 10)
  b.add(TraceAction::free_completed, "aten::add", 1000, 60);
  b.add(TraceAction::alloc, "aten::add", 1000, 20);
  const auto rows = b.rows();
  const auto& mm = row(rows, "aten::mm");
  CHECK(mm.calls == 1);
  CHECK(mm.allocs == 2);
  CHECK(mm.allocated_bytes == 90);
  CHECK(mm.live_bytes == 30);  // the free is charged to the allocation's op
  CHECK(mm.peak_contribution_bytes == 90);
  CHECK(mm.reserved_growth_bytes == 100);
  // mm's call: reserved - live went from 0 to 100 - 90 = 10.
  CHECK(mm.frag_delta_bytes == 10);
  CHECK(mm.worst_call_frag_before_bytes == 0);
  CHECK(mm.worst_call_frag_after_bytes == 10);
  const auto& relu = row(rows, "aten::relu");
  CHECK(relu.peak_contribution_bytes == 10);
  CHECK(relu.frag_delta_bytes == -10);
  const auto& add = row(rows, "aten::add");
  CHECK(add.calls == 1);
  CHECK(add.live_bytes == 20);
  CHECK(add.frag_delta_bytes == 40);  // freed 60, took 20
  CHECK(b.live_bytes() == 60);
  CHECK(b.peak_live_bytes() == 100);
  std::uint64_t live = 0, peak = 0;
  for (const auto& r : rows) {
    live += r.live_bytes;
    peak += r.peak_contribution_bytes;
  }
  CHECK(live == b.live_bytes());
  CHECK(peak == b.peak_live_bytes());
  CHECK(rows.front().name == "aten::mm");  // largest allocated first
}

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
