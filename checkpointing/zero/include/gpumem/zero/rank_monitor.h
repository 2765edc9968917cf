// RankMonitor: failure reports and a watchdog, so that when one rank of a distributed job fails
// or stalls, every rank ends within a bounded time with an error that names what happened.
//
// A collective only tells the ranks waiting in it that something is wrong ("Connection closed by
// peer", a timeout); it cannot say which rank failed first or why, and it cannot end a rank that
// is stuck outside any collective. So every rank also talks through the rendezvous store:
//
//   * report_failure(reason): a rank that fails writes its reason to the store, waits briefly for
//     the other ranks' reports and returns one message: its own reason, every report in the order
//     they were made (the first is usually the cause; the others are its consequences), and the
//     ranks that reported nothing (stalled, killed, or still running).
//   * The watchdog: a thread that polls the store's failure count every poll_interval. Once another
//     rank has reported a failure, or the store has become unreachable (rank 0 or the launcher
//     exited), this rank has `grace` to end by itself: a rank waiting in a collective fails there
//     and reports on its own. A rank still running after the grace period (stalled in compute, in
//     user code, or in a collective without a timeout) is ended by the watchdog: it prints the
//     reports to stderr and exits the process with exit_code, as NCCL's watchdog ends a process
//     whose collectives have failed.
//   * finish(): after the rank's last collective, stops the watchdog, so that ranks leaving at
//     different moments (rank 0 takes its store with it) are not mistaken for failures.
//
// Store keys (under "gpumem_zero/"): "failures" counts the reports (Store::add gives each report
// its order); "failure/<rank>" holds "<order>\n<reason>". The monitor talks through its own client
// connection (Store::clone()), so a main thread blocked in the store does not block it.
//
// Thread-safety: report_failure(), failures() and finish() may be called from any thread; the
// watchdog thread is owned by the monitor and joined by finish() and the destructor.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpumem::zero {

struct RankMonitorOptions {
  // How often the watchdog reads the store's failure count.
  std::chrono::milliseconds poll_interval{250};
  // How long this rank may go on after another rank failed or the store vanished before the
  // watchdog ends it. Longer than the time a rank needs to notice the failure in a collective
  // and report it (which the collective timeout bounds), so ranks fail on their own if they can.
  std::chrono::milliseconds grace{std::chrono::seconds(30)};
  // How long report_failure() waits for the other ranks' reports before composing its message.
  std::chrono::milliseconds report_wait{1500};
  // false: no watchdog thread (reports only).
  bool watchdog = true;
  // The process exit code when the watchdog ends a rank.
  int exit_code = 3;
};

struct RankFailure {
  int rank = -1;
  std::int64_t order = 0;  // 1 for the first report of the job, 2 for the second, ...
  std::string reason;
};

class RankMonitor {
 public:
  // `store` is the job's rendezvous store (the monitor clones its own connection from it).
  // Throws std::invalid_argument on a rank outside [0, world_size) or a bad option.
  RankMonitor(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
              RankMonitorOptions options = {});
  ~RankMonitor();
  RankMonitor(const RankMonitor&) = delete;
  RankMonitor& operator=(const RankMonitor&) = delete;

  // Reports this rank's failure to the others (at most once; never throws) and returns the
  // message to print: see above. Also stops the watchdog: this rank is ending by itself.
  std::string report_failure(const std::string& reason) noexcept;

  // The reports made so far, in the order they were made. Throws if the store is unreachable.
  std::vector<RankFailure> failures();

  // Stops the watchdog (idempotent). Call after this rank's last collective.
  void finish() noexcept;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  void watch();
  [[noreturn]] void end_process(const std::string& why);
  std::string compose(const std::string& reason, const std::vector<RankFailure>& reports,
                      const std::string& store_problem) const;

  c10::intrusive_ptr<c10d::Store> store_;  // the monitor's own connection
  const int rank_;
  const int world_size_;
  const RankMonitorOptions options_;
  std::mutex mutex_;  // guards the store connection and stop_
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::atomic<bool> reported_{false};
  std::thread watchdog_;
};

}  // namespace gpumem::zero
