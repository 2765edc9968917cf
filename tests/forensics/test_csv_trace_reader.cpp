// The compact CSV trace reader: every action kind, gzip and plain files, the shared traces, and
// one clear error (file + line or byte offset) for truncated and corrupt files.
#include <string>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/trace_loader.h"

namespace fx = gpumem::forensics;
using fx::testing::TempDir;

namespace {

const std::string kEveryAction =
    "action,addr,size,stream,time_us,where\n"
    "segment_alloc,139000000000000,2097152,0,100,train.py:10:main\n"
    "alloc,139000000000000,1000,0,101,train.py:11:main\n"
    "segment_map,140000000000000,20971520,5,102,\n"
    "free_requested,139000000000000,1000,0,103,train.py:12:main\n"
    "free_completed,139000000000000,1000,0,104,train.py:12:main\n"
    "segment_unmap,140000000000000,20971520,5,105,\n"
    "segment_free,139000000000000,2097152,0,106,\n"
    "oom,0,209715200,0,107,model.py:3:forward;backward\n"
    "snapshot,0,0,0,108,\n";

std::string error_of(const std::string& path) {
  try {
    fx::load_trace(path);
  } catch (const fx::ForensicsError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("every action kind reads, from gzip and from plain text", "[csv]") {
  TempDir dir;
  for (const bool compressed : {true, false}) {
    const std::string path = dir.file(compressed ? "t.csv.gz" : "t.csv");
    fx::testing::write_file(path, compressed ? fx::testing::gzip(kEveryAction) : kEveryAction);
    const fx::Trace t = fx::read_csv_trace(path);
    REQUIRE(t.entries.size() == 9);
    CHECK(t.entries[0].action == fx::TraceAction::segment_alloc);
    CHECK(t.entries[1].action == fx::TraceAction::alloc);
    CHECK(t.entries[2].action == fx::TraceAction::segment_map);
    CHECK(t.entries[3].action == fx::TraceAction::free_requested);
    CHECK(t.entries[4].action == fx::TraceAction::free_completed);
    CHECK(t.entries[5].action == fx::TraceAction::segment_unmap);
    CHECK(t.entries[6].action == fx::TraceAction::segment_free);
    CHECK(t.entries[7].action == fx::TraceAction::oom);
    CHECK(t.entries[8].action == fx::TraceAction::snapshot);
    CHECK(t.entries[1].addr == 139000000000000ULL);
    CHECK(t.entries[1].size_bytes == 1000);
    CHECK(t.entries[2].stream == 5);
    CHECK(t.entries[7].size_bytes == 209715200);
    CHECK(t.entries[8].time_us == 108);
    CHECK(t.sites[t.entries[1].site] == "train.py:11:main");
    CHECK(t.sites[t.entries[7].site] == "model.py:3:forward;backward");
    CHECK(t.entries[2].site == 0);
    CHECK(t.entries[3].site == t.entries[4].site);
    CHECK(t.duration_us() == 8);
    CHECK(t.count(fx::TraceAction::alloc) == 1);
  }
}

TEST_CASE("the shared traces read completely", "[csv]") {
  const auto shared = fx::testing::shared_dir();
  if (!shared) GPUMEM_SKIP("GPUMEM_SHARED_DIR does not point at the shared traces");
  const fx::Trace t = fx::read_csv_trace(*shared + "/traces/native/resnet50.trace.csv.gz");
  CHECK(t.entries.size() == 53934);  // the README's entry count
  CHECK(t.count(fx::TraceAction::alloc) == 18265);
  CHECK(t.count(fx::TraceAction::segment_alloc) == 111);
}

TEST_CASE("a truncated gzip file names the byte offset", "[csv]") {
  TempDir dir;
  std::string text = kEveryAction;
  for (int i = 0; i < 200; ++i) text += "alloc," + std::to_string(1000000 + i * 4096) + ",4096,0,200,x.py:1:f\n";
  const std::string z = fx::testing::gzip(text);
  const std::string path = dir.file("cut.csv.gz");
  fx::testing::write_file(path, z.substr(0, z.size() / 2));
  const std::string err = error_of(path);
  CHECK(err.find(path) != std::string::npos);
  CHECK(err.find("byte offset") != std::string::npos);
  CHECK(err.find("truncated") != std::string::npos);
}

TEST_CASE("corrupt gzip data names the byte offset", "[csv]") {
  TempDir dir;
  std::string z = fx::testing::gzip(kEveryAction + kEveryAction.substr(kEveryAction.find('\n') + 1));
  for (std::size_t i = 12; i < z.size() - 12; i += 3) z[i] = static_cast<char>(z[i] ^ 0x5a);
  const std::string path = dir.file("bad.csv.gz");
  fx::testing::write_file(path, z);
  const std::string err = error_of(path);
  CHECK(err.find(path) != std::string::npos);
  CHECK(err.find("byte offset") != std::string::npos);
}

TEST_CASE("a line cut short names the line", "[csv]") {
  TempDir dir;
  const std::string path = dir.file("cut.csv");
  fx::testing::write_file(path, kEveryAction + "alloc,1399");
  const std::string err = error_of(path);
  CHECK(err.find(path + ": line 11") != std::string::npos);
  CHECK(err.find("truncated") != std::string::npos);
}

TEST_CASE("malformed lines name the line and the field", "[csv]") {
  TempDir dir;
  const std::string path = dir.file("bad.csv");
  const std::string header = "action,addr,size,stream,time_us,where\n";
  fx::testing::write_file(path, header + "alloc,1,2,0,3,\nmalloc,1,2,0,3,\n");
  std::string err = error_of(path);
  CHECK(err.find("line 3") != std::string::npos);
  CHECK(err.find("unknown action 'malloc'") != std::string::npos);

  fx::testing::write_file(path, header + "alloc,0x10,2,0,3,\n");
  err = error_of(path);
  CHECK(err.find("line 2") != std::string::npos);
  CHECK(err.find("addr '0x10'") != std::string::npos);

  fx::testing::write_file(path, header + "alloc,16,-2,0,3,\n");
  CHECK(error_of(path).find("size '-2'") != std::string::npos);

  fx::testing::write_file(path, "addr,action\nalloc,1\n");
  err = error_of(path);
  CHECK(err.find("line 1") != std::string::npos);
  CHECK(err.find("header") != std::string::npos);

  fx::testing::write_file(path, "");
  CHECK(error_of(path).find("empty") != std::string::npos);

  CHECK(error_of(dir.file("missing.csv.gz")).find("cannot open") != std::string::npos);
}
