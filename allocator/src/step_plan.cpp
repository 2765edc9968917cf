#include "gpumem/alloc/step_plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <numeric>
#include <system_error>
#include <thread>
#include <utility>

#include <unistd.h>

#include <fmt/format.h>

namespace gpumem::alloc {
namespace {

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// A planned block: live over event times [lo0, hi0) and, if it lives over the step's end, also
// [lo1, hi1) at the step's start. An event time is an event's position in the step.
struct PlanBlock {
  std::uint32_t index = 0;
  std::uint64_t size_bytes = 0;
  StreamId stream = 0;
  std::size_t lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
  std::size_t duration() const noexcept { return (hi0 - lo0) + (hi1 - lo1); }
};

bool overlaps(std::size_t a_lo, std::size_t a_hi, std::size_t b_lo, std::size_t b_hi) noexcept {
  return a_lo < b_hi && b_lo < a_hi;
}

// Whether two blocks may not share bytes: they are live at the same time, or on different streams
// (reusing bytes across streams would need an event between the two uses).
bool conflict(const PlanBlock& a, const PlanBlock& b) noexcept {
  if (a.stream != b.stream) return true;
  return overlaps(a.lo0, a.hi0, b.lo0, b.hi0) || overlaps(a.lo0, a.hi0, b.lo1, b.hi1) ||
         overlaps(a.lo1, a.hi1, b.lo0, b.hi0) || overlaps(a.lo1, a.hi1, b.lo1, b.hi1);
}

// Places the blocks in `order`, each where it shares no bytes with a block placed before it that
// it conflicts with: at the lowest such offset (first fit), or in the smallest gap between those
// blocks that holds it, else above them all (best fit). Returns the arena size; offsets by block
// position.
std::size_t place(const std::vector<PlanBlock>& blocks, const std::vector<std::size_t>& order, bool best_fit,
                  std::vector<std::uint64_t>& offsets) {
  offsets.assign(blocks.size(), 0);
  // The blocks placed so far, by offset (kept sorted as they are inserted): a block's conflicting
  // ones come out in offset order with no sort.
  std::vector<std::size_t> by_offset;
  by_offset.reserve(blocks.size());
  std::size_t arena = 0;
  for (std::size_t k : order) {
    const PlanBlock& b = blocks[k];
    std::uint64_t at = 0;         // the end of the conflicting bytes so far
    std::uint64_t chosen = ~std::uint64_t{0};
    std::uint64_t chosen_gap = ~std::uint64_t{0};
    for (std::size_t q : by_offset) {
      if (!conflict(b, blocks[q])) continue;
      const std::uint64_t lo = offsets[q], hi = offsets[q] + blocks[q].size_bytes;
      if (lo >= at + b.size_bytes) {
        const std::uint64_t gap = lo - at;
        if (!best_fit) {
          chosen = at;
          break;
        }
        if (gap < chosen_gap) {
          chosen_gap = gap;
          chosen = at;
        }
      }
      at = std::max(at, hi);
    }
    offsets[k] = chosen != ~std::uint64_t{0} ? chosen : at;
    arena = std::max<std::size_t>(arena, offsets[k] + b.size_bytes);
    const auto pos = std::upper_bound(by_offset.begin(), by_offset.end(), offsets[k],
                                      [&](std::uint64_t off, std::size_t q) { return off < offsets[q]; });
    by_offset.insert(pos, k);
  }
  return arena;
}

}  // namespace

std::optional<StepPlan> plan_step(const std::vector<StepEvent>& step, std::size_t round_bytes, std::string* why) {
  auto fail = [&](std::string reason) -> std::optional<StepPlan> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (round_bytes == 0 || (round_bytes & (round_bytes - 1)) != 0)
    return fail(fmt::format("the rounding {} is not a power of two", round_bytes));
  const std::size_t n = step.size();
  struct Alloc {
    std::size_t at = 0;
    std::uint64_t size_bytes = 0;
    StreamId stream = 0;
    std::size_t freed = kNone;       // event of its free in this step
    std::size_t freed_next = kNone;  // event of its free in the next step (from this step's frees of the step before)
  };
  std::vector<Alloc> allocs;
  for (std::size_t p = 0; p < n; ++p) {
    const StepEvent& e = step[p];
    if (!e.is_free) {
      // Every block takes at least round_bytes, a zero-byte one too: no two live blocks share an address.
      const std::uint64_t size = std::max<std::uint64_t>(e.size_bytes, 1);
      allocs.push_back(Alloc{p, (size + round_bytes - 1) & ~(round_bytes - 1), e.stream});
      continue;
    }
    if (e.steps_back > 1)
      return fail(fmt::format("event {} frees a block allocated {} steps before (plans cover blocks that live at most "
                              "into the next step)",
                              p, e.steps_back == 0xff ? std::string("an unknown number of") : std::to_string(e.steps_back)));
    if (e.steps_back == 0) {
      if (e.index >= allocs.size() || allocs[e.index].freed != kNone)
        return fail(fmt::format("event {} frees allocation {} of the step, which is not live there", p, e.index));
      allocs[e.index].freed = p;
    }
  }
  // Frees of the step before: by periodicity, where this step's allocation j will be freed in the next.
  for (std::size_t p = 0; p < n; ++p) {
    const StepEvent& e = step[p];
    if (!e.is_free || e.steps_back != 1) continue;
    if (e.index >= allocs.size() || allocs[e.index].freed != kNone || allocs[e.index].freed_next != kNone)
      return fail(fmt::format("event {} frees allocation {} of the step before, which does not repeat in this step",
                              p, e.index));
    allocs[e.index].freed_next = p;
  }
  if (allocs.empty()) return fail("the step allocates nothing");

  StepPlan plan;
  plan.offsets.assign(allocs.size(), StepPlan::kNotPlanned);
  std::vector<PlanBlock> blocks;
  for (std::uint32_t j = 0; j < allocs.size(); ++j) {
    const Alloc& a = allocs[j];
    PlanBlock b{j, a.size_bytes, a.stream};
    if (a.freed != kNone) {
      b.lo0 = a.at;
      b.hi0 = a.freed;
    } else if (a.freed_next != kNone && a.freed_next < a.at) {
      b.lo0 = a.at;
      b.hi0 = n;
      b.lo1 = 0;
      b.hi1 = a.freed_next;
    } else {
      // Never freed by the next step, or freed there after its own next instance is allocated.
      ++plan.unplanned_blocks;
      continue;
    }
    blocks.push_back(b);
  }
  if (blocks.empty()) return fail("no block of the step is freed within a step of its allocation");

  // Live planned bytes before each event (a block is live before event p if allocated before p
  // and freed at p or later).
  std::vector<std::int64_t> delta(n + 2, 0);
  for (const PlanBlock& b : blocks) {
    const auto s = static_cast<std::int64_t>(b.size_bytes);
    delta[b.lo0 + 1] += s;  // live before events lo0+1 .. hi0
    delta[b.hi0 + 1] -= s;
    if (b.hi0 == n) {       // over the step's end: also live before events 0 .. hi1
      delta[0] += s;
      delta[b.hi1 + 1] -= s;
    }
  }
  std::int64_t live = 0;
  plan.trough = 0;
  plan.trough_live_bytes = std::numeric_limits<std::size_t>::max();
  for (std::size_t p = 0; p < n; ++p) {
    live += delta[p];
    const auto l = static_cast<std::size_t>(live);
    plan.peak_live_bytes = std::max(plan.peak_live_bytes, l);
    if (l < plan.trough_live_bytes) {
      plan.trough_live_bytes = l;
      plan.trough = p;
    }
  }

  struct Order {
    const char* name;
    double (*key)(const PlanBlock&);
  };
  static constexpr Order kOrders[] = {
      {"size", [](const PlanBlock& b) { return static_cast<double>(b.size_bytes); }},
      {"area", [](const PlanBlock& b) { return static_cast<double>(b.size_bytes) * static_cast<double>(b.duration()); }},
      {"duration", [](const PlanBlock& b) { return static_cast<double>(b.duration()); }},
      {"start", [](const PlanBlock& b) { return -static_cast<double>(b.lo0); }},
  };
  std::vector<std::uint64_t> offsets, best_offsets;
  plan.arena_bytes = std::numeric_limits<std::size_t>::max();
  for (const Order& o : kOrders) {
    std::vector<std::size_t> order(blocks.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    auto key = [&](const PlanBlock& b) { return o.key(b); };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      const double kx = key(blocks[x]), ky = key(blocks[y]);
      if (kx != ky) return kx > ky;
      return blocks[x].size_bytes > blocks[y].size_bytes;
    });
    for (const bool best_fit : {false, true}) {
      const std::size_t arena = place(blocks, order, best_fit, offsets);
      if (arena < plan.arena_bytes) {
        plan.arena_bytes = arena;
        plan.order = o.name;
        plan.best_fit = best_fit;
        best_offsets = offsets;
      }
    }
  }
  for (std::size_t k = 0; k < blocks.size(); ++k) plan.offsets[blocks[k].index] = best_offsets[k];

  // Each planned allocation's neighbour: a sweep over the step with the planned blocks live, by
  // offset (blocks live at once never share an offset: they share no bytes and take at least
  // round_bytes each). Blocks live over the step's end start live (their instance of the step before).
  plan.neighbours.assign(allocs.size(), StepPlan::kNoNeighbour);
  std::map<std::uint64_t, std::uint32_t> live_by_offset;
  auto erase_live = [&](std::uint32_t j) {
    if (j >= allocs.size() || plan.offsets[j] == StepPlan::kNotPlanned) return;
    if (auto it = live_by_offset.find(plan.offsets[j]); it != live_by_offset.end() && it->second == j)
      live_by_offset.erase(it);
  };
  for (const PlanBlock& b : blocks)
    if (b.hi0 == n) live_by_offset.emplace(plan.offsets[b.index], b.index);
  std::uint32_t next_alloc = 0;
  for (std::size_t p = 0; p < n; ++p) {
    const StepEvent& e = step[p];
    if (e.is_free) {
      erase_live(e.index);  // steps_back 0 or 1 (checked above); a wrapped block's earlier instance for 1
      continue;
    }
    const std::uint32_t j = next_alloc++;
    const std::uint64_t off = plan.offsets[j];
    if (off == StepPlan::kNotPlanned) continue;
    auto above = live_by_offset.lower_bound(off);
    if (above != live_by_offset.begin()) {
      plan.neighbours[j] = std::prev(above)->second;
    } else if (above != live_by_offset.end()) {
      plan.neighbours[j] = above->second;
    }
    live_by_offset.emplace(off, j);
  }
  return plan;
}

namespace {

constexpr std::uint64_t kHashBase = 0x9e3779b97f4a7c15ULL | 1;  // odd: a unit mod 2^64
constexpr std::size_t kWindow = 16;                               // events in a detection key's window
constexpr std::uint64_t kUnknown = ~std::uint64_t{0};

std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t power(std::uint64_t b, std::uint64_t e) noexcept {
  std::uint64_t r = 1;
  for (; e; e >>= 1, b *= b)
    if (e & 1) r *= b;
  return r;
}

std::size_t pow2_at_least(std::size_t n) {
  std::size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

StepPlanner::StepPlanner(StepArenaHost& host, StepPlanOptions options) : host_(host), options_(options) {
  if (options_.round_bytes == 0 || (options_.round_bytes & (options_.round_bytes - 1)) != 0) options_.round_bytes = 512;
  if (options_.detect_steps) {
    const std::size_t ring = pow2_at_least(2 * options_.max_step_events + 2);
    ring_.resize(ring);
    prefix_.resize(ring);
    keys_.assign(std::size_t{1} << 16, {kUnknown, 0});
    window_power_ = power(kHashBase, kWindow);
  }
}

namespace {
std::uint64_t micros_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
}
}  // namespace

// A layout thread: it reads `step` and writes `plan`, `why` and `micros`, then sets `done`
// (release); the planner reads them after seeing `done` (acquire), or after joining it.
struct StepPlanner::LayoutJob {
  // The process that started the thread: a child forked meanwhile has no such thread, so it never
  // sees `done` and lets the thread object go instead of joining it.
  pid_t process = ::getpid();
  std::vector<StepEvent> step;
  std::size_t round_bytes = 0;
  std::function<void()> hook;
  std::optional<StepPlan> plan;
  std::string why;
  std::uint64_t micros = 0;
  std::atomic<bool> done{false};
  std::thread worker;
  void run() {
    if (hook) hook();
    const auto t0 = std::chrono::steady_clock::now();
    plan = plan_step(step, round_bytes, &why);
    micros = micros_since(t0);
    done.store(true, std::memory_order_release);
  }
};

StepPlanner::~StepPlanner() {
  if (!layout_ || !layout_->worker.joinable()) return;
  if (layout_->process == ::getpid()) {
    layout_->worker.join();
  } else {
    layout_->worker.detach();
  }
}

StepEvent StepPlanner::free_event(std::uint64_t ordinal) const noexcept {
  StepEvent e;
  e.is_free = true;
  if (ordinal == kUnknown) {
    e.steps_back = 0xff;
  } else if (ordinal >= step_first_) {
    e.index = static_cast<std::uint32_t>(ordinal - step_first_);
  } else if (ordinal >= previous_first_) {
    e.steps_back = 1;
    e.index = static_cast<std::uint32_t>(ordinal - previous_first_);
  } else {
    e.steps_back = 2;  // two steps back or more
  }
  return e;
}

void StepPlanner::record(const StepEvent& e, std::uint64_t ordinal) {
  if (marked_) {
    if (e.is_free && e.steps_back > 1) step_foreign_ = true;
    if (step_overflowed_) return;
    if (current_.size() >= options_.max_step_events) {
      step_overflowed_ = true;
      current_.clear();
      return;
    }
    current_.push_back(e);
    return;
  }
  if (!options_.detect_steps) return;
  // The detector's record: an allocation by its size and stream, a free by how many allocations
  // ago its block was made (the same at the same point of every repeat of a step).
  const std::uint64_t n = events_++;
  const std::size_t mask = ring_.size() - 1;
  RawEvent& r = ring_[n & mask];
  r.is_free = e.is_free;
  r.stream = e.stream;
  r.value = e.is_free ? ordinal : e.size_bytes;
  r.allocs_before = e.is_free ? next_ordinal_ : ordinal;
  const std::uint64_t sig =
      e.is_free ? mix(ordinal == kUnknown ? 3 : ((next_ordinal_ - ordinal) << 2 | 2)) : mix(e.size_bytes << 2 | 1) ^ mix(e.stream);
  prefix_[n & mask] = (n ? prefix_[(n - 1) & mask] : 0) * kHashBase + sig;
  if (e.is_free) {
    live_bytes_ -= std::min(live_bytes_, freed_bytes_);
  } else {
    live_bytes_ += e.size_bytes;
  }
  if (mode_ != Mode::recording || n + 1 < kWindow) return;
  if (options_.dormant_events != 0 && n + 1 - awake_since_ >= options_.awake_events) return rest();
  // At the same point of two repeats of a step, the last few events and the bytes live are the
  // same: the key finds the step's length without being told.
  const std::uint64_t key = mix(range_hash(n - kWindow, n, window_power_) ^ mix(live_bytes_ + 0x51));
  auto& slot = keys_[key & (keys_.size() - 1)];
  if (slot.first == key) {
    const std::uint64_t period = n - slot.second;
    // After plans that fell back before serving two steps, a step must repeat more times in a row
    // before it is planned again (a workload whose steps change often pays for fewer plans).
    const std::uint64_t repeats = required_repeats();
    // (Repeats that do not fit in the ring together are not seen: after many early fallbacks a
    // long step is no longer planned.)
    if (period >= options_.min_step_events && period <= options_.max_step_events &&
        n >= fallback_event_ + repeats * period && repeats * period < ring_.size() &&
        !(period == cooldown_period_ && n < cooldown_until_)) {
      const std::uint64_t bp = power(kHashBase, period);
      const std::uint64_t last = range_hash(n - period, n, bp);
      bool same = true;
      for (std::uint64_t k = 2; k <= repeats && same; ++k)
        same = range_hash(n - k * period, n - (k - 1) * period, bp) == last;
      if (same) plan_detected(n, period);
    }
  }
  slot = {key, n};
}

std::uint64_t StepPlanner::range_hash(std::uint64_t a, std::uint64_t b, std::uint64_t base_power) const noexcept {
  const std::size_t mask = ring_.size() - 1;
  return prefix_[b & mask] - prefix_[a & mask] * base_power;
}

void StepPlanner::plan_detected(std::uint64_t n, std::uint64_t period) {
  const std::size_t mask = ring_.size() - 1;
  auto cool = [&](std::string reason) {
    counters_.last_reason = std::move(reason);
    cooldown_period_ = period;
    cooldown_until_ = n + period;
  };
  // The hashes matched: check the two repeats event for event.
  for (std::uint64_t k = 1; k <= period; ++k) {
    const RawEvent& x = ring_[(n - period + k) & mask];
    const RawEvent& y = ring_[(n - 2 * period + k) & mask];
    const bool same = x.is_free == y.is_free &&
                      (x.is_free ? (x.value == kUnknown) == (y.value == kUnknown) &&
                                       (x.value == kUnknown || x.allocs_before - x.value == y.allocs_before - y.value)
                                 : x.value == y.value && x.stream == y.stream);
    if (!same) return cool(fmt::format("a period of {} events was found, but its two repeats differ", period));
  }
  // The step: events n-period+1 .. n, its allocations numbered from the first.
  const std::uint64_t first = ring_[(n - period + 1) & mask].allocs_before;
  const std::uint64_t previous_first = ring_[(n - 2 * period + 1) & mask].allocs_before;
  std::vector<StepEvent> step;
  step.reserve(period);
  for (std::uint64_t k = 1; k <= period; ++k) {
    const RawEvent& x = ring_[(n - period + k) & mask];
    StepEvent e;
    if (!x.is_free) {
      e.size_bytes = x.value;
      e.stream = x.stream;
    } else {
      e.is_free = true;
      if (x.value == kUnknown || x.value < previous_first) {
        e.steps_back = 2;
      } else if (x.value >= first) {
        e.index = static_cast<std::uint32_t>(x.value - first);
      } else {
        e.steps_back = 1;
        e.index = static_cast<std::uint32_t>(x.value - previous_first);
      }
    }
    step.push_back(e);
  }
  previous_first_ = first;
  step_first_ = next_ordinal_;
  lay_out(std::move(step), period);
}

void StepPlanner::lay_out(std::vector<StepEvent> step, std::uint64_t period) {
  std::string why;
  if (options_.layout_thread && plannable(step, &why)) {
    // A layout from a plan dropped before it was done is waited for (rare: a plan falls back
    // and the next is found within one layout's time).
    if (layout_) finish_layout();
    auto job = std::make_unique<LayoutJob>();
    job->step = step;
    job->round_bytes = options_.round_bytes;
    job->hook = options_.layout_hook;
    try {
      job->worker = std::thread([j = job.get()] { j->run(); });
      layout_ = std::move(job);
      layout_period_ = period;
      counters_.laying_out = true;
      arm(std::move(step));
      return;
    } catch (const std::system_error&) {
      // No thread to be had: laid out here, as without layout_thread.
    }
  }
  auto plan = this->plan(step, &why);
  if (!plan) return not_planned(why, period);
  if (period != 0) {
    ++counters_.detected_steps;
    counters_.step_events = period;
  }
  adopt(std::move(*plan), std::move(step));
}

void StepPlanner::not_planned(const std::string& why, std::uint64_t period) {
  if (period != 0) {
    // Found without marks: this period is ignored for one period's events (as when its repeats differ).
    counters_.last_reason = fmt::format("a step of {} events cannot be planned: {}", period, why);
    cooldown_period_ = period;
    cooldown_until_ = events_ + period;
  } else {
    counters_.last_reason = "the step cannot be planned: " + why;
  }
}

void StepPlanner::poll_layout_slow() {
  if (layout_->done.load(std::memory_order_acquire)) finish_layout();
}

void StepPlanner::wait_for_layout() {
  if (layout_) finish_layout();
}

void StepPlanner::finish_layout() {
  const std::unique_ptr<LayoutJob> job = std::move(layout_);
  if (job->process != ::getpid()) {
    // A forked child: the layout thread is not in this process, and its plan never comes.
    if (job->worker.joinable()) job->worker.detach();
    counters_.laying_out = false;
    if (mode_ == Mode::armed && !plan_ready_) mode_ = Mode::recording;
    return;
  }
  if (job->worker.joinable()) job->worker.join();
  counters_.laying_out = false;
  ++counters_.layouts;
  counters_.last_layout_us = job->micros;
  // The plan fell back (or the planner stopped) while it was laid out: nothing to take.
  if (mode_ != Mode::armed || plan_ready_) return;
  if (!job->plan) {
    mode_ = Mode::recording;
    if (layout_period_ == 0) equal_steps_ = 0;  // marked: the step must repeat again before the next try
    return not_planned(job->why, layout_period_);
  }
  if (layout_period_ != 0) {
    ++counters_.detected_steps;
    counters_.step_events = layout_period_;
  }
  // Serving starts at a trough: this step's if it is still ahead, else the next step's.
  wait_next_step_ = pos_ > job->plan->trough;
  take_plan(std::move(*job->plan));
}

std::optional<StepPlan> StepPlanner::plan(const std::vector<StepEvent>& step, std::string* why) {
  if (!plannable(step, why)) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = plan_step(step, options_.round_bytes, why);
  ++counters_.layouts;
  counters_.last_layout_us = micros_since(t0);
  return plan;
}

bool StepPlanner::plannable(const std::vector<StepEvent>& step, std::string* why) const {
  if (options_.one_stream) {
    const auto first = std::find_if(step.begin(), step.end(), [](const StepEvent& e) { return !e.is_free; });
    const auto other = first == step.end() ? step.end() : std::find_if(first, step.end(), [&](const StepEvent& e) {
      return !e.is_free && e.stream != first->stream;
    });
    if (other != step.end()) {
      if (why) *why = "its allocations are on more than one stream, and this owner plans one";
      return false;
    }
  }
  return true;
}

void StepPlanner::adopt(StepPlan plan, std::vector<StepEvent> events) {
  arm(std::move(events));
  take_plan(std::move(plan));
}

void StepPlanner::arm(std::vector<StepEvent> events) {
  awake_since_ = events_;
  quiet_rests_ = 0;
  plan_events_ = std::move(events);
  plan_ready_ = false;
  wait_next_step_ = false;
  mode_ = Mode::armed;
  pos_ = 0;
  plan_served_steps_ = 0;
}

void StepPlanner::take_plan(StepPlan plan) {
  plan_ = std::move(plan);
  plan_ready_ = true;
  ++counters_.plans;
  counters_.last_plan_arena_bytes = plan_.arena_bytes;
  counters_.last_plan_peak_live_bytes = plan_.peak_live_bytes;
  counters_.last_plan_trough_live_bytes = plan_.trough_live_bytes;
  counters_.last_reason.clear();
  start_serving_if_due();
}

bool StepPlanner::matches(const StepEvent& e) const {
  return pos_ < plan_events_.size() && plan_events_[pos_] == e;
}

void StepPlanner::start_serving_if_due() {
  if (mode_ == Mode::armed && plan_ready_ && !wait_next_step_ && pos_ >= plan_.trough) mode_ = Mode::serving;
}

void StepPlanner::advance() {
  ++pos_;
  // A detected step has no marks: it ends where the plan's events do.
  if (!marked_ && pos_ == plan_events_.size()) end_step();
}

void StepPlanner::end_step() {
  if (mode_ == Mode::serving) {
    ++counters_.served_steps;
    ++plan_served_steps_;
  }
  previous_first_ = step_first_;
  step_first_ = next_ordinal_;
  pos_ = 0;
  wait_next_step_ = false;
  start_serving_if_due();
}

void StepPlanner::fall_back(const std::string& reason) {
  ++counters_.fallbacks;
  counters_.last_fallback = reason;
  // A plan that served whole steps before its steps changed (an evaluation between training
  // epochs) was worth making; one that did not counts toward giving up.
  if (plan_served_steps_ >= 2) {
    unproductive_fallbacks_ = 0;
  } else {
    // An early fallback: the repeats the next plan needs are counted from here on.
    ++unproductive_fallbacks_;
    equal_steps_ = 0;
    fallback_event_ = events_;
  }
  awake_since_ = events_;
  mode_ = arena_bytes_ != 0 ? Mode::draining : Mode::recording;
  if (mode_ == Mode::recording && (unproductive_fallbacks_ >= options_.max_fallbacks || stop_requested_))
    mode_ = Mode::stopped;
  counters_.stopped = mode_ == Mode::stopped;
  maybe_unmap();
}

void StepPlanner::rest() {
  mode_ = Mode::dormant;
  dormant_left_ = options_.dormant_events << std::min(quiet_rests_, std::min(options_.dormant_doublings, 20u));
  ++quiet_rests_;
  ++counters_.dormant_periods;
  counters_.dormant = true;
}

void StepPlanner::wake() {
  if (mode_ != Mode::dormant) return;
  dormant_left_ = 1;
  tick();
}

void StepPlanner::tick() {
  if (--dormant_left_ != 0) return;
  // Afresh: what was recorded before is not contiguous with what comes now, and the blocks
  // allocated while dormant are unknown (a free of one, or of a block freed meanwhile whose address
  // came back, is a free of an unknown block).
  mode_ = Mode::recording;
  counters_.dormant = false;
  live_.clear();
  live_bytes_ = 0;
  events_ = 0;
  awake_since_ = 0;
  fallback_event_ = 0;
  cooldown_period_ = 0;
  cooldown_until_ = 0;
  std::fill(keys_.begin(), keys_.end(), std::pair<std::uint64_t, std::uint64_t>{kUnknown, 0});
}

void StepPlanner::stop(const std::string& why) {
  if (mode_ == Mode::stopped) return;
  stop_requested_ = true;
  if (mode_ == Mode::armed || mode_ == Mode::serving) fall_back("the planner was stopped: " + why);
  if (mode_ == Mode::recording || mode_ == Mode::dormant) mode_ = Mode::stopped;
  counters_.stopped = mode_ == Mode::stopped;
  counters_.dormant = false;
  counters_.last_reason = "stopped: " + why;
}

void StepPlanner::maybe_unmap() {
  if (mode_ != Mode::draining || arena_live_ != 0) return;
  host_.unmap_arena(arena_base_, arena_bytes_);
  arena_base_ = 0;
  arena_bytes_ = 0;
  counters_.arena_bytes = 0;
  mode_ = unproductive_fallbacks_ >= options_.max_fallbacks || stop_requested_ ? Mode::stopped : Mode::recording;
  counters_.stopped = mode_ == Mode::stopped;
}

void StepPlanner::mark_step() {
  poll_layout();
  ++counters_.marks;
  wake();  // marks replace detection: awake, and afresh
  if (!marked_) {
    // Marks take over from detection for good.
    marked_ = true;
    if (mode_ == Mode::armed || mode_ == Mode::serving) fall_back("the program marked a step: marks replace detection");
    current_.clear();
    previous_ok_ = false;
  }
  if (mode_ == Mode::stopped) return;
  if (mode_ == Mode::armed || mode_ == Mode::serving) {
    if (pos_ != plan_events_.size())
      fall_back(fmt::format("a step ended after {} events; the plan's has {}", pos_, plan_events_.size()));
  }
  const bool whole = !step_overflowed_ && !step_foreign_ && !current_.empty();
  if (mode_ == Mode::recording && whole) {
    equal_steps_ = previous_ok_ && current_ == previous_ ? equal_steps_ + 1 : 1;
    if (equal_steps_ >= required_repeats()) {
      previous_ = std::move(current_);
      previous_ok_ = true;
      current_.clear();
      step_overflowed_ = false;
      step_foreign_ = false;
      end_step();
      lay_out(previous_, 0);
      return;
    } else if (previous_ok_ && current_ == previous_) {
      counters_.last_reason = fmt::format("the step has repeated {} times in a row; after {} plan(s) that fell back "
                                          "early, {} are needed",
                                          equal_steps_, unproductive_fallbacks_, required_repeats());
    } else if (previous_ok_) {
      const auto [a, b] = std::mismatch(previous_.begin(), previous_.end(), current_.begin(), current_.end());
      counters_.last_reason = fmt::format("the last two steps differ from event {} on ({} and {} events)",
                                          a - previous_.begin(), previous_.size(), current_.size());
    }
  } else if (mode_ == Mode::recording) {
    equal_steps_ = 0;
  }
  if (mode_ == Mode::recording && !whole && step_foreign_) {
    counters_.last_reason = "the step frees a block from before the step before it";
  } else if (mode_ == Mode::recording && !whole && step_overflowed_) {
    counters_.last_reason = fmt::format("the step has more than {} events", options_.max_step_events);
  }
  std::swap(previous_, current_);
  previous_ok_ = whole;
  current_.clear();
  step_overflowed_ = false;
  step_foreign_ = false;
  end_step();
}

std::optional<std::uintptr_t> StepPlanner::allocate(std::size_t size_bytes, StreamId stream) {
  poll_layout();
  hint_ = {};
  const std::uint64_t rounded = (static_cast<std::uint64_t>(size_bytes) + options_.round_bytes - 1) & ~(options_.round_bytes - 1);
  pending_size_ = rounded;
  pending_stream_ = stream;
  // A zero-byte request gets no block (the engine returns null for it): it is not an event of the step.
  if (size_bytes == 0) return std::nullopt;
  if (mode_ != Mode::armed && mode_ != Mode::serving) return std::nullopt;
  StepEvent e;
  e.size_bytes = rounded;
  e.stream = stream;
  if (!matches(e)) {
    fall_back(pos_ < plan_events_.size()
                  ? fmt::format("event {} of a step: a request of {} bytes on stream {} where the plan has {}", pos_,
                                size_bytes, stream,
                                plan_events_[pos_].is_free ? std::string("a free")
                                                           : fmt::format("{} bytes on stream {}", plan_events_[pos_].size_bytes,
                                                                         plan_events_[pos_].stream))
                  : fmt::format("a step made more than the plan's {} events", plan_events_.size()));
    return std::nullopt;
  }
  start_serving_if_due();
  if (mode_ != Mode::serving) return std::nullopt;
  const std::uint64_t offset = plan_.offsets[next_ordinal_ - step_first_];
  if (offset == StepPlan::kNotPlanned) return std::nullopt;
  if (arena_bytes_ == 0) {
    const auto base = host_.map_arena(plan_.arena_bytes, stream);
    if (!base) {
      fall_back(fmt::format("the owner did not provide the arena of {} bytes", plan_.arena_bytes));
      return std::nullopt;
    }
    arena_base_ = *base;
    arena_bytes_ = plan_.arena_bytes;
    ++arena_generation_;
    counters_.arena_bytes = arena_bytes_;
    ++counters_.arenas_mapped;
  }
  planned_addr_ = arena_base_ + offset;
  const std::uint32_t nb = plan_.neighbours[next_ordinal_ - step_first_];
  hint_ = nb == StepPlan::kNoNeighbour
              ? StepPlacementHint{}
              : StepPlacementHint{arena_base_ + plan_.offsets[nb], plan_.offsets[nb] > offset};
  return planned_addr_;
}

void StepPlanner::placement_failed() {
  planned_addr_ = 0;
  if (mode_ == Mode::armed || mode_ == Mode::serving)
    fall_back(fmt::format("event {} of a step: the owner could not place the block at its planned address", pos_));
}

void StepPlanner::note(const StepEvent& e, std::uintptr_t addr, bool served) {
  const std::uint64_t ordinal = next_ordinal_++;
  if (addr != 0) live_.assign(addr, Live{ordinal, e.size_bytes, served ? arena_generation_ : 0});
  record(e, ordinal);
}

StepPlanner::Request StepPlanner::take_request() noexcept {
  planned_addr_ = 0;  // the engine serves it: not at a planned address
  return {std::exchange(pending_size_, 0), std::exchange(pending_stream_, 0)};
}

void StepPlanner::note_allocated(std::uintptr_t addr, Request request) {
  pending_size_ = request.size_bytes;
  pending_stream_ = request.stream;
  note_allocated(addr);
}

void StepPlanner::note_allocated(std::uintptr_t addr) {
  const std::uintptr_t planned = std::exchange(planned_addr_, 0);
  if (mode_ == Mode::stopped || pending_size_ == 0) return;  // a zero-byte request is no event
  if (mode_ == Mode::dormant) return tick();
  StepEvent e;
  e.size_bytes = pending_size_;
  e.stream = pending_stream_;
  // Whether this event advances the plan is decided before it is recorded: recording it may find
  // a new step (after a fallback here), whose plan starts after this event.
  bool following = mode_ == Mode::armed || mode_ == Mode::serving;
  if (following && !matches(e)) {
    fall_back(fmt::format("event {} of a step: a request the plan does not have", pos_));
    following = false;
  }
  const bool served = following && planned != 0 && addr == planned && in_arena(addr);
  if (served) {
    ++arena_live_;
    ++counters_.served_allocations;
  }
  note(e, addr, served);
  if (following) advance();
}

bool StepPlanner::free(std::uintptr_t addr) {
  poll_layout();
  if (mode_ == Mode::stopped) return false;  // stopped only once no arena is left
  if (mode_ == Mode::dormant) {              // entered from recording: no arena either
    tick();
    return false;
  }
  std::uint64_t ordinal = kUnknown;
  bool served = false;  // placed by the plan in the arena mapped now
  freed_bytes_ = 0;
  if (const std::size_t slot = live_.find(addr); slot != AddressTable<Live>::npos) {
    const Live& l = live_.at(slot);
    ordinal = l.ordinal;
    freed_bytes_ = l.size_bytes;
    served = arena_bytes_ != 0 && l.arena_generation == arena_generation_;
    live_.erase(slot);
  }
  if (served) --arena_live_;
  const StepEvent e = free_event(ordinal);
  bool following = mode_ == Mode::armed || mode_ == Mode::serving;
  if (following) {
    start_serving_if_due();
    if (!matches(e)) {
      fall_back(fmt::format("event {} of a step: a free the plan does not have there", pos_));
      following = false;
    }
  }
  record(e, ordinal);
  if (following) advance();
  maybe_unmap();
  return served;
}

}  // namespace gpumem::alloc
