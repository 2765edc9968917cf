// The snapshot reader: the real OOM snapshot from the H200, snapshots written by Python with every
// trace action (protocols 2 to 5), older-version snapshots that lack optional fields, and errors.
#include <cstdlib>

#include <fmt/format.h>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"
#include "gpumem/forensics/snapshot_reader.h"
#include "gpumem/forensics/trace_loader.h"

namespace fx = gpumem::forensics;
using fx::testing::TempDir;

namespace {

// A snapshot as torch.cuda.memory._snapshot() returns it, with every trace action, written with
// protocols 2..5 (and a minimal one, as older PyTorch versions wrote, as minimal.pickle).
const char* kWriteSnapshots = R"PY(
import pickle, sys
out = sys.argv[1]
def fr(name, line, file="train.py"):
    return {"name": name, "filename": file, "line": line}
torch_frame = fr("empty", 10, "/venv/lib/python3.12/site-packages/torch/functional.py")
cpp_frame = {"name": "c10::alloc", "filename": "??", "line": 0}
A = 139000000000000
def ev(action, addr, size, frames=None, stream=0, t=0):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 1700000000000000 + t,
         "compile_context": "N/A", "user_metadata": "", "frames": frames or []}
    return e
trace = [
    ev("segment_alloc", A, 2097152, [cpp_frame, torch_frame, fr("main", 11)], t=1),
    ev("alloc", A, 1000, [cpp_frame, torch_frame, fr("main", 11)], t=2),
    ev("segment_map", A + 2**30, 20971520, t=3),
    ev("free_requested", A, 1000, [fr("step", 20)], t=4),
    ev("free_completed", A, 1000, [fr("step", 20)], t=5),
    ev("segment_unmap", A + 2**30, 20971520, t=6),
    ev("segment_free", A, 2097152, t=7),
    ev("snapshot", 0, 0, t=8),
]
oom = ev("oom", 0, 209715200, [fr("forward, again", 30)], t=9)
del oom["addr"]
oom["device_free"] = 123456789
trace.append(oom)
snap = {
    "segments": [{
        "device": 0, "address": A, "total_size": 2097152, "allocated_size": 512, "active_size": 512,
        "requested_size": 400, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": [],
        "blocks": [
            {"address": A, "size": 512, "requested_size": 400, "state": "active_allocated", "frames": [fr("main", 11)]},
            {"address": A + 512, "size": 2097152 - 512, "requested_size": 0, "state": "inactive", "frames": []},
        ]}],
    "device_traces": [trace, []],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
                           "expandable_segments": True, "roundup_power2_divisions": {"1": 0, "2": 0}},
    "external_annotations": [],
}
for proto in (2, 3, 4, 5):
    with open(f"{out}/snap.p{proto}.pickle", "wb") as f:
        pickle.dump(snap, f, protocol=proto)
minimal = {"segments": [{"address": A, "total_size": 4096, "blocks": [{"size": 1024, "state": "active_allocated"}, {"size": 3072}]}],
           "device_traces": [[{"action": "alloc", "addr": A, "size": 1000, "stream": 0},
                              {"action": "free_completed", "addr": A, "size": 1000, "stream": 0}]]}
with open(f"{out}/minimal.pickle", "wb") as f:
    pickle.dump(minimal, f, protocol=2)
)PY";

std::string error_of(const fx::PickleValue& v) {
  try {
    fx::snapshot_from_pickle(v, "s.pickle");
  } catch (const fx::ForensicsError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("the real OOM snapshot from the H200", "[snapshot]") {
  const auto shared = fx::testing::shared_dir();
  if (!shared) GPUMEM_SKIP("GPUMEM_SHARED_DIR does not point at the shared traces");
  const fx::Snapshot s = fx::read_snapshot(*shared + "/traces/native/oom.snapshot.pickle");
  CHECK(s.segments.size() == 147);
  REQUIRE(s.device_traces.size() == 1);
  const auto& trace = s.device_traces[0];
  REQUIRE(trace.size() == 16096);
  CHECK(trace.back().action == fx::TraceAction::oom);
  CHECK(trace.back().size_bytes == 209715200);
  REQUIRE(trace.back().device_free_bytes.has_value());
  CHECK(*trace.back().device_free_bytes == 140978028544ULL);
  CHECK_FALSE(s.expandable_segments);
  CHECK(s.max_split_size == -1);
  CHECK(s.segments[0].total_size_bytes == 209715200);
  CHECK(s.segments[0].blocks[0].state == "inactive");
  std::uint64_t tiled = 0;
  for (const auto& b : s.segments[0].blocks) tiled += b.size_bytes;
  CHECK(tiled == s.segments[0].total_size_bytes);
  CHECK(fx::call_site(trace[0].frames) == "oom_repro.py:111:oom");

  // The CSV export of the same run carries the same entries (its call-site file name differs, and
  // its times were converted separately: they may differ by a microsecond).
  const fx::Trace csv = fx::read_csv_trace(*shared + "/traces/native/oom.trace.csv.gz");
  const fx::Trace from_pickle = fx::trace_from_snapshot(s, 0);
  REQUIRE(csv.entries.size() >= from_pickle.entries.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < from_pickle.entries.size(); ++i) {
    const auto& a = from_pickle.entries[i];
    const auto& b = csv.entries[i];
    if (a.action != b.action || a.addr != b.addr || a.size_bytes != b.size_bytes || std::abs(a.time_us - b.time_us) > 1) {
      ++differ;
    }
  }
  CHECK(differ == 0);
}

TEST_CASE("snapshots written by Python with every trace action, protocols 2 to 5", "[snapshot]") {
  const auto python = fx::testing::python();
  if (!python) GPUMEM_SKIP("GPUMEM_PYTHON is not set (scripts/setup.sh sets it); skipping Python-written snapshots");
  TempDir dir;
  const std::string script = dir.file("write.py");
  fx::testing::write_file(script, kWriteSnapshots);
  REQUIRE(fx::testing::run_python(*python, script, "'" + dir.file("") + "'") == 0);
  for (int proto = 2; proto <= 5; ++proto) {
    INFO("protocol " << proto);
    const std::string path = dir.file(fmt::format("snap.p{}.pickle", proto));
    const fx::Snapshot s = fx::read_snapshot(path);
    REQUIRE(s.device_traces.size() == 2);
    const auto& t = s.device_traces[0];
    REQUIRE(t.size() == 9);
    const fx::TraceAction expected[] = {fx::TraceAction::segment_alloc, fx::TraceAction::alloc,
                                        fx::TraceAction::segment_map,   fx::TraceAction::free_requested,
                                        fx::TraceAction::free_completed, fx::TraceAction::segment_unmap,
                                        fx::TraceAction::segment_free,  fx::TraceAction::snapshot,
                                        fx::TraceAction::oom};
    for (std::size_t i = 0; i < 9; ++i) CHECK(t[i].action == expected[i]);
    CHECK(t[1].addr == 139000000000000ULL);
    CHECK(t[1].size_bytes == 1000);
    CHECK(t[1].time_us == 1700000000000002LL);
    CHECK(t[1].compile_context == "N/A");
    CHECK(t[8].addr == 0);
    CHECK(t[8].device_free_bytes == std::optional<std::uint64_t>(123456789));
    // The call site skips C++ frames and frames inside torch.
    CHECK(fx::call_site(t[1].frames) == "train.py:11:main");
    CHECK(fx::call_site(t[8].frames) == "train.py:30:forward; again");
    CHECK(s.expandable_segments);
    REQUIRE(s.segments.size() == 1);
    CHECK(s.segments[0].segment_type == "small");
    CHECK(s.segments[0].blocks[1].address == 139000000000000ULL + 512);
    CHECK(s.segments[0].blocks[0].requested_bytes == 400);
    CHECK(s.allocator_settings.find("PYTORCH_CUDA_ALLOC_CONF")->as_string() == "expandable_segments:True");

    // And through the loader, as `gpumem replay` opens it.
    const fx::LoadedTrace loaded = fx::load_trace(path);
    CHECK(loaded.format == fx::TraceFormat::snapshot);
    CHECK(loaded.device == 0);
    CHECK(loaded.recorded_expandable);
    CHECK(loaded.trace.entries.size() == 9);
    CHECK(loaded.trace.sites[loaded.trace.entries[1].site] == "train.py:11:main");
    CHECK(fx::load_trace(path, 1).trace.entries.empty());  // device 1 traced nothing
    CHECK_THROWS_AS(fx::load_trace(path, 2), fx::ForensicsError);  // no device 2
  }
  // A minimal snapshot without the optional fields (as older versions wrote them).
  const fx::Snapshot m = fx::read_snapshot(dir.file("minimal.pickle"));
  REQUIRE(m.segments.size() == 1);
  CHECK(m.segments[0].blocks[1].address == 139000000000000ULL + 1024);
  CHECK(m.segments[0].blocks[1].state == "inactive");
  CHECK(m.segments[0].blocks[0].requested_bytes == 1024);
  CHECK(m.device_traces[0][1].action == fx::TraceAction::free_completed);
  CHECK(m.device_traces[0][0].time_us == 0);
}

TEST_CASE("a pickle that is not a snapshot is one error naming what is wrong", "[snapshot]") {
  using fx::PickleValue;
  CHECK(error_of(PickleValue::list()).find("holds a list") != std::string::npos);
  CHECK(error_of(PickleValue::dict()).find("'segments' is missing") != std::string::npos);
  PickleValue d = PickleValue::dict({{PickleValue::string("segments"), PickleValue::list()}});
  CHECK(error_of(d).find("'device_traces' is missing") != std::string::npos);
  PickleValue entry = PickleValue::dict({{PickleValue::string("action"), PickleValue::string("malloc")}});
  PickleValue bad = PickleValue::dict({{PickleValue::string("segments"), PickleValue::list()},
                                       {PickleValue::string("device_traces"),
                                        PickleValue::list({PickleValue::list({entry})})}});
  const std::string err = error_of(bad);
  INFO(err);
  CHECK(err.find("s.pickle: device_traces[0][0].action") != std::string::npos);
  CHECK(err.find("'malloc'") != std::string::npos);
  PickleValue seg = PickleValue::dict({{PickleValue::string("address"), PickleValue::string("0x10")}});
  PickleValue bad_seg = PickleValue::dict({{PickleValue::string("segments"), PickleValue::list({seg})},
                                           {PickleValue::string("device_traces"), PickleValue::list()}});
  CHECK(error_of(bad_seg).find("segments[0].address: is a str, expected an int") != std::string::npos);
}
