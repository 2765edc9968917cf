// snapshot_write: how long writing a snapshot with 100,000 trace entries (op names included)
// takes, as pickle (what PyTorch's tools read) and as JSON. The snapshot is a gpumem engine's:
// a CachingAllocator on SimSource runs 50,000 alloc/free pairs of varied sizes under 40 op names
// with a TraceRing of 100,000 records, so segments, blocks and trace are real engine output.
// Prints the median of 15 writes of each format and the file sizes.
//
//   bench_snapshot_write [ENTRIES]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_args.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/forensics/engine_snapshot.h"
#include "gpumem/forensics/op_attribution.h"
#include "gpumem/forensics/snapshot_writer.h"
#include "gpumem/forensics/trace_ring.h"

using namespace gpumem;
using namespace gpumem::forensics;

namespace {

// CPU time of this thread: on a loaded machine wall time also counts waiting for a core.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t entries = 100000;
  gpumem::bench::BenchArgs("bench_snapshot_write", "[ENTRIES]")
      .positional_number("ENTRIES", entries, std::size_t{1}, std::size_t{1} << 32)
      .parse(argc, argv);
  alloc::SimSource source;
  auto events = alloc::make_immediate_events();
  alloc::Config config;
  alloc::CachingAllocator engine(source, *events, config);
  auto ring = std::make_shared<TraceRing>(entries, /*record_ops=*/true);
  engine.attach_observer(ring);

  const char* names[] = {"aten::mm", "aten::addmm", "aten::bmm", "aten::_softmax", "aten::gelu",
                         "aten::native_layer_norm", "aten::_scaled_dot_product_efficient_attention",
                         "aten::empty_strided", "aten::add", "aten::mul", "aten::cat", "aten::copy_",
                         "aten::embedding", "aten::nll_loss_forward", "aten::_log_softmax", "aten::dropout",
                         "aten::transpose", "aten::contiguous", "aten::sum", "aten::mean"};
  std::mt19937_64 rng(7);
  std::vector<void*> live;
  std::size_t step = 0;
  while (ring->size() < entries) {
    ScopedOp scope(step % 2 ? "forward" : "backward", true);
    ScopedOp op(names[rng() % 20]);
    if (live.size() < 200 || rng() % 2) {
      const std::size_t size = (rng() % 4 == 0) ? (1 + rng() % 64) << 20 : 512 + rng() % (1 << 20);
      auto r = engine.allocate(size, 0);
      if (r.ok()) live.push_back(r.ptr);
    } else {
      const std::size_t i = rng() % live.size();
      engine.free(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
    ++step;
  }
  const auto view = engine.snapshot();
  EngineSnapshotExtras extras;
  const auto records = ring->records();
  const Snapshot snap = snapshot_from_engine(view, records, extras);
  std::size_t trace_entries = 0;
  for (const auto& t : snap.device_traces) trace_entries += t.size();

  std::vector<double> pickle_ms, json_ms, convert_ms, pickle_cpu_ms;
  std::size_t pickle_bytes = 0, json_bytes = 0;
  for (int i = 0; i < 15; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    const std::string p = snapshot_to_pickle(snap);
    pickle_cpu_ms.push_back(thread_cpu_ms() - c0);
    auto t1 = std::chrono::steady_clock::now();
    const std::string j = snapshot_to_json(snap);
    auto t2 = std::chrono::steady_clock::now();
    const Snapshot again = snapshot_from_engine(view, records, extras);
    auto t3 = std::chrono::steady_clock::now();
    pickle_bytes = p.size();
    json_bytes = j.size();
    pickle_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    json_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    convert_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
    if (again.segments.size() != snap.segments.size()) return 1;
  }
  // Writing a file: conversion + pickle + the write itself.
  const std::string path = "/tmp/gpumem_bench_snapshot.pickle";
  std::vector<double> file_ms, file_cpu_ms;
  for (int i = 0; i < 15; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    write_snapshot(snapshot_from_engine(view, records, extras), path);
    file_cpu_ms.push_back(thread_cpu_ms() - c0);
    auto t1 = std::chrono::steady_clock::now();
    file_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  if (!std::getenv("GPUMEM_BENCH_KEEP")) std::remove(path.c_str());
  for (void* p : live) engine.free(p);

  std::printf("%s", fmt::format("snapshot: {} trace entries ({} op names), {} segments\n", trace_entries,
                                OpRegistry::global().size(), snap.segments.size())
                        .c_str());
  std::printf("%s", fmt::format("pickle: {:.1f} ms median of 15 ({:.1f} ms CPU; {:.1f} MB)\n", median_ms(pickle_ms),
                                median_ms(pickle_cpu_ms), static_cast<double>(pickle_bytes) / 1e6)
                        .c_str());
  std::printf("%s", fmt::format("json:   {:.1f} ms median of 15 ({:.1f} MB)\n", median_ms(json_ms),
                                static_cast<double>(json_bytes) / 1e6)
                        .c_str());
  std::printf("%s", fmt::format("engine view + ring -> Snapshot: {:.1f} ms median of 15\n", median_ms(convert_ms)).c_str());
  std::printf("%s", fmt::format("write_snapshot to a file (conversion + pickle + write): {:.1f} ms median of 15, "
                                "{:.1f} ms CPU (target: at most 50 ms)\n",
                                median_ms(file_ms), median_ms(file_cpu_ms))
                        .c_str());
  return 0;
}
