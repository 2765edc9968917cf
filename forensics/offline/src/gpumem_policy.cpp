#include "gpumem/forensics/gpumem_policy.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/forwarding_source.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/alloc/stream_events.h"
#include "gpumem/forensics/call_costs.h"

namespace gpumem::forensics {
namespace {

// Forwards to a SimSource and counts what the replay reports: calls that succeeded and the
// physical bytes held. Only the replay's thread calls it (the engine serializes source calls).
class CountingSource final : public alloc::ForwardingSource {
 public:
  // The base only binds inner_, built after it.
  explicit CountingSource(alloc::SimSourceOptions options) : ForwardingSource(inner_), inner_(options) {}

  alloc::SourceResult<alloc::VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override {
    dirty_ = true;
    return inner_.reserve(size_bytes, alignment_bytes);
  }
  alloc::SourceStatus release(alloc::VaRange range) override {
    dirty_ = true;
    return inner_.release(range);
  }
  alloc::SourceResult<alloc::PhysHandle> create(std::size_t size_bytes) override {
    dirty_ = true;
    auto r = inner_.create(size_bytes);
    if (r.ok()) ++counters_.creates;
    return r;
  }
  alloc::SourceStatus destroy(alloc::PhysHandle handle) override {
    dirty_ = true;
    auto s = inner_.destroy(handle);
    if (s == alloc::SourceStatus::ok) ++counters_.releases;
    return s;
  }
  alloc::SourceStatus map(std::uintptr_t va, std::size_t size_bytes, alloc::PhysHandle handle) override {
    auto s = inner_.map(va, size_bytes, handle);
    if (s == alloc::SourceStatus::ok) ++counters_.maps;
    return s;
  }
  alloc::SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override {
    auto s = inner_.unmap(va, size_bytes);
    if (s == alloc::SourceStatus::ok) ++counters_.unmaps;
    return s;
  }
  // Simulated time: the traced time of the entry being replayed plus what the calls made so far
  // cost on an H200 (call_costs.h). Deterministic, so the engine's time-based decisions (the
  // recycle budget) replay the same everywhere.
  std::int64_t now_ns() const override {
    return trace_ns_ + static_cast<std::int64_t>(call_seconds(counters_, kH200VmmCosts) * 1e9);
  }
  // Never decreasing; saturates instead of overflowing.
  void set_trace_time_us(std::int64_t t_us) {
    constexpr std::int64_t kMaxUs = std::numeric_limits<std::int64_t>::max() / 2000;
    trace_ns_ = std::max(trace_ns_, std::clamp<std::int64_t>(t_us, 0, kMaxUs) * 1000);
  }

  // Physical bytes held (pieces alive, or backed ranges of a non-virtual source).
  std::size_t physical_bytes() const {
    if (dirty_) {
      physical_ = inner_.physical_bytes();
      dirty_ = false;
    }
    return physical_;
  }
  const PolicyCounters& counters() const { return counters_; }
  // A stream synchronization the engine made (CountingEvents): counted, and so charged to the clock.
  void count_sync() { ++counters_.syncs; }
  // A wait for one marker that had left_ns of lag to go (CountingEvents::synchronize).
  void count_marker_wait(std::int64_t left_ns) {
    ++counters_.marker_waits;
    counters_.marker_wait_ns += static_cast<std::uint64_t>(std::max<std::int64_t>(left_ns, 0));
  }

 private:
  alloc::SimSource inner_;
  PolicyCounters counters_;
  mutable bool dirty_ = true;
  mutable std::size_t physical_ = 0;
  std::int64_t trace_ns_ = 0;
};

// The replay's stream events. An event completes a fixed lag of (simulated) time after it was
// recorded, the time the GPU runs behind the CPU: so the engine sees kept mappings and pending frees
// of recent work as not yet complete, as it would live, and a growth that must unmap such a mapping
// synchronizes the stream. Every synchronization is counted on the source (its clock then includes
// its cost, call_costs.h) and completes the stream's events.
class CountingEvents final : public alloc::StreamEvents {
 public:
  CountingEvents(CountingSource& source, std::int64_t lag_ns) : source_(source), lag_ns_(lag_ns) {}
  alloc::EventToken record(alloc::StreamId stream) override {
    const alloc::EventToken t = next_++;
    pending_[t] = Pending{stream, source_.now_ns() + lag_ns_};
    return t;
  }
  bool query(alloc::EventToken token) override {
    auto it = pending_.find(token);
    return it == pending_.end() || source_.now_ns() >= it->second.ready_ns;
  }
  // Waits for one marker: charged the lag it had left (the clock then includes it), at most a
  // stream synchronization's charge (call_costs.h), since the work queued after the marker is not
  // waited for. A stream's markers complete in order: those recorded before it complete with it; a
  // wait as long as a synchronization's charge counts as one and completes the stream's markers,
  // as synchronize_stream does.
  void synchronize(alloc::EventToken token) override {
    if (query(token)) return;
    const Pending p = pending_[token];
    const std::int64_t left_ns = p.ready_ns - source_.now_ns();
    const bool drained = left_ns >= kSyncChargeNs;
    source_.count_marker_wait(drained ? kSyncChargeNs : left_ns);
    for (auto& [t, q] : pending_)
      if (q.stream == p.stream && (drained || q.ready_ns <= p.ready_ns)) q.ready_ns = 0;
  }
  void release(alloc::EventToken token) override { pending_.erase(token); }
  void synchronize_stream(alloc::StreamId stream) override {
    source_.count_sync();
    for (auto& [t, p] : pending_)
      if (p.stream == stream) p.ready_ns = 0;
  }

 private:
  static constexpr std::int64_t kSyncChargeNs = static_cast<std::int64_t>(kH200VmmCosts.sync_us * 1000.0);
  struct Pending {
    alloc::StreamId stream = 0;
    std::int64_t ready_ns = 0;
  };
  CountingSource& source_;
  std::int64_t lag_ns_;
  alloc::EventToken next_ = 1;
  std::unordered_map<alloc::EventToken, Pending> pending_;
};

// The engine's configuration for a replay: the step planner lays each plan out in the call that
// finds its step (not on a thread of its own), so that a replay is the same every time.
alloc::Config replay_config(alloc::Config config) {
  config.step_plan_layout_thread = false;
  return config;
}

class GpumemPolicy final : public ReplayPolicy {
 public:
  GpumemPolicy(std::string name, const alloc::Config& config, std::size_t device_total_bytes)
      : name_(std::move(name)),
        source_(make_options(device_total_bytes)),
        events_(std::make_unique<CountingEvents>(source_, lag_ns())),
        engine_(source_, *events_, replay_config(config)),
        planning_(config.step_plan) {
    live_.reserve(4096);
  }

  const std::string& name() const noexcept override { return name_; }
  void set_time_us(std::int64_t t_us) override { source_.set_trace_time_us(t_us); }

  void mark_step() override {
    engine_.mark_step();
  }

  std::string notes() const override {
    // recycle_churn: how often the allowance opened, when it did (the calls it saved show in the
    // VMM columns). Most replays never open it, and say nothing.
    std::string churn;
    if (const std::uint64_t openings = engine_.churn_openings(); openings > 0)
      churn = fmt::format("churn allowance: opened {} time(s)", openings);
    const std::optional<alloc::StepPlanCounters> counters = engine_.step_plan_counters();
    if (!counters) return churn;
    const alloc::StepPlanCounters& c = *counters;
    std::string s = churn.empty() ? std::string{} : churn + "; ";
    s += c.marks > 0 ? fmt::format("step plan: {} step mark(s)", c.marks)
                     : fmt::format("step plan: {} step(s) found", c.detected_steps);
    if (c.marks == 0 && c.detected_steps > 0) s += fmt::format(" (the last of {} events)", c.step_events);
    s += fmt::format(", {} plan(s), {} arena(s) mapped, {} fallback(s); {} allocations and {} whole steps served "
                     "from the arena",
                     c.plans, c.arenas_mapped, c.fallbacks, c.served_allocations, c.served_steps);
    if (c.plans > 0)
      s += fmt::format("; last plan: arena {:.3f} GiB for {:.3f} GiB live at most, {:.3f} GiB live where serving "
                       "starts",
                       static_cast<double>(c.last_plan_arena_bytes) / 1073741824.0,
                       static_cast<double>(c.last_plan_peak_live_bytes) / 1073741824.0,
                       static_cast<double>(c.last_plan_trough_live_bytes) / 1073741824.0);
    if (first_arena_calls_) {
      // The switch (the engine's cache given back, the arena mapped) happens once; what follows
      // is what every later step pays.
      const PolicyCounters after = source_.counters() - *first_arena_calls_;
      s += fmt::format("; the first arena took {:.1f} ms of calls to lay out, and the calls after it took {:.1f} ms",
                       switch_seconds_ * 1e3, call_seconds(after, kH200VmmCosts) * 1e3);
    }
    if (c.dormant_periods > 0)
      s += fmt::format("; detection rested {} time(s) where nothing repeated{}", c.dormant_periods,
                       c.dormant ? " (and rests at the end)" : "");
    if (c.stopped) s += "; stopped";
    if (!c.last_fallback.empty()) s += "; last fallback: " + c.last_fallback;
    if (!c.last_reason.empty()) s += "; last step not planned: " + c.last_reason;
    return s;
  }

  std::optional<std::uint64_t> allocate(std::size_t requested_bytes, std::uint64_t stream) override {
    const PolicyCounters before = planning_ && !first_arena_calls_ ? source_.counters() : PolicyCounters{};
    const alloc::AllocResult r = engine_.allocate(requested_bytes, stream);
    if (!r.ok() || !r.ptr) return std::nullopt;
    const auto addr = reinterpret_cast<std::uint64_t>(r.ptr);
    if (planning_ && !first_arena_calls_) note_first_arena(before);
    live_[addr] = Live{r.size_bytes, requested_bytes};
    allocated_ += r.size_bytes;
    requested_ += requested_bytes;
    return addr;
  }

  void free(std::uint64_t addr) override {
    auto it = live_.find(addr);
    if (it == live_.end()) return;
    allocated_ -= it->second.block_bytes;
    requested_ -= it->second.requested_bytes;
    live_.erase(it);
    engine_.free(reinterpret_cast<void*>(addr));
  }

  std::size_t allocated_bytes() const noexcept override { return allocated_; }
  std::size_t reserved_bytes() const noexcept override { return source_.physical_bytes(); }

  PolicyCounters counters() const override {
    PolicyCounters c = source_.counters();
    c.segments = engine_.totals().segments;
    return c;
  }
  PolicyCounters calls() const override { return source_.counters(); }

  WasteBreakdown breakdown() const override {
    WasteBreakdown w;
    w.requested_bytes = requested_;
    w.allocated_bytes = allocated_;
    w.reserved_bytes = reserved_bytes();
    w.rounding_bytes = allocated_ - requested_;
    const alloc::EngineSnapshot snap = engine_.snapshot();
    std::size_t accounted = 0;  // bytes of memory the segments hold mapped
    for (const alloc::SegmentView& seg : snap.segments) {
      if (!seg.expandable) {
        bool any_used = false;
        std::size_t free_bytes = 0;
        for (const auto& b : seg.blocks) {
          if (b.state == alloc::BlockState::free) {
            free_bytes += b.size_bytes;
          } else if (b.state != alloc::BlockState::unmapped) {
            any_used = true;
          }
        }
        (any_used ? w.inactive_split_bytes : w.cached_free_bytes) += free_bytes;
        accounted += seg.mapped_bytes;
        continue;
      }
      // Expandable region: per mapped piece, is any byte of it used?
      std::vector<const alloc::BlockView*> used;
      for (const auto& b : seg.blocks) {
        if (b.state == alloc::BlockState::allocated || b.state == alloc::BlockState::pending_free) used.push_back(&b);
      }
      std::size_t u = 0;
      for (const alloc::PieceView& piece : seg.pieces) {
        if (!piece.mapped) continue;
        accounted += piece.size_bytes;
        const std::uintptr_t lo = piece.addr, hi = piece.addr + piece.size_bytes;
        while (u < used.size() && used[u]->addr + used[u]->size_bytes <= lo) ++u;
        std::size_t used_bytes = 0;
        for (std::size_t k = u; k < used.size() && used[k]->addr < hi; ++k) {
          const std::uintptr_t a = std::max<std::uintptr_t>(lo, used[k]->addr);
          const std::uintptr_t z = std::min<std::uintptr_t>(hi, used[k]->addr + used[k]->size_bytes);
          used_bytes += z - a;
        }
        if (used_bytes == 0) {
          w.cached_free_bytes += piece.size_bytes;
        } else {
          w.partly_used_granule_bytes += piece.size_bytes - used_bytes;
        }
      }
    }
    // Physical pieces held but not mapped anywhere (kept for recycling) are cached too.
    if (w.reserved_bytes > accounted) w.cached_free_bytes += w.reserved_bytes - accounted;
    return w;
  }

  CallCosts call_costs() const noexcept override { return kH200VmmCosts; }

 private:
  // How far the replay's GPU runs behind its CPU (CountingEvents): 10 ms. The sync counts are the
  // same for any lag from 2 to 500 ms on gpt2_varlen_train (14) and within 129-163 on
  // zero3_prefetch; no peak changes with it (docs/notes/allocation-policy.md, "The cost of a stream
  // synchronization").
  static constexpr std::int64_t lag_ns() { return 10'000'000; }
  static alloc::SimSourceOptions make_options(std::size_t device_total_bytes) {
    alloc::SimSourceOptions o;
    o.capacity_bytes = device_total_bytes;
    return o;
  }
  struct Live {
    std::size_t block_bytes;
    std::size_t requested_bytes;
  };

  // The calls the engine's step planner (Config::step_plan) made to lay out its first arena: those of
  // the allocation during which it was mapped (read at every allocation until it is).
  void note_first_arena(const PolicyCounters& before) {
    if (engine_.step_plan_arenas() == 0) return;
    first_arena_calls_ = source_.counters();
    switch_seconds_ = call_seconds(*first_arena_calls_ - before, kH200VmmCosts);
  }

  std::string name_;
  CountingSource source_;
  std::unique_ptr<alloc::StreamEvents> events_;
  mutable alloc::CachingAllocator engine_;  // snapshot() is not const (it emits an event)
  std::unordered_map<std::uint64_t, Live> live_;
  std::size_t allocated_ = 0;
  std::size_t requested_ = 0;
  std::optional<PolicyCounters> first_arena_calls_;  // the calls made up to the first arena's mapping
  double switch_seconds_ = 0.0;                      // the calls of that switch
  bool planning_ = false;                            // Config::step_plan
};

}  // namespace

std::unique_ptr<ReplayPolicy> make_gpumem_policy(std::string name, const alloc::Config& config,
                                                 std::size_t device_total_bytes) {
  return std::make_unique<GpumemPolicy>(std::move(name), config, device_total_bytes);
}

}  // namespace gpumem::forensics
