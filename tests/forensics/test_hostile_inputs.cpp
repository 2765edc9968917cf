// Regression tests for what mutation fuzzing of the readers found (issue 15), each with a small
// input built here: every one must end in one ForensicsError naming the file and what is wrong, or
// in a result whose numbers are true (or say what they leave out), never in an abort, a stack
// overflow, a wrapped number or unbounded memory. Run under ASan/UBSan by the sanitizer CI job,
// which also catches leaks (the cycle case) and signed overflow.
#include <string>
#include <string_view>

#include "catch.h"
#include "forensics_test_support.h"
#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/pickle_reader.h"
#include "gpumem/forensics/read_limits.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/snapshot_reader.h"
#include "gpumem/forensics/trace.h"
#include "gpumem/forensics/trace_loader.h"

namespace fx = gpumem::forensics;
using fx::testing::TempDir;

namespace {

// Pickle bytes from a literal that may hold NULs.
template <std::size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const fx::ForensicsError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string pickle_error(const std::string& b) {
  return error_of([&] { fx::parse_pickle(b, "h.pickle"); });
}

std::string csv_error(const std::string& text, const fx::ReadLimits& limits = fx::default_read_limits()) {
  return error_of([&] { fx::parse_csv_trace(text, "h.csv", limits); });
}

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

const char* kHeader = "action,addr,size,stream,time_us,where\n";

}  // namespace

TEST_CASE("REDUCE of builtins.bytes or builtins.set over the wrong kind is an error, not an abort", "[hostile]") {
  // bytes([ 'a' ]): a list of str where bytes wants ints 0..255.
  const std::string bytes_of_str = bytes("\x80\x02" "cbuiltins\nbytes\n" "(]" "(X\x01\x00\x00\x00" "a" "et" "R.");
  std::string err = pickle_error(bytes_of_str);
  INFO(err);
  CHECK(has(err, "h.pickle"));
  CHECK(has(err, "REDUCE of 'builtins.bytes'"));
  // bytes([300]): out of range.
  err = pickle_error(bytes("\x80\x02" "cbuiltins\nbytes\n" "(]" "(M\x2c\x01" "et" "R."));
  INFO(err);
  CHECK(has(err, "REDUCE of 'builtins.bytes'"));
  // set('abc') and set(7): a set is made of a list or tuple here.
  err = pickle_error(bytes("\x80\x02" "cbuiltins\nset\n" "(X\x03\x00\x00\x00" "abc" "tR."));
  INFO(err);
  CHECK(has(err, "REDUCE of 'builtins.set'"));
  err = pickle_error(bytes("\x80\x02" "cbuiltins\nset\n" "(K\x07" "tR."));
  INFO(err);
  CHECK(has(err, "REDUCE of 'builtins.set'"));
  // The same corrupt pickle inside a snapshot: one error from load_snapshot, too.
  err = error_of([&] { fx::parse_snapshot(bytes_of_str, "s.pickle"); });
  CHECK(has(err, "s.pickle"));
}

TEST_CASE("deeply nested pickles are refused without recursion", "[hostile]") {
  for (const int depth : {100'000, 1'000'000}) {
    // N empty lists, then N-1 APPENDs: each list holds the next.
    std::string lists = bytes("\x80\x02");
    lists.append(static_cast<std::size_t>(depth), ']');
    lists.append(static_cast<std::size_t>(depth - 1), 'a');
    lists += '.';
    std::string err = pickle_error(lists);
    INFO(err);
    CHECK(has(err, "nested more than"));
    // (((),),) ...: TUPLE1 over and over.
    std::string tuples = bytes("\x80\x02)");
    tuples.append(static_cast<std::size_t>(depth), '\x85');
    tuples += '.';
    err = pickle_error(tuples);
    INFO(err);
    CHECK(has(err, "nested more than"));
  }
  // Nesting a snapshot's reader accepts (a few levels) still reads.
  const fx::PickleValue v = fx::parse_pickle(bytes("\x80\x02]]]aa."), "ok.pickle");
  REQUIRE(v.is_sequence());
  CHECK(v.items().size() == 1);
}

TEST_CASE("a container that holds itself through the memo is refused (and freed)", "[hostile]") {
  // l = []; l.append(l)
  std::string err = pickle_error(bytes("\x80\x02]q\x00h\x00" "a."));
  INFO(err);
  CHECK(has(err, "holds itself"));
  // d = {}; d['k'] = [d]: a longer cycle.
  err = pickle_error(bytes("\x80\x02}q\x00X\x01\x00\x00\x00k]h\x00" "as."));
  INFO(err);
  CHECK(has(err, "holds itself"));
  // A shared (not cyclic) memo entry is fine: [x, x].
  const fx::PickleValue v = fx::parse_pickle(bytes("\x80\x02](]q\x01h\x01" "e."), "ok.pickle");
  REQUIRE(v.is_sequence());
  CHECK(v.items().size() == 2);
}

TEST_CASE("sizes and time stamps near the 64-bit limits are refused with the line", "[hostile]") {
  const std::string huge = std::string(kHeader) + "alloc,4096,9223372036854775807,0,1,\n";
  std::string err = csv_error(huge);
  INFO(err);
  CHECK(has(err, "h.csv: line 2"));
  CHECK(has(err, "larger than any memory"));
  err = csv_error(std::string(kHeader) + "alloc,4096,18446744073709551615,0,1,\n");
  INFO(err);
  CHECK(has(err, "line 2"));
  err = csv_error(std::string(kHeader) + "alloc,18446744073709551000,4096,0,1,\n");
  INFO(err);
  CHECK(has(err, "passes the end of the 64-bit address space"));
  err = csv_error(std::string(kHeader) + "alloc,4096,512,0,-9223372036854775808,\n"
                  "free_completed,4096,512,0,9223372036854775807,\n");
  INFO(err);
  CHECK(has(err, "line 2"));
  CHECK(has(err, "time stamp"));
  // Many plausible sizes that add up past 2^62: refused at the line where the sum passes.
  std::string many(kHeader);
  for (int i = 0; i < 1100; ++i) many += "alloc,4096,4503599627370496,0,1,\n";  // 2^52 each
  err = csv_error(many);
  INFO(err);
  CHECK(has(err, "add up to more than 2^62"));
  // The same numbers in a snapshot's trace.
  const std::string json = R"({"segments": [], "device_traces": [[
      {"action": "alloc", "addr": 4096, "size": 9223372036854775807, "stream": 0, "time_us": 1}]]})";
  err = error_of([&] { fx::parse_snapshot(json, "s.json"); });
  INFO(err);
  CHECK(has(err, "s.json: device_traces[0][0]"));
  // Trace::duration_us saturates for a Trace built by hand.
  fx::Trace t;
  t.entries.push_back({});
  t.entries.push_back({});
  t.entries.front().time_us = std::numeric_limits<std::int64_t>::min();
  t.entries.back().time_us = std::numeric_limits<std::int64_t>::max();
  CHECK(t.duration_us() == std::numeric_limits<std::int64_t>::max());
}

TEST_CASE("decompressed size and entry count are bounded, with the variable that raises them", "[hostile]") {
  TempDir dir;
  // 4 MiB of newlines gzip to a few KiB.
  const std::string path = dir.file("bomb.csv.gz");
  fx::testing::write_file(path, fx::testing::gzip(std::string(kHeader) + std::string(std::size_t{4} << 20, '\n')));
  fx::ReadLimits small;
  small.max_file_bytes = std::uint64_t{1} << 20;
  std::string err = error_of([&] { fx::load_trace(path, std::nullopt, small); });
  INFO(err);
  CHECK(has(err, "bomb.csv.gz"));
  CHECK(has(err, "GPUMEM_MAX_FILE_BYTES"));
  // Under the default limit the same file reads (blank lines are skipped or refused, never a crash).
  (void)error_of([&] { fx::load_trace(path); });

  std::string entries(kHeader);
  for (int i = 0; i < 100; ++i) entries += "alloc,4096,512,0," + std::to_string(i) + ",\n";
  fx::ReadLimits few;
  few.max_records = 50;
  err = csv_error(entries, few);
  INFO(err);
  CHECK(has(err, "GPUMEM_MAX_RECORDS"));
  CHECK(has(err, "line 52"));
  CHECK_NOTHROW(fx::parse_csv_trace(entries, "h.csv"));

  // A pickle whose memo repeats one entry many times is bounded by the same count.
  std::string repeat = bytes("\x80\x02]q\x00(");
  for (int i = 0; i < 1000; ++i) repeat += bytes("h\x00");
  repeat += "l.";
  err = error_of([&] { fx::parse_pickle(repeat, "r.pickle", few); });
  INFO(err);
  CHECK(has(err, "GPUMEM_MAX_RECORDS"));

  // The limits' environment variables are checked.
  setenv("GPUMEM_MAX_RECORDS", "lots", 1);
  err = error_of([] { fx::ReadLimits::from_environment(); });
  unsetenv("GPUMEM_MAX_RECORDS");
  CHECK(has(err, "GPUMEM_MAX_RECORDS='lots' is not a positive integer"));
}

TEST_CASE("blocks outside their segment and overlapping segments are refused", "[hostile]") {
  // A block larger than its segment.
  std::string err = error_of([&] {
    fx::parse_snapshot(R"({"segments": [{"device": 0, "address": 4096, "total_size": 2097152, "stream": 0,
        "segment_type": "large", "allocated_size": 0, "active_size": 0, "requested_size": 0,
        "blocks": [{"address": 4096, "size": 4194304, "requested_size": 0, "state": "inactive"}]}],
        "device_traces": []})",
                       "s.json");
  });
  INFO(err);
  CHECK(has(err, "s.json: segments[0].blocks[0]"));
  CHECK(has(err, "not inside its segment"));
  // Two segments over the same addresses.
  const char* seg = R"({"device": 0, "address": 4096, "total_size": 2097152, "stream": 0,
        "segment_type": "large", "allocated_size": 0, "active_size": 0, "requested_size": 0,
        "blocks": [{"address": 4096, "size": 2097152, "requested_size": 0, "state": "inactive"}]})";
  err = error_of([&] {
    fx::parse_snapshot(std::string(R"({"segments": [)") + seg + "," + seg + R"(], "device_traces": []})", "s.json");
  });
  INFO(err);
  CHECK(has(err, "s.json"));
  CHECK(has(err, "overlap"));
}

TEST_CASE("a JSON object with a repeated key keeps the last value, as Python does", "[hostile]") {
  const fx::Snapshot s = fx::parse_snapshot(
      R"({"segments": [{"bogus": 1}], "device_traces": [], "segments": []})", "s.json");
  CHECK(s.segments.empty());
  // In the measured-peaks file beside a trace, too.
  TempDir dir;
  fx::testing::write_file(dir.file("t.csv"), std::string(kHeader) + "alloc,4096,512,0,1,\n");
  fx::testing::write_file(dir.file("t.json"), R"({"peak_reserved": 1, "peak_reserved": 2048})");
  const auto m = fx::measured_beside(dir.file("t.csv"));
  REQUIRE(m);
  CHECK(m->peak_reserved_bytes == 2048);
  // A damaged one is an error naming it, not a guess.
  fx::testing::write_file(dir.file("t.json"), R"({"peak_reserved": 2048,)");
  CHECK(has(error_of([&] { fx::measured_beside(dir.file("t.csv")); }), "t.json"));
}

TEST_CASE("allocations outside every segment are not silently dropped from the report", "[hostile]") {
  const std::string csv = std::string(kHeader) + "alloc,139000000000000,1000,0,101,train.py:11:main\n"
                          "alloc,139000000002000,5000,0,102,train.py:11:main\n";
  const fx::Snapshot snap = fx::parse_snapshot_file_bytes(csv, "noseg.csv");
  const fx::MemoryReport r = fx::build_report(snap, {});
  bool said = false;
  for (const auto& note : r.notes) said |= has(note, "2 trace entries could not be applied");
  CHECK(said);
}

TEST_CASE("shared containers are destroyed without recursion and without a huge work list", "[hostile]") {
  // A DAG a pickle's memo can build: every level holds the level below twice. Destroying it must
  // not recurse once per level (a stack overflow at a million levels).
  {
    fx::PickleValue v = fx::PickleValue::list({});
    for (int i = 0; i < 1'000'000; ++i) v = fx::PickleValue::list({v, v});
  }
  // One dict in a list ten million times over (the issue's 20 MB pickle), and the list dropped.
  {
    fx::PickleItems items(10'000'000, fx::PickleValue::list({fx::PickleValue::integer(1)}));
    fx::PickleValue big = fx::PickleValue::list(std::move(items));
    CHECK(big.items().size() == 10'000'000);
  }
  SUCCEED("destroyed");
}
