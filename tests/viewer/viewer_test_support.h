// Helpers shared by the viewer tests: a small handmade trace with a known layout, golden frame
// comparison, and where the shared traces are.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "catch.h"
#include "gpumem/forensics/trace.h"
#include "gpumem/view/viewer_model.h"

namespace gpumem::view::testing {

using forensics::Trace;
using forensics::TraceAction;

constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kSeg1 = 0x7f0000000000;
constexpr std::uint64_t kSeg2 = 0x7f0010000000;

inline void add(Trace& t, TraceAction a, std::uint64_t addr, std::uint64_t size, std::int64_t t_us,
                std::string_view where = "") {
  forensics::TraceEntry e;
  e.action = a;
  e.addr = addr;
  e.size_bytes = size;
  e.time_us = t_us;
  e.site = t.intern_site(where);
  t.entries.push_back(e);
}

// One entry of a snapshot's device trace.
inline forensics::SnapshotTraceEntry snapshot_entry(TraceAction action, std::uint64_t addr, std::uint64_t size,
                                                    std::int64_t t_us, std::string op) {
  forensics::SnapshotTraceEntry e;
  e.action = action;
  e.addr = addr;
  e.size_bytes = size;
  e.time_us = t_us;
  e.op = std::move(op);
  return e;
}

// Segment 1 (8 MiB): a 2 MiB | (b 1 MiB, freed) | c 3 MiB | 2 MiB free.
// Segment 2 (2 MiB): d 2 MiB. Then an OOM asking for 2.5 MiB: 3 MiB are reserved but unallocated,
// the largest free extent is 2 MiB: fragmentation.
inline Trace handmade_trace() {
  Trace t;
  t.source = "handmade.csv";
  add(t, TraceAction::segment_alloc, kSeg1, 8 * kMiB, 1000);
  add(t, TraceAction::alloc, kSeg1, 2 * kMiB, 1010, "model.py:10:forward");
  add(t, TraceAction::alloc, kSeg1 + 2 * kMiB, 1 * kMiB, 1020, "model.py:20:backward");
  add(t, TraceAction::alloc, kSeg1 + 3 * kMiB, 3 * kMiB, 1030, "model.py:10:forward");
  add(t, TraceAction::free_requested, kSeg1 + 2 * kMiB, 1 * kMiB, 1040, "model.py:20:backward");
  add(t, TraceAction::free_completed, kSeg1 + 2 * kMiB, 1 * kMiB, 1041, "model.py:20:backward");
  add(t, TraceAction::segment_alloc, kSeg2, 2 * kMiB, 2000);
  add(t, TraceAction::alloc, kSeg2, 2 * kMiB, 2001, "optim.py:5:step");
  add(t, TraceAction::oom, 0, 5 * kMiB / 2, 3000, "model.py:30:forward");
  return t;
}

// The snapshot PyTorch would write at the end of handmade_trace(): the same two segments, block
// sizes as the allocator rounded them (c's 3 MiB request took a 3.5 MiB block), free blocks listed.
inline forensics::Snapshot handmade_snapshot() {
  forensics::Snapshot snap;
  snap.source = "handmade.pickle";
  forensics::SnapshotSegment s1;
  s1.address = kSeg1;
  s1.total_size_bytes = 8 * kMiB;
  s1.allocated_size_bytes = 2 * kMiB + 7 * kMiB / 2;
  s1.segment_type = "large";
  s1.blocks = {{kSeg1, 2 * kMiB, 2 * kMiB, "active_allocated", {{"forward", "model.py", 10}}, ""},
               {kSeg1 + 2 * kMiB, 1 * kMiB, 0, "inactive", {}, ""},
               {kSeg1 + 3 * kMiB, 7 * kMiB / 2, 3 * kMiB, "active_allocated", {{"forward", "model.py", 10}}, ""},
               {kSeg1 + 13 * kMiB / 2, 3 * kMiB / 2, 0, "inactive", {}, ""}};
  forensics::SnapshotSegment s2;
  s2.address = kSeg2;
  s2.total_size_bytes = 2 * kMiB;
  s2.allocated_size_bytes = 2 * kMiB;
  s2.segment_type = "large";
  s2.blocks = {{kSeg2, 2 * kMiB, 2 * kMiB, "active_allocated", {{"step", "optim.py", 5}}, ""}};
  snap.segments = {s1, s2};
  return snap;
}

inline std::optional<std::string> shared_dir() {
  const char* d = std::getenv("GPUMEM_SHARED_DIR");
  if (!d || !*d || !std::filesystem::exists(std::filesystem::path(d) / "traces")) return std::nullopt;
  return std::string(d);
}

// Compares text with tests/viewer/golden/NAME.txt; GPUMEM_UPDATE_GOLDEN=1 rewrites the file.
inline void check_golden(const std::string& name, const std::string& text) {
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  REQUIRE(src != nullptr);
  const auto path = std::filesystem::path(src) / "tests" / "viewer" / "golden" / (name + ".txt");
  if (const char* u = std::getenv("GPUMEM_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream(path) << text;
    WARN("rewrote " << path.string());
    return;
  }
  std::ifstream in(path);
  INFO("golden file " << path.string() << " (GPUMEM_UPDATE_GOLDEN=1 rewrites it)");
  REQUIRE(in.good());
  std::stringstream expected;
  expected << in.rdbuf();
  CHECK(text == expected.str());
}

}  // namespace gpumem::view::testing
