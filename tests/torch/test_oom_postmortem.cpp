// The OOM postmortem end to end on CPU tensors: with oom_report_dir configured, an allocation
// that fails writes a snapshot and a report (text and JSON) there before the error is raised, and
// c10::OutOfMemoryError's message names the files; the report's verdict is read back.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <variant>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/config.h"
#include "gpumem/torch/install.h"

namespace fs = std::filesystem;

TEST_CASE("an OOM under install_cpu writes the snapshot and report the error names", "[torch][oom]") {
  const fs::path dir = fs::temp_directory_path() / ("gpumem-oom-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto parsed = gpumem::alloc::parse_config("memory_limit_mb:64,oom_report_dir:" + dir.string());
  REQUIRE(std::holds_alternative<gpumem::alloc::Config>(parsed));
  gpumem::torch::install_cpu(std::get<gpumem::alloc::Config>(parsed));

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
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  REQUIRE(files.size() == 3);  // .pickle, .txt, .json
  for (const auto& f : files) {
    CHECK(fs::file_size(f) > 0);
    if (f.extension() != ".json") CHECK(message.find(f.filename().string()) != std::string::npos);
  }
  CHECK(message.find("gpumem wrote an OOM report") != std::string::npos);
  fs::path txt;
  for (const auto& f : files)
    if (f.extension() == ".txt") txt = f;
  REQUIRE(!txt.empty());
  std::ifstream in(txt);
  std::stringstream report;
  report << in.rdbuf();
  CHECK(report.str().find("erdict") != std::string::npos);
  // The program goes on: free, and allocate again.
  held.clear();
  auto again = torch::empty({40 << 20}, torch::kUInt8);
  CHECK(again.numel() == (40 << 20));
  fs::remove_all(dir);
}
