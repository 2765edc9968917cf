// What one acquisition of a lock costs when 1..T threads take it in a loop around a short
// critical section that writes K shared cache lines, with some private work between acquisitions:
// the shape of the engine lock when every thread allocates large blocks (a pair writes a few lines
// of the engine's structures under the lock, and does its events and checks outside).
//
//   bench_lock_handoff [--ms M] [--threads T] [--lines K] [--outside W] [--rounds R] [--tsv]
//
// Each cell runs for M milliseconds (default 100).
//
// Locks compared:
//   spin        the engine's lock (gpumem SpinLock: test-and-test-and-set, 64 pauses, then yield)
//   mutex       std::mutex (glibc: a futex after one failed try)
//   spin_park   spins like `spin` for up to 128 pauses, then sleeps on a futex (std::atomic wait)
//   ticket      a FIFO ticket lock (spinning with pause; yields after 1,024 pauses)
// Prints ns per acquisition per thread (median and spread of R rounds) for 1, 2, .., T threads;
// the 1-thread row is the lock's uncontended cost plus the work. --tsv: one line per cell,
//   lock <TAB> lock name <TAB> threads <TAB> median_ns <TAB> min_ns <TAB> max_ns
// The shared lines are checked after each run (a lock that lost an update aborts).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "spread.h"
#include "gpumem/alloc/spin_lock.h"

namespace {

inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spin, then park: 0 free, 1 held, 2 held with sleepers (Drepper, "Futexes are tricky", mutex2).
class SpinParkLock {
 public:
  void lock() noexcept {
    for (int i = 0; i < 128; ++i) {
      int expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, 1, std::memory_order_acquire, std::memory_order_relaxed))
        return;
      cpu_pause();
    }
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) state_.notify_one();
  }

 private:
  std::atomic<int> state_{0};
};

class TicketLock {
 public:
  void lock() noexcept {
    const std::uint32_t mine = next_.fetch_add(1, std::memory_order_relaxed);
    // Yields after a while: with more threads than cores a descheduled ticket holder (or the next
    // in line) would otherwise stall every waiter for a time slice.
    for (unsigned spins = 0; serving_.load(std::memory_order_acquire) != mine; ++spins)
      if (spins < 1024) cpu_pause();
      else std::this_thread::yield();
  }
  void unlock() noexcept { serving_.store(serving_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

 private:
  alignas(64) std::atomic<std::uint32_t> next_{0};
  alignas(64) std::atomic<std::uint32_t> serving_{0};
};

struct alignas(64) Line {
  std::uint64_t value = 0;
};

// Private work between acquisitions: a dependent chain the compiler cannot drop.
std::uint64_t outside_work(std::uint64_t x, unsigned steps) noexcept {
  for (unsigned i = 0; i < steps; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

// One cell: `threads` threads take the lock in a loop for `ms` milliseconds (time-bounded, so a
// lock that stalls on an oversubscribed machine cannot hold the run up). Returns ns per
// acquisition per thread.
template <class Lock>
double run(int threads, std::size_t ms, std::size_t lines, unsigned outside) {
  Lock lock;
  std::vector<Line> shared(lines);
  std::vector<std::size_t> ops(static_cast<std::size_t>(threads));
  std::vector<double> elapsed_ns(static_cast<std::size_t>(threads));
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> sink{0};
  std::barrier start(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::uint64_t x = static_cast<std::uint64_t>(t) + 1;
      std::size_t n = 0;
      start.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      while (!stop.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 64; ++k) {
          lock.lock();
          for (Line& l : shared) ++l.value;
          lock.unlock();
          x = outside_work(x, outside);
        }
        n += 64;
      }
      elapsed_ns[static_cast<std::size_t>(t)] =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      ops[static_cast<std::size_t>(t)] = n;
      sink.fetch_add(x, std::memory_order_relaxed);
    });
  start.arrive_and_wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  stop.store(true, std::memory_order_relaxed);
  for (auto& th : pool) th.join();
  std::size_t total = 0;
  for (std::size_t n : ops) total += n;
  for (const Line& l : shared)
    if (l.value != total) {
      fmt::print(stderr, "bench_lock_handoff: a lock lost an update ({} of {})\n", l.value, total);
      std::abort();
    }
  double ns = 0;
  for (std::size_t t = 0; t < ops.size(); ++t) ns += elapsed_ns[t] / static_cast<double>(ops[t]) / threads;
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ms = 100, lines = 8;
  unsigned outside = 32;
  int threads = 4, rounds = 3;
  bool tsv = false;
  gpumem::bench::BenchArgs args("bench_lock_handoff",
                                "[--ms M] [--threads T] [--lines K] [--outside W] [--rounds R] [--tsv]");
  args.count("--ms", ms, 1)
      .number("--threads", threads, 1, 256)
      .count("--lines", lines)
      .number("--outside", outside, 0u, 1'000'000u)
      .number("--rounds", rounds, 1, 1000)
      .flag("--tsv", tsv);
  args.parse(argc, argv);

  struct Kind {
    const char* name;
    double (*run)(int, std::size_t, std::size_t, unsigned);
  };
  const Kind kinds[] = {{"spin", run<gpumem::alloc::detail::SpinLock>},
                        {"mutex", run<std::mutex>},
                        {"spin_park", run<SpinParkLock>},
                        {"ticket", run<TicketLock>}};
  if (!tsv) {
    fmt::print("ns per acquisition per thread: {} shared lines written under the lock, {} LCG steps outside, "
               "{} ms per cell, median (min..max) of {} rounds; host: {} CPUs\n",
               lines, outside, ms, rounds, std::thread::hardware_concurrency());
    fmt::print("{:<10}", "threads");
    for (const Kind& k : kinds) fmt::print(" {:>22}", k.name);
    fmt::print("\n");
  }
  for (int t = 1; t <= threads; ++t) {
    if (!tsv) fmt::print("{:<10}", t);
    for (const Kind& k : kinds) {
      std::vector<double> v;
      for (int r = 0; r < rounds; ++r) v.push_back(k.run(t, ms, lines, outside));
      const gpumem::bench::Spread s = gpumem::bench::spread_of(v);
      if (tsv) fmt::print("lock\t{}\t{}\t{:.1f}\t{:.1f}\t{:.1f}\n", k.name, t, s.median, s.min, s.max);
      else fmt::print(" {:>22}", gpumem::bench::format_spread(s, rounds));
      std::fflush(stdout);
    }
    if (!tsv) fmt::print("\n");
  }
  return 0;
}
