// Helpers shared by the forensics tests: where the shared traces are, a Python interpreter for
// writing pickles, temporary files, and small handmade traces.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "catch.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics::testing {

// $GPUMEM_SHARED_DIR (the real PyTorch 2.11 traces are in its traces/), if it holds the traces.
inline std::optional<std::string> shared_dir() {
  const char* d = std::getenv("GPUMEM_SHARED_DIR");
  if (!d || !*d || !std::filesystem::exists(std::filesystem::path(d) / "traces")) return std::nullopt;
  return std::string(d);
}

// $GPUMEM_PYTHON, if set and runnable.
// The trace the repository ships (traces/resnet50.native.trace.csv.gz, with its measured .json
// beside it: PyTorch 2.11 native on the H200, the same file as the shared one), so that the tests
// of real traces check something in a clone without ../shared (CI). A test calling this fails,
// loudly, when GPUMEM_SOURCE_DIR (set by ctest) is unset or the file is missing.
inline std::string repo_trace() {
  const char* d = std::getenv("GPUMEM_SOURCE_DIR");
  if (!d || !*d) FAIL("GPUMEM_SOURCE_DIR is not set (ctest sets it to the source tree; export it to run by hand)");
  const std::string path = std::string(d) + "/traces/resnet50.native.trace.csv.gz";
  if (!std::filesystem::exists(path)) FAIL("the repository's trace " << path << " is missing");
  return path;
}

inline std::optional<std::string> python() {
  const char* p = std::getenv("GPUMEM_PYTHON");
  if (!p || !*p || !std::filesystem::exists(p)) return std::nullopt;
  return std::string(p);
}

// A fresh temporary directory, removed when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gpumem-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// text, gzip-compressed (as a .gz file holds it).
inline std::string gzip(const std::string& text) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&zs, static_cast<uLong>(text.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  zs.avail_in = static_cast<uInt>(text.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs `python script` with arguments; returns the exit status.
inline int run_python(const std::string& python, const std::string& script_path, const std::string& args) {
  const std::string cmd = "'" + python + "' '" + script_path + "' " + args;
  return std::system(cmd.c_str());
}

struct E {
  TraceAction action;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t stream = 0;
};

// A trace from (action, addr, size[, stream]) tuples, one microsecond apart.
inline Trace make_trace(std::initializer_list<E> entries) {
  Trace t;
  t.source = "handmade";
  std::int64_t time = 1000;
  for (const E& e : entries) {
    TraceEntry x;
    x.action = e.action;
    x.addr = e.addr;
    x.size_bytes = e.size;
    x.stream = e.stream;
    x.time_us = time++;
    t.entries.push_back(x);
  }
  return t;
}

// Appends one entry at time_us with a call site (interned).
inline void add_entry(Trace& t, TraceAction a, std::uint64_t addr, std::uint64_t size, std::int64_t time_us,
                      std::string_view where) {
  TraceEntry e;
  e.action = a;
  e.addr = addr;
  e.size_bytes = size;
  e.time_us = time_us;
  e.site = t.intern_site(where);
  t.entries.push_back(e);
}

}  // namespace gpumem::forensics::testing
