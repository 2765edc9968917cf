#include "gpumem/zero/rank_monitor.h"

#include "gpumem/zero/error_message.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace gpumem::zero {
namespace {

constexpr const char* kCountKey = "gpumem_zero/failures";

std::string failure_key(int rank) { return fmt::format("gpumem_zero/failure/{}", rank); }

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

RankMonitor::RankMonitor(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                         RankMonitorOptions options)
    : rank_(rank), world_size_(world_size), options_(options) {
  if (!store) throw std::invalid_argument("RankMonitor: the store is null");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument(
        fmt::format("RankMonitor: rank {} is outside a world of {}", rank, world_size));
  }
  if (options.poll_interval.count() <= 0 || options.grace.count() < 0 ||
      options.report_wait.count() < 0) {
    throw std::invalid_argument(
        "RankMonitorOptions: poll_interval must be > 0, grace and report_wait >= 0");
  }
  // Its own connection: the main thread may be blocked in the store (a rendezvous waiting for a
  // rank that died), and a store client serializes its operations.
  try {
    store_ = store->clone();
  } catch (const std::exception&) {
    store_ = store;  // stores that cannot clone (in-process ones) need no second connection
  }
  if (!store_) store_ = store;
  if (options_.watchdog && world_size_ > 1) watchdog_ = std::thread([this] { watch(); });
}

RankMonitor::~RankMonitor() { finish(); }

void RankMonitor::finish() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
}

std::vector<RankFailure> RankMonitor::failures() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RankFailure> out;
  if (store_->add(kCountKey, 0) == 0) return out;
  for (int r = 0; r < world_size_; ++r) {
    const std::string key = failure_key(r);
    if (!store_->check({key})) continue;
    const std::vector<std::uint8_t> raw = store_->get(key);
    const std::string text(raw.begin(), raw.end());
    const std::size_t newline = text.find('\n');
    RankFailure f;
    f.rank = r;
    f.order = std::strtoll(text.substr(0, newline).c_str(), nullptr, 10);
    f.reason = newline == std::string::npos ? std::string() : text.substr(newline + 1);
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(),
            [](const RankFailure& a, const RankFailure& b) { return a.order < b.order; });
  return out;
}

std::string RankMonitor::report_failure(const std::string& reason) noexcept {
  try {
    if (reported_.exchange(true)) return reason;
    finish();  // this rank ends by itself; the watchdog has nothing left to do
    std::string store_problem;
    std::vector<RankFailure> reports;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::int64_t order = store_->add(kCountKey, 1);
      store_->set(failure_key(rank_), bytes_of(fmt::format("{}\n{}", order, reason)));
    } catch (const std::exception& e) {
      store_problem = fmt::format("could not report to the store: {}", error_message(e));
    }
    // Give the other ranks a moment to report theirs: the first report names the cause.
    const auto deadline = std::chrono::steady_clock::now() + options_.report_wait;
    while (store_problem.empty()) {
      try {
        reports = failures();
      } catch (const std::exception& e) {
        store_problem =
            fmt::format("could not read the other ranks' reports: {}", error_message(e));
        break;
      }
      if (static_cast<int>(reports.size()) >= world_size_ ||
          std::chrono::steady_clock::now() >= deadline) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return compose(reason, reports, store_problem);
  } catch (...) {
    return reason;
  }
}

std::string RankMonitor::compose(const std::string& reason, const std::vector<RankFailure>& reports,
                                 const std::string& store_problem) const {
  std::string out = fmt::format("rank {} of {} failed: {}", rank_, world_size_, reason);
  std::vector<bool> reported(static_cast<std::size_t>(world_size_), false);
  bool others = false;
  for (const RankFailure& f : reports) {
    reported[static_cast<std::size_t>(f.rank)] = true;
    others = others || f.rank != rank_;
  }
  if (others) {
    out += "\nfailures reported by the ranks, in the order reported (the first is usually the "
           "cause, unless a rank died without reporting: see below):";
    for (const RankFailure& f : reports) {
      out += fmt::format("\n  {}. rank {}{}: {}", f.order, f.rank,
                         f.rank == rank_ ? " (this rank)" : "", f.reason);
    }
  }
  if (store_problem.empty() && !reports.empty()) {
    std::string silent;
    for (int r = 0; r < world_size_; ++r) {
      if (!reported[static_cast<std::size_t>(r)])
        silent += fmt::format("{}{}", silent.empty() ? "" : ", ", r);
    }
    if (!silent.empty()) {
      out += fmt::format(
          "\nranks that reported no failure: {} (died without a word, stalled, or still running; "
          "a stalled rank is ended by its watchdog)",
          silent);
    }
  }
  if (!store_problem.empty()) out += "\n" + store_problem;
  return out;
}

void RankMonitor::watch() {
  std::optional<std::chrono::steady_clock::time_point> alarm_since;
  std::string alarm;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    stop_cv_.wait_for(lock, options_.poll_interval, [this] { return stop_; });
    if (stop_) break;
    std::int64_t count = 0;
    std::string problem;
    try {
      count = store_->add(kCountKey, 0);
    } catch (const std::exception& e) {
      problem = fmt::format(
          "the rendezvous store is unreachable ({}): rank 0 or the launcher has exited",
          error_message(e));
    }
    if (count == 0 && problem.empty()) continue;
    if (!alarm_since) {
      alarm_since = std::chrono::steady_clock::now();
      alarm = problem;
    }
    if (std::chrono::steady_clock::now() - *alarm_since < options_.grace) continue;
    // Still running a grace period after the alarm: this rank is stuck.
    lock.unlock();
    std::string why;
    if (alarm.empty()) {
      std::vector<RankFailure> reports;
      try {
        reports = failures();
      } catch (const std::exception& e) {
        alarm = fmt::format("the rendezvous store became unreachable ({})", error_message(e));
      }
      why = compose(
          fmt::format("ended by the watchdog: other ranks failed {} ms ago and this rank did not "
                      "end by itself (stalled outside a collective, or in one without a timeout)",
                      options_.grace.count()),
          reports, alarm);
    } else {
      why = compose(fmt::format("ended by the watchdog {} ms after {}", options_.grace.count(),
                                alarm),
                    {}, "");
    }
    end_process(why);
  }
}

void RankMonitor::end_process(const std::string& why) {
  if (!reported_.exchange(true)) {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::int64_t order = store_->add(kCountKey, 1);
      store_->set(failure_key(rank_),
                  bytes_of(fmt::format("{}\nstalled; ended by its watchdog", order)));
    } catch (...) {
      // The store is gone: nothing to tell the others.
    }
  }
  std::fprintf(stderr, "gpumem::zero %s\n", why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(options_.exit_code);
}

}  // namespace gpumem::zero
