// The OOM postmortem end to end on CPU tensors: with oom_report_dir configured, an allocation
// that fails writes a snapshot and a report (text and JSON) there before the error is raised, and
// c10::OutOfMemoryError's message names them; the report's verdict is read back.
//
// Files are handled with POSIX calls: libtorch.so exports std::filesystem symbols of its own
// libstdc++ build, and calling them from here crashed.
#include <dirent.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/config.h"
#include "gpumem/torch/install.h"

namespace {

std::vector<std::string> list_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
  }
  return out;
}

void remove_dir(const std::string& dir) {
  for (const auto& name : list_files(dir)) ::unlink((dir + "/" + name).c_str());
  ::rmdir(dir.c_str());
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TEST_CASE("an OOM under install_cpu writes the snapshot and report the error names", "[torch][oom]") {
  char tmpl[] = "/tmp/gpumem-oom-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  auto parsed = gpumem::torch::parse_config("memory_limit_mb:64,oom_report_dir:" + dir);
  REQUIRE(std::holds_alternative<gpumem::torch::Config>(parsed));
  gpumem::torch::install_cpu(std::get<gpumem::torch::Config>(parsed));

  std::vector<torch::Tensor> held;
  for (int i = 0; i < 6; ++i) held.push_back(torch::ones({8 << 20}, torch::kUInt8));  // 48 MiB
  std::string message;
  try {
    auto big = torch::empty({40 << 20}, torch::kUInt8);  // 40 MiB more: over the 64 MiB cap
    FAIL("no OutOfMemoryError under a 64 MiB cap");
  } catch (const c10::OutOfMemoryError& e) {
    message = e.what_without_backtrace();
  }
  INFO(message);
  // The request is said once, in one number format.
  CHECK(message.find("tried to allocate 40.00 MiB (requested 41943040 bytes)") != std::string::npos);
  CHECK(message.find("KiB") == std::string::npos);
  CHECK(message.find("Tried to allocate") == std::string::npos);
  const auto files = list_files(dir);
  REQUIRE(files.size() == 3);  // .pickle, .txt, .json
  std::string txt;
  for (const auto& name : files) {
    struct stat st {};
    REQUIRE(::stat((dir + "/" + name).c_str(), &st) == 0);
    CHECK(st.st_size > 0);
    if (!ends_with(name, ".json")) CHECK(message.find(name) != std::string::npos);
    if (ends_with(name, ".txt")) txt = dir + "/" + name;
  }
  CHECK(message.find("gpumem wrote an OOM report") != std::string::npos);
  REQUIRE(!txt.empty());
  std::ifstream in(txt);
  std::stringstream report;
  report << in.rdbuf();
  CHECK(report.str().find("verdict") != std::string::npos);
  // The program goes on: free, and allocate again.
  held.clear();
  auto again = torch::empty({40 << 20}, torch::kUInt8);
  CHECK(again.numel() == (40 << 20));
  remove_dir(dir);
}
