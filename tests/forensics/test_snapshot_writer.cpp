// Snapshot writers: pickle and JSON round trips through the readers (PyTorch's own OOM snapshot
// and a handmade gpumem snapshot with ops), the pickle's opcodes limited to those MemoryViz.js
// reads, and PyTorch's torch.cuda._memory_viz rendering our pickle (when GPUMEM_PYTHON is set).
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/forensics/engine_snapshot.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/op_attribution.h"
#include "gpumem/forensics/trace_ring.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/snapshot_reader.h"
#include "gpumem/forensics/snapshot_writer.h"

using namespace gpumem::forensics;
using gpumem::forensics::testing::TempDir;

namespace {

std::string oom_pickle_path() {
  auto dir = gpumem::forensics::testing::shared_dir();
  return dir ? *dir + "/traces/native/oom.snapshot.pickle" : std::string();
}

void check_frames_equal(const std::vector<SnapshotFrame>& a, const std::vector<SnapshotFrame>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].filename == b[i].filename);
    CHECK(a[i].line == b[i].line);
  }
}

void check_snapshots_equal(const Snapshot& a, const Snapshot& b) {
  REQUIRE(a.segments.size() == b.segments.size());
  for (std::size_t i = 0; i < a.segments.size(); ++i) {
    const auto& x = a.segments[i];
    const auto& y = b.segments[i];
    CHECK(x.device == y.device);
    CHECK(x.address == y.address);
    CHECK(x.total_size_bytes == y.total_size_bytes);
    CHECK(x.allocated_size_bytes == y.allocated_size_bytes);
    CHECK(x.active_size_bytes == y.active_size_bytes);
    CHECK(x.requested_size_bytes == y.requested_size_bytes);
    CHECK(x.stream == y.stream);
    CHECK(x.segment_type == y.segment_type);
    CHECK(x.pool_id == y.pool_id);
    CHECK(x.is_expandable == y.is_expandable);
    REQUIRE(x.blocks.size() == y.blocks.size());
    for (std::size_t j = 0; j < x.blocks.size(); ++j) {
      CHECK(x.blocks[j].address == y.blocks[j].address);
      CHECK(x.blocks[j].size_bytes == y.blocks[j].size_bytes);
      CHECK(x.blocks[j].requested_bytes == y.blocks[j].requested_bytes);
      CHECK(x.blocks[j].state == y.blocks[j].state);
      CHECK(x.blocks[j].op == y.blocks[j].op);
      check_frames_equal(x.blocks[j].frames, y.blocks[j].frames);
    }
  }
  REQUIRE(a.device_traces.size() == b.device_traces.size());
  for (std::size_t d = 0; d < a.device_traces.size(); ++d) {
    REQUIRE(a.device_traces[d].size() == b.device_traces[d].size());
    for (std::size_t i = 0; i < a.device_traces[d].size(); ++i) {
      const auto& x = a.device_traces[d][i];
      const auto& y = b.device_traces[d][i];
      CHECK(x.action == y.action);
      CHECK(x.addr == y.addr);
      CHECK(x.size_bytes == y.size_bytes);
      CHECK(x.stream == y.stream);
      CHECK(x.time_us == y.time_us);
      CHECK(x.device_free_bytes == y.device_free_bytes);
      CHECK(x.user_metadata == y.user_metadata);
      CHECK(x.op == y.op);
      check_frames_equal(x.frames, y.frames);
    }
  }
  CHECK(a.expandable_segments == b.expandable_segments);
  CHECK(a.max_split_size == b.max_split_size);
  CHECK(a.gpumem.settings == b.gpumem.settings);
  CHECK(a.gpumem.device_total_bytes == b.gpumem.device_total_bytes);
  CHECK(a.gpumem.cap_bytes == b.gpumem.cap_bytes);
}

// A small gpumem snapshot: an expandable segment with ops on blocks and entries, an oom entry
// and an address that needs 8 bytes.
Snapshot handmade() {
  Snapshot s;
  s.source = "handmade";
  SnapshotSegment seg;
  seg.address = 0x7f0000000000ull;
  seg.total_size_bytes = 4ull << 20;
  seg.allocated_size_bytes = 1ull << 20;
  seg.active_size_bytes = 1ull << 20;
  seg.requested_size_bytes = 1000000;
  seg.segment_type = "large";
  seg.is_expandable = true;
  seg.blocks.push_back(SnapshotBlock{seg.address, 1ull << 20, 1000000, "active_allocated",
                                     {SnapshotFrame{"aten::mm", "??", 0}}, "aten::mm"});
  seg.blocks.push_back(SnapshotBlock{seg.address + (1ull << 20), 3ull << 20, 0, "inactive", {}, ""});
  s.segments.push_back(seg);
  s.device_traces.resize(2);
  SnapshotTraceEntry a;
  a.action = TraceAction::alloc;
  a.addr = seg.address;
  a.size_bytes = 1000000;
  a.time_us = 1795942683929564;
  a.op = "aten::mm";
  a.user_metadata = "forward/attention";
  a.frames = {SnapshotFrame{"aten::mm", "??", 0}, SnapshotFrame{"forward", "model.py", 42}};
  s.device_traces[1].push_back(a);
  SnapshotTraceEntry big;
  big.action = TraceAction::segment_map;
  big.addr = 0x7ffffffff0000000ull;  // needs LONG1 (8 bytes)
  big.size_bytes = 4ull << 30;
  s.device_traces[1].push_back(big);
  SnapshotTraceEntry oom;
  oom.action = TraceAction::oom;
  oom.size_bytes = 200ull << 20;
  oom.device_free_bytes = 140978028544ull;
  oom.op = "aten::empty";
  s.device_traces[1].push_back(oom);
  s.expandable_segments = true;
  s.gpumem.version = 1;
  s.gpumem.settings = "expandable_segments:True,record_ops:True";
  s.gpumem.device_total_bytes = 150ull << 30;
  s.gpumem.cap_bytes = 8ull << 30;
  return s;
}

// A gpumem engine's snapshot (expandable regions, ops on blocks and entries, shared op frames).
// `steps` allocations and frees under three op names (the ring keeps up to 100,000 records).
Snapshot engine_snapshot(int steps = 300) {
  using namespace gpumem;
  alloc::SimSource source;
  auto events = alloc::make_immediate_events();
  alloc::Config config;
  alloc::CachingAllocator engine(source, *events, config);
  auto ring = std::make_shared<TraceRing>(100000, true);
  engine.attach_observer(ring);
  std::vector<void*> live;
  const char* ops[] = {"aten::mm", "aten::gelu", "aten::empty"};
  for (int i = 0; i < steps; ++i) {
    ScopedOp op(ops[i % 3]);
    if (i % 4 == 3) {
      engine.free(live[static_cast<std::size_t>(i) % live.size()]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) % live.size()));
    } else {
      live.push_back(engine.allocate(static_cast<std::size_t>(1 + i % 7) << (i % 2 ? 12 : 20), 0).ptr);
    }
  }
  const auto view = engine.snapshot();
  const auto records = ring->records();
  Snapshot s = snapshot_from_engine(view, records);
  for (void* p : live) engine.free(p);
  engine.detach_observer(ring.get());
  return s;
}

// Walks a pickle's opcodes (with their argument lengths) and returns the set used; fails on any
// opcode outside the list MemoryViz.js accepts.
std::set<unsigned> opcodes_of(const std::string& p) {
  std::set<unsigned> used;
  std::size_t i = 0;
  auto le32 = [&](std::size_t at) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(p[at])) |
           static_cast<std::uint32_t>(static_cast<unsigned char>(p[at + 1])) << 8 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(p[at + 2])) << 16 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(p[at + 3])) << 24;
  };
  while (i < p.size()) {
    const unsigned op = static_cast<unsigned char>(p[i++]);
    used.insert(op);
    switch (op) {
      case 0x80: i += 1; break;                          // PROTO
      case '}': case ']': case '(': case 'u': case 'e':  // EMPTY_DICT EMPTY_LIST MARK SETITEMS APPENDS
      case 0x86: case 0x88: case 0x89: case 'N':         // TUPLE2 NEWTRUE NEWFALSE NONE
        break;
      case 'K': i += 1; break;                           // BININT1
      case 'M': i += 2; break;                           // BININT2
      case 'J': i += 4; break;                           // BININT
      case 0x8a: i += 1 + static_cast<unsigned char>(p[i]); break;  // LONG1
      case 'G': i += 8; break;                           // BINFLOAT
      case 'X': i += 4 + le32(i); break;                 // BINUNICODE
      case 'q': case 'h': i += 1; break;                 // BINPUT BINGET
      case 'r': case 'j': i += 4; break;                 // LONG_BINPUT LONG_BINGET
      case '.': return used;                             // STOP
      default: FAIL("opcode 0x" << std::hex << op << " is not one MemoryViz.js reads"); return used;
    }
  }
  FAIL("the pickle has no STOP");
  return used;
}

}  // namespace

TEST_CASE("a handmade gpumem snapshot survives pickle and JSON round trips", "[writer]") {
  const Snapshot s = handmade();
  const std::string pickle = snapshot_to_pickle(s);
  CHECK(static_cast<unsigned char>(pickle[0]) == 0x80);
  CHECK(pickle[1] == 2);
  const auto used = opcodes_of(pickle);
  CHECK(used.count(0x8a) == 1);  // the 8-byte address needed LONG1
  const Snapshot back = parse_snapshot(pickle, "round trip");
  check_snapshots_equal(s, back);
  CHECK(back.gpumem.version == GpumemSnapshotInfo::kVersion);
  CHECK(back.device_traces[1][2].device_free_bytes == 140978028544ull);

  const std::string json = snapshot_to_json(s);
  CHECK(json.front() == '{');
  check_snapshots_equal(s, parse_snapshot(json, "json round trip"));
}

TEST_CASE("PyTorch's OOM snapshot survives our pickle and JSON writers", "[writer][traces]") {
  const std::string path = oom_pickle_path();
  if (path.empty()) GPUMEM_SKIP("GPUMEM_SHARED_DIR with traces/ not set");
  const Snapshot original = load_snapshot(path);
  REQUIRE(original.segments.size() == 147);
  REQUIRE(original.device_traces.at(0).size() == 16096);
  const std::string pickle = snapshot_to_pickle(original);
  opcodes_of(pickle);
  check_snapshots_equal(original, parse_snapshot(pickle, "pickle"));
  check_snapshots_equal(original, parse_snapshot(snapshot_to_json(original), "json"));
  // The settings dict is written back as it was read.
  const Snapshot back = parse_snapshot(pickle, "pickle");
  REQUIRE(back.allocator_settings.is_dict());
  CHECK(back.allocator_settings.find("roundup_power2_divisions") != nullptr);
}

TEST_CASE("an engine's snapshot survives the round trip and uses only the viewer's opcodes", "[writer][engine]") {
  const Snapshot s = engine_snapshot();
  REQUIRE(!s.segments.empty());
  REQUIRE(s.device_traces.at(0).size() > 300);
  const std::string pickle = snapshot_to_pickle(s);
  opcodes_of(pickle);
  check_snapshots_equal(s, parse_snapshot(pickle, "engine"));
  check_snapshots_equal(s, parse_snapshot(snapshot_to_json(s), "engine json"));
}

TEST_CASE("write_snapshot picks the format from the name and names an unwritable path", "[writer]") {
  TempDir dir;
  const Snapshot s = handmade();
  write_snapshot(s, dir.file("a.pickle"));
  write_snapshot(s, dir.file("a.json"));
  std::ifstream j(dir.file("a.json"));
  CHECK(j.peek() == '{');
  check_snapshots_equal(load_snapshot(dir.file("a.pickle")), load_snapshot(dir.file("a.json")));
  try {
    write_snapshot(s, dir.file("missing/dir/a.pickle"));
    FAIL("expected an error");
  } catch (const ForensicsError& e) {
    CHECK(std::string(e.what()).find("missing/dir/a.pickle") != std::string::npos);
  }
}

TEST_CASE("write_snapshot streams a pickle larger than its window, byte for byte what snapshot_to_pickle gives",
          "[writer][engine]") {
  // write_snapshot writes through a 1 MiB window; 40,000 steps make a pickle of several MiB, so
  // the window is written out many times, with memo references reaching back across windows.
  const Snapshot s = engine_snapshot(40000);
  const std::string whole = snapshot_to_pickle(s);
  REQUIRE(whole.size() > (std::size_t{3} << 20));
  TempDir dir;
  write_snapshot(s, dir.file("big.pickle"));
  std::ifstream f(dir.file("big.pickle"), std::ios::binary);
  std::ostringstream bytes;
  bytes << f.rdbuf();
  CHECK(bytes.str().size() == whole.size());
  CHECK(bytes.str() == whole);
  check_snapshots_equal(s, load_snapshot(dir.file("big.pickle")));
}

TEST_CASE("a snapshot from a newer gpumem is refused with a message", "[writer]") {
  std::string json = snapshot_to_json(handmade());
  const auto at = json.find("\"version\":1");
  REQUIRE(at != std::string::npos);
  json.replace(at, 11, "\"version\":99");
  try {
    parse_snapshot(json, "future.json");
    FAIL("expected an error");
  } catch (const ForensicsError& e) {
    CHECK(std::string(e.what()).find("newer gpumem") != std::string::npos);
  }
}

TEST_CASE("torch.cuda._memory_viz renders our pickles", "[writer][python]") {
  const auto py = gpumem::forensics::testing::python();
  if (!py) GPUMEM_SKIP("GPUMEM_PYTHON not set: the torch check is skipped");
  TempDir dir;
  std::vector<std::string> files;
  write_snapshot(handmade(), dir.file("handmade.pickle"));
  files.push_back(dir.file("handmade.pickle"));
  if (!oom_pickle_path().empty()) {
    write_snapshot(load_snapshot(oom_pickle_path()), dir.file("oom.pickle"));
    files.push_back(dir.file("oom.pickle"));
  }
  write_snapshot(engine_snapshot(), dir.file("engine.pickle"));
  files.push_back(dir.file("engine.pickle"));
  for (const auto& f : files) {
    for (const char* view : {"trace_plot", "segment_plot"}) {
      const std::string out = f + "." + view + ".html";
      const std::string cmd = *py + " -m torch.cuda._memory_viz " + view + " " + f + " -o " + out + " 2>" + f + ".err";
      INFO(cmd);
      CHECK(std::system(cmd.c_str()) == 0);
      std::ifstream html(out);
      std::stringstream ss;
      ss << html.rdbuf();
      CHECK(ss.str().size() > 1000);
    }
    // The text tools walk every segment, block and trace entry.
    for (const char* tool : {"stats", "trace"}) {
      const std::string cmd = *py + " -m torch.cuda._memory_viz " + tool + " " + f + " >" + f + ".out 2>&1";
      INFO(cmd);
      CHECK(std::system(cmd.c_str()) == 0);
    }
  }
}
