// Op attribution and the OOM postmortem end to end through libtorch on the CPU: gpumem installed
// as c10's CPU allocator (install_cpu), at::RecordFunction callbacks keeping OpStack current,
// EngineForensics on the CPU engine. Known ops are recorded by name (aten::mm, a user scope), and
// a deliberately fragmenting program's OOM postmortem says fragmentation with numbers equal to
// the engine's.
//
// Test cases run in name order (--order lex) and share the one CPU engine.
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/config.h"
#include "gpumem/forensics/engine_forensics.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/op_attribution.h"
#include "gpumem/forensics/op_attribution_torch.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/forensics/trace_ring.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"

namespace alloc = gpumem::alloc;
using gpumem::forensics::build_report;
using gpumem::forensics::EngineForensics;
using gpumem::forensics::load_snapshot;
using gpumem::forensics::MemoryReport;
using gpumem::forensics::ReportOptions;
using gpumem::forensics::Snapshot;
using gpumem::forensics::TraceAction;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
const c10::Device kCpu(c10::DeviceType::CPU);

// POSIX calls rather than std::filesystem: libtorch.so carries filesystem symbols of its own
// that calls from this binary can bind to.
std::string report_dir() {
  static const std::string dir = [] {
    std::string tmpl = "/tmp/gpumem-oom-test-XXXXXX";
    if (!::mkdtemp(tmpl.data())) std::abort();
    return tmpl;
  }();
  return dir;
}

bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

gpumem::torch::Config config() {
  gpumem::torch::Config c;
  c.engine.expandable_segments = false;  // classic segments: the fragmenting program fragments
  c.engine.memory_limit_bytes = 160 * kMiB;
  c.engine.thread_cache = false;
  c.forensics.trace_entries = 200000;
  c.forensics.record_ops = true;
  c.forensics.oom_report_dir = report_dir();
  return c;
}

EngineForensics& engine_forensics() {
  static std::unique_ptr<EngineForensics> fx = [] {
    torch::set_num_threads(1);
    gpumem::torch::install_cpu(config());
    (void)torch::empty({16});  // the CPU engine exists once something was allocated
    alloc::CachingAllocator* engine = gpumem::torch::engine(kCpu);
    REQUIRE(engine != nullptr);
    REQUIRE(gpumem::forensics::install_record_function_attribution());
    return std::make_unique<EngineForensics>(*engine, config().forensics);
  }();
  return *fx;
}

}  // namespace

TEST_CASE("attribution 1: allocations carry the op and user scope they happened in", "[torch][ops]") {
  EngineForensics& fx = engine_forensics();
  auto a = torch::ones({256, 256});
  auto b = torch::mm(a, a);
  torch::Tensor c;
  {
    RECORD_USER_SCOPE("my_block");
    c = torch::relu(b);
  }
  const Snapshot s = fx.snapshot();
  bool mm = false, scoped = false;
  for (const auto& e : s.device_traces.at(0)) {
    if (e.action != TraceAction::alloc) continue;
    if (e.addr == reinterpret_cast<std::uintptr_t>(b.data_ptr())) {
      CHECK(e.op == "aten::mm");
      CHECK(e.size_bytes == 256 * 256 * 4);
      mm = true;
    }
    if (e.addr == reinterpret_cast<std::uintptr_t>(c.data_ptr())) {
      CHECK(e.user_metadata == "my_block");
      CHECK(e.op.rfind("aten::", 0) == 0);
      scoped = true;
    }
  }
  CHECK(mm);
  CHECK(scoped);
  // The per-op table (built from the trace) has the ops with the bytes they allocated.
  bool mm_row = false;
  for (const auto& row : build_report(s).ops) {
    if (row.name == "aten::mm") {
      mm_row = true;
      CHECK(row.trace_alloc_bytes >= 256 * 256 * 4);
    }
  }
  CHECK(mm_row);
  // Live blocks know their op too.
  bool block = false;
  for (const auto& seg : s.segments) {
    for (const auto& blk : seg.blocks) {
      if (blk.address == reinterpret_cast<std::uintptr_t>(b.data_ptr())) {
        CHECK(blk.op == "aten::mm");
        block = true;
      }
    }
  }
  CHECK(block);
}

TEST_CASE("attribution 2: a fragmenting program's OOM postmortem says fragmentation", "[torch][oom]") {
  EngineForensics& fx = engine_forensics();
  alloc::CachingAllocator* engine = gpumem::torch::engine(kCpu);
  std::vector<torch::Tensor> kept;
  bool failed = false;
  for (int i = 0; i < 64 && !failed; ++i) {
    torch::Tensor big;
    try {
      big = torch::empty({static_cast<std::int64_t>(20 * kMiB)}, torch::kByte);
    } catch (const c10::OutOfMemoryError& e) {
      failed = true;
      auto files = fx.on_last_oom();
      REQUIRE(files.has_value());
      INFO(files->message);
      CHECK(files->verdict == "fragmentation");
      const MemoryReport r = build_report(load_snapshot(files->snapshot_path), ReportOptions{10, {}, {}, false});
      REQUIRE(r.oom.has_value());
      CHECK(r.oom->verdict == "fragmentation");
      CHECK(r.oom->request_bytes == 20 * kMiB);
      CHECK(r.oom->op == "aten::empty");
      const alloc::EngineTotals t = engine->totals();
      CHECK(r.fragmentation.allocated_bytes == t.allocated_bytes);
      CHECK(r.fragmentation.reserved_bytes == t.reserved_bytes);
      CHECK(r.fragmentation.free_bytes == t.cached_free_bytes);
      CHECK(r.fragmentation.largest_free_extent_bytes == t.largest_free_extent_bytes);
      CHECK(r.fragmentation.free_bytes >= 20 * kMiB);
      CHECK(file_exists(files->report_path));
      CHECK(file_exists(files->snapshot_path));
      CHECK(file_exists(files->json_path));
      for (const auto& f : {files->report_path, files->snapshot_path, files->json_path}) std::remove(f.c_str());
      break;
    }
    big.reset();
    kept.push_back(torch::empty({static_cast<std::int64_t>(11 * kMiB)}, torch::kByte));
  }
  CHECK(failed);
  CHECK(kept.size() >= 4);
  kept.clear();
  ::rmdir(report_dir().c_str());
}

TEST_CASE("attribution 3: the run-time switch turns op names off and on, safely while ops run",
          "[torch][ops]") {
  EngineForensics& fx = engine_forensics();
  auto a = torch::ones({64, 64});
  const auto op_of = [&](const torch::Tensor& t) -> std::optional<std::string> {
    const Snapshot s = fx.snapshot();
    std::optional<std::string> op;  // the latest alloc record at t's address
    for (const auto& e : s.device_traces.at(0)) {
      if (e.action == TraceAction::alloc && e.addr == reinterpret_cast<std::uintptr_t>(t.data_ptr())) op = e.op;
    }
    return op;
  };

  CHECK(gpumem::forensics::set_record_function_attribution(false));  // it was on
  CHECK_FALSE(gpumem::forensics::record_function_attribution_installed());
  auto off = torch::mm(a, a);
  CHECK(op_of(off) == std::optional<std::string>(""));
  CHECK_FALSE(gpumem::forensics::set_record_function_attribution(false));  // already off

  CHECK_FALSE(gpumem::forensics::set_record_function_attribution(true));
  CHECK(gpumem::forensics::record_function_attribution_installed());
  auto on = torch::mm(a, a);
  CHECK(op_of(on) == std::optional<std::string>("aten::mm"));

  // Another thread flips the switch while this one runs ops: ops that began with the callback
  // still end through it, so this thread's op stack is balanced afterwards.
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    bool enabled = false;
    while (!stop.load()) {
      gpumem::forensics::set_record_function_attribution(enabled);
      enabled = !enabled;
    }
  });
  for (int i = 0; i < 3000; ++i) (void)torch::relu(torch::mm(a, a));
  stop.store(true);
  flipper.join();
  CHECK(gpumem::forensics::OpStack::op_depth() == 0);
  gpumem::forensics::set_record_function_attribution(true);
  auto after = torch::mm(a, a);
  CHECK(op_of(after) == std::optional<std::string>("aten::mm"));

  // A ring configured without record_ops tags events while the switch is on, and only then.
  auto plain = std::make_shared<gpumem::forensics::TraceRing>(1000, /*record_ops=*/false);
  alloc::CachingAllocator* engine = gpumem::torch::engine(kCpu);
  engine->attach_observer(plain);
  auto tagged = torch::mm(a, a);
  gpumem::forensics::set_record_function_attribution(false);
  auto untagged = torch::mm(a, a);
  gpumem::forensics::set_record_function_attribution(true);
  engine->detach_observer(plain.get());
  const auto& names = gpumem::forensics::OpRegistry::global();
  std::string tagged_op = "?", untagged_op = "?";
  for (const auto& r : plain->records()) {
    if (r.event.kind != alloc::EventKind::alloc) continue;
    if (r.event.addr == reinterpret_cast<std::uintptr_t>(tagged.data_ptr())) tagged_op = names.name(r.op);
    if (r.event.addr == reinterpret_cast<std::uintptr_t>(untagged.data_ptr())) untagged_op = names.name(r.op);
  }
  CHECK(tagged_op == "aten::mm");
  CHECK(untagged_op.empty());
}
