// Test doubles that widen the windows in which the engine's lock is dropped:
//
//   SlowSource  a MemorySource decorator that sleeps in create/map/unmap/reserve (a seeded
//               random time up to a bound), can hold a call at a gate until the test opens it, and
//               can fail the Nth call of a kind. It counts the calls that are in flight at once,
//               so a test can see that the engine did not serialize them behind its lock.
//   SlowEvents  a StreamEvents decorator whose synchronize_stream / synchronize sleep or wait at
//               a gate.
//
// Thread-safety: every member is safe to call from several threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>

#include "gpumem/alloc/forwarding_source.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc::test {

// A gate calls wait at: closed, callers block (and are counted) until it opens.
class Gate {
 public:
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock lock(mutex_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    --waiting_;
  }
  // Waits until at least n callers are blocked at the gate (false after the timeout).
  bool wait_for_waiters(int n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = true;
  int waiting_ = 0;
};

class SlowSource final : public ForwardingSource {
 public:
  enum class Op : std::uint8_t { reserve, create, map, unmap };

  SlowSource(MemorySource& inner, std::chrono::microseconds max_sleep, std::uint64_t seed = 1)
      : ForwardingSource(inner), max_sleep_(max_sleep), rng_(seed) {}

  Gate& gate(Op op) { return gates_[static_cast<int>(op)]; }
  // The next call of op fails when fail_next(op) was called (one-shot).
  void fail_next(Op op) { fail_[static_cast<int>(op)].store(true); }
  void clear_faults() {
    for (auto& f : fail_) f.store(false);
  }
  std::size_t max_in_flight() const { return max_in_flight_.load(); }
  std::size_t total_calls() const { return calls_.load(); }
  // Pretend the provider's total is unknown (0), as a source that cannot tell reports it.
  void report_unknown_total(bool v) { unknown_total_ = v; }

  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override {
    Call c(*this, Op::reserve);
    if (c.injected) return {SourceStatus::fault_injected, {}};
    return ForwardingSource::reserve(size_bytes, alignment_bytes);
  }
  SourceResult<PhysHandle> create(std::size_t size_bytes) override {
    Call c(*this, Op::create);
    if (c.injected) return {SourceStatus::fault_injected, 0};
    return ForwardingSource::create(size_bytes);
  }
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override {
    Call c(*this, Op::map);
    if (c.injected) return SourceStatus::fault_injected;
    return ForwardingSource::map(va, size_bytes, handle);
  }
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override {
    Call c(*this, Op::unmap);
    if (c.injected) return SourceStatus::fault_injected;
    return ForwardingSource::unmap(va, size_bytes);
  }
  ProviderMemInfo mem_info() const override {
    ProviderMemInfo m = ForwardingSource::mem_info();
    if (unknown_total_) m = {};
    return m;
  }
  // The steady clock (MemorySource's), not the inner source's: these calls take real time (sleeps,
  // gates), and a SimSource's clock stands still.
  std::int64_t now_ns() const override { return MemorySource::now_ns(); }

 private:
  // One call: counted in flight, held at the op's gate, slept, maybe failed.
  struct Call {
    Call(SlowSource& s, Op op) : s(s) {
      s.calls_.fetch_add(1);
      const std::size_t now = s.in_flight_.fetch_add(1) + 1;
      std::size_t seen = s.max_in_flight_.load();
      while (now > seen && !s.max_in_flight_.compare_exchange_weak(seen, now)) {
      }
      s.gates_[static_cast<int>(op)].pass();
      if (s.max_sleep_.count() > 0) std::this_thread::sleep_for(s.sleep_time());
      injected = s.fail_[static_cast<int>(op)].exchange(false);
    }
    ~Call() { s.in_flight_.fetch_sub(1); }
    SlowSource& s;
    bool injected = false;
  };
  std::chrono::microseconds sleep_time() {
    std::lock_guard lock(rng_mutex_);
    return std::chrono::microseconds(rng_() % (max_sleep_.count() + 1));
  }

  const std::chrono::microseconds max_sleep_;
  std::mutex rng_mutex_;
  std::mt19937_64 rng_;
  Gate gates_[4];
  std::atomic<bool> fail_[4] = {};
  std::atomic<std::size_t> in_flight_{0}, max_in_flight_{0}, calls_{0};
  std::atomic<bool> unknown_total_{false};
};

class SlowEvents final : public StreamEvents {
 public:
  SlowEvents(StreamEvents& inner, std::chrono::microseconds sleep) : inner_(inner), sleep_(sleep) {}
  Gate& sync_gate() { return gate_; }
  std::uint64_t stream_syncs() const { return stream_syncs_.load(); }

  EventToken record(StreamId stream) override { return inner_.record(stream); }
  bool query(EventToken token) override { return inner_.query(token); }
  void synchronize(EventToken token) override {
    gate_.pass();
    std::this_thread::sleep_for(sleep_);
    inner_.synchronize(token);
  }
  void release(EventToken token) override { inner_.release(token); }
  void synchronize_stream(StreamId stream) override {
    stream_syncs_.fetch_add(1);
    gate_.pass();
    std::this_thread::sleep_for(sleep_);
    inner_.synchronize_stream(stream);
  }

 private:
  StreamEvents& inner_;
  const std::chrono::microseconds sleep_;
  Gate gate_;
  std::atomic<std::uint64_t> stream_syncs_{0};
};

}  // namespace gpumem::alloc::test
