// ns per alloc+free pair when one thread allocates and another frees what it allocated: the
// producer allocates sizes log-uniform in 512 B..1 MiB and hands each pointer over a bounded ring
// (1,024 in flight) to the consumer, which frees it. The shape of a thread that only frees (a
// queue's consumer dropping tensors another thread made), the one case where an arena's thread
// caches now stay off (docs/notes/thread-caches.md, "Caches in an arena only where they help").
//
//   bench_producer_consumer [--pairs N] [--rounds R] [--config TEXT]...
//
// Each --config (GPUMEM_ALLOC_CONF's engine syntax; default: the default engine, "") is measured R
// times, the configurations alternated round by round, each round a fresh engine on SimSource.
// Prints per configuration the median and spread (min..max) of the rounds' ns per pair (the
// producer's wall time over N pairs, the consumer's last free included), and for the last round
// whether thread caches came on, the engine lock's contended acquisitions per allocation and the
// peak physical memory. Every free must succeed and nothing may stay allocated after a round.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "alloc_pattern.h"
#include "bench_args.h"
#include "spread.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/config.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/alloc/sim_source.h"

namespace {

using gpumem::alloc::CachingAllocator;
using gpumem::alloc::Config;
using gpumem::alloc::FreeStatus;

struct Round {
  double ns_per_pair = 0;
  bool caches_on = false;
  double contended_per_alloc = 0;
  std::size_t peak_physical = 0;
};

Round run_round(const Config& config, const std::vector<std::size_t>& sizes) {
  gpumem::alloc::SimSource source;
  gpumem::alloc::ManualStreamEvents events;
  CachingAllocator engine(source, events, config);
  constexpr std::size_t kRing = 1024;
  std::vector<std::atomic<void*>> ring(kRing);
  std::atomic<std::size_t> produced{0}, consumed{0};
  std::atomic<std::size_t> bad_frees{0};
  const std::size_t n = sizes.size();
  std::thread consumer([&] {
    for (std::size_t i = 0; i < n; ++i) {
      while (consumed.load(std::memory_order_relaxed) == produced.load(std::memory_order_acquire)) {
      }
      void* p = ring[i % kRing].load(std::memory_order_relaxed);
      consumed.store(i + 1, std::memory_order_release);
      if (engine.free(p) != FreeStatus::ok) bad_frees.fetch_add(1, std::memory_order_relaxed);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    gpumem::alloc::AllocResult r = engine.allocate(sizes[i], 0);
    if (!r.ok()) {
      fmt::print(stderr, "bench_producer_consumer: allocation {} of {} bytes failed\n", i, sizes[i]);
      std::exit(1);
    }
    while (produced.load(std::memory_order_relaxed) - consumed.load(std::memory_order_acquire) >= kRing) {
    }
    ring[i % kRing].store(r.ptr, std::memory_order_relaxed);
    produced.store(i + 1, std::memory_order_release);
  }
  consumer.join();
  const auto end = std::chrono::steady_clock::now();
  if (bad_frees.load() != 0 || engine.totals().allocated_bytes != 0) {
    fmt::print(stderr, "bench_producer_consumer: {} frees failed, {} bytes left allocated\n", bad_frees.load(),
               engine.totals().allocated_bytes);
    std::exit(1);
  }
  Round out;
  out.ns_per_pair = std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(n);
  out.caches_on = engine.thread_caches_on();
  out.contended_per_alloc = static_cast<double>(engine.lock_counts().contended) / static_cast<double>(n);
  out.peak_physical = source.peak_physical_bytes();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t pairs = 1000000;
  int rounds = 3;
  std::vector<std::string> config_texts;
  gpumem::bench::BenchArgs args("bench_producer_consumer", "[--pairs N] [--rounds R] [--config TEXT]...");
  args.count("--pairs", pairs, 1).number("--rounds", rounds, 1, 1000).texts("--config", config_texts);
  args.parse(argc, argv);
  if (config_texts.empty()) config_texts.emplace_back();
  std::vector<Config> configs;
  for (const std::string& text : config_texts) {
    auto parsed = gpumem::alloc::parse_config(text);
    if (auto* error = std::get_if<gpumem::alloc::ConfigError>(&parsed)) args.fail("--config: " + error->message);
    configs.push_back(std::get<Config>(parsed));
  }
  const std::vector<std::size_t> sizes = gpumem::bench::log_uniform_sizes(pairs, 42, 512.0, 1024.0 * 1024);
  std::vector<std::vector<double>> times(configs.size());
  std::vector<Round> last(configs.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t c = 0; c < configs.size(); ++c) {
      last[c] = run_round(configs[c], sizes);
      times[c].push_back(last[c].ns_per_pair);
    }
  fmt::print("gpumem engine on SimSource: one thread allocates {} pairs (512 B-1 MiB), another frees them; "
             "median (min..max) of {} rounds\n",
             pairs, rounds);
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const auto s = gpumem::bench::spread_of(times[c]);
    fmt::print("config '{}': {} ns per pair (last round: thread caches {}, {:.4f} contended per allocation, peak "
               "physical {} MiB)\n",
               config_texts[c], gpumem::bench::format_spread(s, rounds), last[c].caches_on ? "on" : "off",
               last[c].contended_per_alloc, last[c].peak_physical >> 20);
  }
  return 0;
}
