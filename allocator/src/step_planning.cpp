#include "step_planning.h"

#include "arenas.h"
#include "engine.h"
#include "size_policy.h"

namespace gpumem::alloc {

using detail::Block;
using detail::EventBatch;

namespace detail {
namespace {

StepPlanOptions engine_plan_options(bool layout_thread) {
  StepPlanOptions o;
  o.layout_thread = layout_thread;
  o.round_bytes = policy::kMinBlockBytes;
  // A planned block takes the stream of the arena's memory (allocate_at): one stream per plan.
  o.one_stream = true;
  return o;
}

}  // namespace

constinit thread_local BypassCredit t_bypass_credit;

namespace {
std::atomic<std::uint64_t> g_next_planning_id{1};
}  // namespace

StepPlanning::StepPlanning(CachingAllocator& owner, bool layout_thread)
    : engine(owner), planner(*this, engine_plan_options(layout_thread)),
      id(g_next_planning_id.fetch_add(1, std::memory_order_relaxed)) {}

std::optional<std::uintptr_t> StepPlanning::map_arena(std::size_t size_bytes, StreamId stream) {
  // A plan may not raise the footprint: the arena must fit in the memory the engine holds and does
  // not use (its free blocks and cached pieces, which it can move into one range).
  const EngineTotals t = engine.totals();
  if (size_bytes > t.reserved_bytes - std::min(t.reserved_bytes, t.allocated_bytes)) return std::nullopt;
  // Nor may it fail. The engine serves the arena by moving its cached pieces where it can, and
  // creates memory where it cannot; a growth that fails ends in an OOM (an OOM event, a report)
  // for a request the program never made. So unless one free extent already holds the arena, the
  // cap and the device must have room for all of it new.
  if (t.largest_free_extent_bytes < size_bytes) {
    if (t.cap_bytes < t.reserved_bytes || size_bytes > t.cap_bytes - t.reserved_bytes) return std::nullopt;
    if (size_bytes > engine.source().mem_info().free_bytes) return std::nullopt;
  }
  void* at = engine.take_arena_range(size_bytes, stream);
  if (at == nullptr) return std::nullopt;
  return reinterpret_cast<std::uintptr_t>(at);
}

std::unique_ptr<StepPlanning> make_step_planning(CachingAllocator& engine, bool layout_thread) {
  return std::make_unique<StepPlanning>(engine, layout_thread);
}

}  // namespace detail

void* CachingAllocator::take_arena_range(std::size_t size_bytes, StreamId stream) {
  if (arenas_) {
    // The plan is laid out in the first arena while every thread allocates there (no thread has
    // moved): its steps are that engine's.
    if (arenas_->routing()) return nullptr;
    return arenas_->first_arena().take_arena_range(size_bytes, stream);
  }
  if (size_bytes == 0 || size_bytes >= policy::kMaxRequestBytes) return nullptr;
  Impl& m = *impl_;
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  void* at = nullptr;
  {
    // As an allocation (allocate_in, caching_allocator.cpp) past the thread caches: best fit in the
    // free index, else growth; the growth's own events (mappings) are real and are published. The
    // block found is free and in no container: it goes back to the free index at once, where the
    // planned placements then find it.
    const std::size_t rounded = policy::round_size(size_bytes, m.rules.roundup_power2_divisions, m.rules.any_divisions);
    const PoolKind pool = policy::pool_for(rounded);
    auto lock = m.lock_noting_contention(true);
    if (!m.pending.empty() && m.may_wait()) m.process_pending_locked(batch);
    Block* b = m.map.take_cached(pool, stream, rounded, m.rules.split);
    if (b == nullptr) {
      detail::GrowFailure fail;
      b = m.allocate_slow_dropping_lock(lock, pool, stream, rounded, batch, fail);
    }
    if (b != nullptr) {
      at = reinterpret_cast<void*>(b->addr);
      b->state = BlockState::free;
      m.map.insert_free_merged(b);
    }
    m.maybe_check_locked();
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
  return at;
}

namespace {

// With arenas, once a thread has moved to an arena of its own the threads allocate at the same time
// in engines of their own: no step of one engine repeats, and the plan's engine (the first arena) no
// longer sees every call. The planner stops for good (routing is never cleared). Under its lock.
void stop_planner_if_threads_moved(const detail::Arenas* arenas, StepPlanner& planner) {
  if (arenas != nullptr && arenas->routing() && !planner.stopped()) [[unlikely]]
    planner.stop("a thread moved to an arena of its own: threads that allocate at the same time give the steps no "
                 "order to repeat");
}

}  // namespace

// A call that bypasses the planner (it rests or stopped) pays for this test and a jump: the
// planner's own path, with its lock and its stack, is a function of its own.
AllocResult CachingAllocator::allocate_planned(std::size_t size_bytes, StreamId stream) {
  // The first engine's capture flag (set on every arena alike): a load, where capturing() would
  // take the arenas' mutex.
  if (planning_->bypass() || first_->capturing.load(std::memory_order_relaxed))
    return allocate_engine(size_bytes, stream);
  return allocate_through_planner(size_bytes, stream);
}

AllocResult CachingAllocator::allocate_through_planner(std::size_t size_bytes, StreamId stream) {
  detail::StepPlanning& p = *planning_;
  if (p.recording.load(std::memory_order_relaxed)) return allocate_while_recording(size_bytes, stream);
  StepPlanner::Request request;
  {
    std::lock_guard lock(p);
    stop_planner_if_threads_moved(arenas_.get(), p.planner);
    if (const auto at = p.planner.allocate(size_bytes, stream)) {
      const std::size_t block = policy::round_up(size_bytes, policy::kMinBlockBytes);
      void* ptr = reinterpret_cast<void*>(*at);
      if (allocate_at_impl(ptr, block, size_bytes, stream, p.planner.placement_hint()) == FreeStatus::ok) {
        p.planner.note_allocated(*at);
        AllocResult r;
        r.ptr = ptr;
        r.size_bytes = block;
        return r;
      }
      p.planner.placement_failed();
    }
    // The engine serves it, without the planner's lock: its growth calls the driver, and another
    // thread's call must not wait for that (Note [Engine locking]). The request's event is handed
    // back with its address: another thread's request may be asked about in between.
    request = p.planner.take_request();
  }
  AllocResult r = allocate_engine(size_bytes, stream);
  if (r.ptr == nullptr || request.size_bytes == 0) return r;  // a zero-byte request is no event
  std::lock_guard again(p.again);
  p.planner.note_allocated(reinterpret_cast<std::uintptr_t>(r.ptr), request);
  return r;
}

// While the planner only records, it places nothing: the engine serves the request first and the
// planner's lock is taken once, after, to show it the request and its block (one acquisition where
// the general path takes two). Only this thread's calls change a planner that records, so one
// thread's events are recorded as on the general path. Another thread may have moved it on
// meanwhile (a step found, a plan armed): an address it gives now is a missed plan.
AllocResult CachingAllocator::allocate_while_recording(std::size_t size_bytes, StreamId stream) {
  detail::StepPlanning& p = *planning_;
  AllocResult r = allocate_engine(size_bytes, stream);
  if (r.ptr == nullptr) return r;
  std::lock_guard lock(p);
  stop_planner_if_threads_moved(arenas_.get(), p.planner);
  if (p.planner.allocate(size_bytes, stream)) [[unlikely]]
    p.planner.placement_failed();
  p.planner.note_allocated(reinterpret_cast<std::uintptr_t>(r.ptr));
  return r;
}

void CachingAllocator::free_planned(void* ptr) {
  // Frees are shown even while a graph is captured (allocations then bypass the planner): a planned
  // block freed during a capture must still leave the arena's count.
  if (ptr == nullptr || planning_->bypass()) return;
  free_through_planner(ptr);
}

void CachingAllocator::free_through_planner(void* ptr) {
  std::lock_guard lock(*planning_);
  planning_->planner.free(reinterpret_cast<std::uintptr_t>(ptr));
}

void CachingAllocator::mark_step() {
  if (!planning_) return;
  std::lock_guard lock(planning_->mutex);
  planning_->planner.mark_step();  // wakes a dormant planner: marks replace detection
  planning_->end_bypass();
  planning_->publish_mode();  // a mark may arm a plan
}

std::optional<StepPlanCounters> CachingAllocator::step_plan_counters() const {
  if (!planning_) return std::nullopt;
  std::lock_guard lock(planning_->mutex);
  return planning_->planner.counters();
}

std::uint64_t CachingAllocator::step_plan_arenas() const {
  if (!planning_) return 0;
  std::lock_guard lock(planning_->mutex);
  return planning_->planner.counters().arenas_mapped;
}

}  // namespace gpumem::alloc
