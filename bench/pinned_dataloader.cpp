// Pinned host memory for a DataLoader-style workload (tests/pinned/dataloader_workload.h): the
// bytes gpumem's pinned allocator locks against the bytes the workload requests, beside a model of
// PyTorch 2.11's CachingHostAllocator (every request rounded up to a power of two, one free list
// per power of two, no splitting or coalescing, a block reused once the events recorded on it
// have completed). Runs on the CPU stand-in source (nothing is locked or touched: the numbers are
// the allocator's accounting, which is the same on CUDA).
//
//   bench_pinned_dataloader [--steps N] [--seed S] [--region-mb M[,M...]] [--window W] [--lag L]
//                           [--multi-scale 0|1] [--dump FILE]
//
// --dump writes the workload instead (the line "window W lag L", then one line of request sizes per
// step), for bench/pinned_torch_dataloader.py to replay through PyTorch's own pinned allocator.
//
// Prints one row per configuration: peak requested, peak reserved (= locked on CUDA), their ratio,
// regions mapped, and the time per pinned allocation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dataloader_workload.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/pinned/pinned_allocator.h"

using namespace gpumem;
using namespace gpumem::pinned;

namespace {

struct Args {
  std::string dump_path;  // --dump: write the workload's requests, one step a line, and stop
  std::size_t steps = 3000;
  std::uint64_t seed = 2024;
  std::vector<std::size_t> region_mb = {2, 8, 32, 128};
  testing::DataLoaderShape shape;
};

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr,
             "bench_pinned_dataloader: {}\nusage: bench_pinned_dataloader [--steps N] [--seed S] "
             "[--region-mb M[,M...]] [--window W] [--lag L] [--multi-scale 0|1] [--dump FILE]\n",
             why);
  std::exit(2);
}

std::size_t number(const char* flag, const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0') usage(fmt::format("{} wants a non-negative integer, got '{}'", flag, text));
  return static_cast<std::size_t>(v);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) usage(fmt::format("{} needs a value", f));
    const char* v = argv[++i];
    if (f == "--steps") a.steps = number("--steps", v);
    else if (f == "--seed") a.seed = number("--seed", v);
    else if (f == "--window") a.shape.window = number("--window", v);
    else if (f == "--lag") a.shape.copy_lag = number("--lag", v);
    else if (f == "--multi-scale") a.shape.multi_scale = number("--multi-scale", v) != 0;
    else if (f == "--dump") a.dump_path = v;
    else if (f == "--region-mb") {
      a.region_mb.clear();
      std::string list = v;
      for (std::size_t pos = 0; pos <= list.size();) {
        const std::size_t comma = std::min(list.find(',', pos), list.size());
        a.region_mb.push_back(number("--region-mb", list.substr(pos, comma - pos).c_str()));
        pos = comma + 1;
      }
    } else {
      usage(fmt::format("unknown flag '{}'", f));
    }
  }
  if (a.steps == 0 || a.shape.window == 0) usage("--steps and --window must be positive");
  for (std::size_t mb : a.region_mb)
    if (mb == 0) usage("--region-mb values must be positive");
  return a;
}

// The workload against an allocator: alloc(size) -> handle, use(handle, stream), free(handle),
// complete(stream). Returns the peak of requested bytes that were live (allocated, or freed while
// their copy was in flight).
template <class Alloc, class Use, class Free, class Complete>
std::size_t run_workload(const Args& args, Alloc alloc_fn, Use use_fn, Free free_fn, Complete complete_fn) {
  std::mt19937_64 rng(args.seed);
  struct Batch {
    std::vector<std::pair<void*, std::size_t>> buffers;
    std::uint64_t stream;
  };
  std::deque<Batch> ahead;
  std::deque<std::pair<std::uint64_t, std::size_t>> copying;
  std::size_t live = 0, peak = 0;
  for (std::size_t step = 0; step < args.steps; ++step) {
    Batch b{{}, step + 1};
    for (std::size_t bytes : testing::next_batch(rng, step, args.shape)) {
      b.buffers.emplace_back(alloc_fn(bytes), bytes);
      live += bytes;
    }
    peak = std::max(peak, live);
    ahead.push_back(std::move(b));
    if (ahead.size() > args.shape.window) {
      std::size_t bytes = 0;
      for (auto [p, n] : ahead.front().buffers) {
        use_fn(p, ahead.front().stream);
        free_fn(p);
        bytes += n;
      }
      copying.emplace_back(ahead.front().stream, bytes);
      ahead.pop_front();
    }
    while (copying.size() > args.shape.copy_lag) {
      complete_fn(copying.front().first);
      live -= copying.front().second;
      copying.pop_front();
    }
  }
  return peak;
}

// PyTorch 2.11's CachingHostAllocator, as accounting: sizes rounded to a power of two; a freed block
// that was used on streams waits for their events, then joins the free list of its size.
struct PowerOfTwoModel {
  struct Block {
    std::size_t size;
    std::vector<std::uint64_t> streams;
  };
  std::map<std::size_t, std::vector<void*>> free_lists;
  std::map<void*, Block> blocks;
  std::vector<std::pair<void*, std::vector<std::uint64_t>>> pending;
  std::map<std::uint64_t, bool> done;
  std::uintptr_t next_addr = 0x1000;
  std::size_t reserved = 0, peak_reserved = 0;

  void* alloc(std::size_t bytes) {
    process();
    const std::size_t size = std::bit_ceil(bytes);
    auto& list = free_lists[size];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    void* p = reinterpret_cast<void*>(next_addr);
    next_addr += size;
    blocks[p] = {size, {}};
    reserved += size;
    peak_reserved = std::max(peak_reserved, reserved);
    return p;
  }
  void use(void* p, std::uint64_t stream) { blocks[p].streams.push_back(stream); }
  void free(void* p) {
    pending.emplace_back(p, std::move(blocks[p].streams));
    blocks[p].streams.clear();
  }
  void complete(std::uint64_t stream) { done[stream] = true; }
  void process() {
    std::vector<std::pair<void*, std::vector<std::uint64_t>>> still;
    for (auto& [p, streams] : pending) {
      if (std::all_of(streams.begin(), streams.end(), [&](std::uint64_t s) { return done.count(s) != 0; }))
        free_lists[blocks[p].size].push_back(p);
      else
        still.emplace_back(p, std::move(streams));
    }
    pending.swap(still);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (!args.dump_path.empty()) {
    std::FILE* out = std::fopen(args.dump_path.c_str(), "w");
    if (out == nullptr) {
      fmt::print(stderr, "bench_pinned_dataloader: cannot write {}: {}\n", args.dump_path, std::strerror(errno));
      return 1;
    }
    std::mt19937_64 rng(args.seed);
    fmt::print(out, "window {} lag {}\n", args.shape.window, args.shape.copy_lag);
    for (std::size_t step = 0; step < args.steps; ++step) {
      const auto sizes = testing::next_batch(rng, step, args.shape);
      fmt::print(out, "{}\n", fmt::join(sizes, " "));
    }
    std::fclose(out);
    return 0;
  }
  fmt::print("DataLoader-style workload ({}): {} steps, batch {}, window {}, copy lag {}, seed {}\n",
             args.shape.multi_scale ? "multi-scale images" : "224x224 images", args.steps, args.shape.batch,
             args.shape.window, args.shape.copy_lag, args.seed);
  fmt::print("{:<34} {:>14} {:>14} {:>7} {:>8} {:>10}\n", "allocator", "peak requested", "peak locked", "ratio",
             "regions", "ns/alloc");

  PowerOfTwoModel model;
  const std::size_t model_peak = run_workload(
      args, [&](std::size_t n) { return model.alloc(n); }, [&](void* p, std::uint64_t s) { model.use(p, s); },
      [&](void* p) { model.free(p); }, [&](std::uint64_t s) { model.complete(s); });
  fmt::print("{:<34} {:>14} {:>14} {:>7.3f} {:>8} {:>10}\n", "PyTorch model (power of two)", model_peak,
             model.peak_reserved, static_cast<double>(model.peak_reserved) / static_cast<double>(model_peak),
             model.blocks.size(), "-");

  for (std::size_t mb : args.region_mb) {
    LockedHostSource source({LockMode::none, 0});
    alloc::ManualStreamEvents events;
    PinnedOptions options;
    options.region_bytes = mb << 20;
    PinnedAllocator pa(source, events, options);
    std::uint64_t alloc_ns = 0, allocs = 0;
    PinnedTotals at_peak;
    const std::size_t peak = run_workload(
        args,
        [&](std::size_t n) {
          const auto t0 = std::chrono::steady_clock::now();
          auto r = pa.allocate(n);
          alloc_ns += static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
          ++allocs;
          if (const auto now = pa.totals(); now.reserved_bytes > at_peak.reserved_bytes) at_peak = now;
          if (!r.ok()) {
            fmt::print(stderr, "{}\n", r.error);
            std::exit(1);
          }
          return r.ptr;
        },
        [&](void* p, std::uint64_t s) { pa.record_stream(p, s); }, [&](void* p) { pa.free(p); },
        [&](std::uint64_t s) { events.complete_stream(s); });
    const auto t = pa.totals();
    fmt::print("{:<34} {:>14} {:>14} {:>7.3f} {:>8} {:>10}\n", fmt::format("gpumem pinned, region {} MiB", mb), peak,
               t.peak_reserved_bytes, static_cast<double>(t.peak_reserved_bytes) / static_cast<double>(peak),
               t.num_region_maps, allocs ? alloc_ns / allocs : 0);
    fmt::print("  at the peak: allocated {} + pending {} (size classes), requested {}, cached {} in {} regions\n",
               at_peak.allocated_bytes, at_peak.pending_free_bytes, at_peak.requested_bytes, at_peak.cached_bytes,
               at_peak.regions);
    pa.check_invariants();
  }
  return 0;
}
