// MemoryState: segments and live blocks rebuilt from trace entries.
#include "catch.h"
#include "gpumem/view/memory_state.h"
#include "viewer_test_support.h"

using namespace gpumem::view;
using namespace gpumem::view::testing;

TEST_CASE("applying the handmade trace gives the expected layout", "[viewer][state]") {
  const auto t = handmade_trace();
  MemoryState s;
  for (std::size_t i = 0; i < t.entries.size(); ++i) {
    s.apply(t.entries[i], i);
    REQUIRE(s.check_invariants());
  }
  CHECK(s.segments.size() == 2);
  CHECK(s.reserved_bytes == 10 * kMiB);
  CHECK(s.allocated_bytes == 7 * kMiB);
  CHECK(s.blocks.size() == 3);
  CHECK(largest_free_extent(s) == 2 * kMiB);
  const auto xs = extents_of(s, kSeg1, s.segments.at(kSeg1));
  REQUIRE(xs.size() == 4);
  CHECK((xs[0].live && xs[0].size_bytes == 2 * kMiB));
  CHECK((!xs[1].live && xs[1].addr == kSeg1 + 2 * kMiB && xs[1].size_bytes == kMiB));
  CHECK((xs[2].live && xs[2].size_bytes == 3 * kMiB));
  CHECK((!xs[3].live && xs[3].size_bytes == 2 * kMiB));
}

TEST_CASE("requests are rounded to PyTorch's 512-byte blocks", "[viewer][state]") {
  CHECK(block_bytes_for(1) == 512);
  CHECK(block_bytes_for(512) == 512);
  CHECK(block_bytes_for(513) == 1024);
  MemoryState s;
  s.add_segment(0x1000, 4096, SegmentInfo{4096, 0, false});
  gpumem::forensics::TraceEntry e;
  e.addr = 0x1000;
  e.size_bytes = 100;
  s.apply(e, 0);
  CHECK(s.allocated_bytes == 512);
  s.apply(e, 1, 2048);  // a real size from a snapshot wins
  CHECK(s.allocated_bytes == 2048);
  CHECK(s.check_invariants());
}

TEST_CASE("expandable mappings merge, unmaps carve", "[viewer][state]") {
  MemoryState s;
  Trace t;
  add(t, TraceAction::segment_map, kSeg1, 2 * kMiB, 1);
  add(t, TraceAction::segment_map, kSeg1 + 2 * kMiB, 4 * kMiB, 2);
  add(t, TraceAction::segment_map, kSeg1 + 8 * kMiB, 2 * kMiB, 3);  // not adjacent
  add(t, TraceAction::segment_unmap, kSeg1 + 2 * kMiB, 2 * kMiB, 4);
  for (std::size_t i = 0; i < 3; ++i) s.apply(t.entries[i], i);
  CHECK(s.segments.size() == 2);
  CHECK(s.segments.at(kSeg1).size_bytes == 6 * kMiB);
  CHECK(s.segments.at(kSeg1).expandable);
  s.apply(t.entries[3], 3);
  REQUIRE(s.segments.size() == 3);
  CHECK(s.segments.at(kSeg1).size_bytes == 2 * kMiB);
  CHECK(s.segments.at(kSeg1 + 4 * kMiB).size_bytes == 2 * kMiB);
  CHECK(s.reserved_bytes == 6 * kMiB);
  CHECK(s.check_invariants());
}

TEST_CASE("undo reverses apply", "[viewer][state]") {
  const auto t = handmade_trace();
  MemoryState s;
  std::vector<MemoryState> before;
  for (std::size_t i = 0; i < t.entries.size(); ++i) {
    before.push_back(s);
    s.apply(t.entries[i], i);
  }
  for (std::size_t i = t.entries.size(); i-- > 0;) {
    s.undo(t.entries[i]);
    REQUIRE(s.check_invariants());
    CHECK(s.allocated_bytes == before[i].allocated_bytes);
    CHECK(s.reserved_bytes == before[i].reserved_bytes);
    CHECK(s.segments.size() == before[i].segments.size());
    CHECK(s.blocks.size() == before[i].blocks.size());
  }
}

TEST_CASE("frees of unknown addresses are ignored", "[viewer][state]") {
  MemoryState s;
  Trace t;
  add(t, TraceAction::free_completed, 0x1234, 512, 1);
  s.apply(t.entries[0], 0);
  CHECK(s.blocks.empty());
  CHECK(s.allocated_bytes == 0);
}

TEST_CASE("unmapped ranges of an expandable segment stay in its address range", "[viewer][state]") {
  MemoryState s;
  Trace t;
  add(t, TraceAction::segment_map, kSeg1, 6 * kMiB, 1);
  add(t, TraceAction::segment_unmap, kSeg1 + 2 * kMiB, 2 * kMiB, 2);
  for (std::size_t i = 0; i < 2; ++i) s.apply(t.entries[i], i);
  REQUIRE(s.check_invariants());
  REQUIRE(s.expandable_va.size() == 1);
  CHECK(s.expandable_va.at(kSeg1) == kSeg1 + 6 * kMiB);
  CHECK(s.reserved_bytes == 4 * kMiB);
  s.reset_expandable_va();
  CHECK(s.expandable_va.size() == 2);
  CHECK(s.check_invariants());
}
