// What gpumem's in-process forensics cost the engine per alloc+free pair, on SimSource (no GPU),
// composed as the torch adapter composes them (torch/src/device_engine.cpp): the stats observer
// always, the device's trace ring while it records (trace_entries, or the postmortem's floor),
// EngineForensics when record_ops or oom_report_dir is set. Cases:
//   plain          stats observer: gpumem alone
//   trace          trace_entries:100000 (the live measurement's gpumem_trace mode)
//   ops            record_ops:True (gpumem_ops; the RecordFunction callbacks are libtorch's and
//                  not part of this bench: ops are pushed with OpStack as the callbacks do)
//   trace+ops      trace_entries:262144,record_ops:True (bench_op_attribution_overhead's "on")
//   postmortem     oom_report_dir set (the postmortem's ring and the tracker; no Python stacks)
// Workload: a window of W live blocks (sizes log-uniform in 512 B..32 MiB, bench/alloc_pattern.h),
// each step frees a random one and allocates a new size inside an op (OpStack push/pop around it,
// a few op names). Cases alternate for R rounds on fresh engines; prints the median ns per pair and
// the difference to plain. Under callgrind, use small --ops and --rounds 1 and compare instruction
// counts per case with --only CASE.
//
//   bench_forensics_observers [--ops N] [--window W] [--rounds R] [--only CASE]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "alloc_pattern.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/alloc/stats.h"
#include "gpumem/forensics/config.h"
#include "gpumem/forensics/engine_forensics.h"
#include "gpumem/forensics/op_attribution.h"
#include "gpumem/forensics/trace_ring.h"

using namespace gpumem;

namespace {

struct Case {
  const char* name;
  forensics::Config config;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"plain", {}});
  forensics::Config trace;
  trace.trace_entries = 100000;
  out.push_back({"trace", trace});
  forensics::Config ops;
  ops.record_ops = true;
  out.push_back({"ops", ops});
  forensics::Config both;
  both.trace_entries = 262144;
  both.record_ops = true;
  out.push_back({"trace+ops", both});
  forensics::Config postmortem;
  postmortem.oom_report_dir = "/nonexistent-gpumem-bench";  // never written: no OOM happens
  postmortem.python_stacks = forensics::StackMode::off;
  out.push_back({"postmortem", postmortem});
  return out;
}

// One engine composed like the adapter's.
struct Engine {
  alloc::SimSource source;
  std::unique_ptr<alloc::StreamEvents> events = alloc::make_immediate_events();
  std::unique_ptr<alloc::CachingAllocator> engine;
  std::shared_ptr<forensics::TraceRing> ring = std::make_shared<forensics::TraceRing>();
  std::unique_ptr<forensics::EngineForensics> fx;
  explicit Engine(const forensics::Config& config) : source(options()) {
    alloc::Config cfg;
    cfg.va_reserve_bytes = std::size_t{1} << 42;
    engine = std::make_unique<alloc::CachingAllocator>(source, *events, cfg);
    engine->attach_observer(std::make_shared<alloc::StatsObserver>());
    ring->configure(forensics::TraceSettings{config.trace_entries, 0, false}, /*clear=*/true);
    ring->leave_oom_to_caller(true);
    if (!config.oom_report_dir.empty() || config.record_ops)
      fx = std::make_unique<forensics::EngineForensics>(*engine, config, ring, "bench");
    if (ring->active()) engine->attach_observer(ring);  // as DeviceEngine::sync_trace_observer
  }
  ~Engine() { fx.reset(); }
  static alloc::SimSourceOptions options() {
    alloc::SimSourceOptions so;
    so.capacity_bytes = std::size_t{1} << 46;
    return so;
  }
};

// ns per pair over `ops` steps of the window pattern, on a fresh engine (the ring fills first:
// warm-up of a whole ring's worth of events, so that the timed steps overwrite, as in a long run).
double measure(const forensics::Config& config, std::size_t ops, std::size_t window, std::uint64_t seed) {
  Engine e(config);
  const bench::AllocPattern pattern{"window", 0, window};
  const std::size_t warm = std::max<std::size_t>(config.trace_entries, 65536) / 3 + 1;
  const bench::AllocSequence seq = bench::make_alloc_sequence(pattern, warm + ops, seed);
  static const char* const kOps[] = {"aten::empty", "aten::mm", "aten::add", "aten::gelu", "aten::cat"};
  std::vector<void*> live(window);
  for (std::size_t i = 0; i < window; ++i) live[i] = e.engine->allocate(seq.sizes[i], 0).ptr;
  auto step = [&](std::size_t i) {
    void*& slot = live[seq.slots[i]];
    e.engine->free(slot);
    forensics::OpStack::push_op_name(kOps[i % 5]);
    auto r = e.engine->allocate(seq.sizes[window + i], 0);
    forensics::OpStack::pop_op();
    if (!r.ok()) std::abort();
    slot = r.ptr;
  };
  for (std::size_t i = 0; i < warm; ++i) step(i);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = warm; i < warm + ops; ++i) step(i);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  for (void* p : live) e.engine->free(p);
  return ns / static_cast<double>(ops);
}

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr, "bench_forensics_observers: {}\nusage: bench_forensics_observers [--ops N] [--window W] "
                     "[--rounds R] [--only CASE]\n",
             why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 200000, window = 1024;
  int rounds = 5;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--ops") ops = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--window") window = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else if (k == "--only") only = v;
    else usage("unknown option '" + k + "'");
  }
  if (ops == 0 || window == 0 || rounds <= 0) usage("--ops, --window and --rounds must be positive");
  std::vector<Case> all = cases();
  if (!only.empty()) {
    std::erase_if(all, [&](const Case& c) { return only != c.name; });
    if (all.empty()) usage("--only: no case named '" + only + "' (plain, trace, ops, trace+ops, postmortem)");
  }
  std::vector<std::vector<double>> ns(all.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t c = 0; c < all.size(); ++c) ns[c].push_back(measure(all[c].config, ops, window, 7 + r));
  fmt::print("engine on SimSource, window {} live blocks, {} pairs per case, median of {} rounds\n", window, ops, rounds);
  fmt::print("{:<12} {:>12} {:>14} {:>12}\n", "case", "ns/pair", "min..max", "vs plain");
  double plain = 0;
  for (std::size_t c = 0; c < all.size(); ++c) {
    auto v = ns[c];
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    if (std::strcmp(all[c].name, "plain") == 0) plain = med;
    fmt::print("{:<12} {:>12.1f} {:>6.1f}..{:<7.1f} {:>12}\n", all[c].name, med, v.front(), v.back(),
               plain > 0 ? fmt::format("{:+.1f} ns", med - plain) : std::string("-"));
  }
  return 0;
}
