// The engine's step planner (Config::step_plan): a StepPlanner (gpumem/alloc/step_plan.h) whose
// owner is the CachingAllocator. The arena is a range of the engine's own memory: the engine finds
// or grows a free range of the arena's size on the step's stream as it would for an allocation,
// and leaves it free (take_arena_range: no alloc event, no counter, no OOM event; the program made
// no such request). Each planned request is then placed at its address with allocate_at, an
// ordinary block of the engine (alloc event, stats, live table), its search for the free block
// starting at the plan's neighbour (StepPlacementHint). When a plan falls back the range is
// simply free memory.
//
// Locking: the planner's mutex is taken before the engine's (allocate_planned holds it across
// allocate_at and the arena's allocation). A request the plan does not place goes to the engine
// without it, whose growth may call the driver: its event is taken from the planner before and
// handed back with the block's address after (take_request, note_allocated(addr, request)), other
// threads' calls perhaps in between. free() shows the free to the planner under it, then
// frees in the engine without it. Another thread may then be given the planned address of a block
// whose engine free has not happened yet: allocate_at refuses it and the plan falls back (a missed
// plan, never a shared block). Planning is bypassed while a CUDA graph is captured.
//
// The layout runs on a thread of the planner's (StepPlanOptions::layout_thread, unless
// Config::step_plan_layout_thread is false): the lock is not held across it, only across the wait
// for a layout whose plan fell back before it was done, when the next step is found. While the
// planner rests or after it stopped, calls go by it without the lock (bypass(): each thread claims
// the calls of a rest in chunks, BypassCredit).
#pragma once

#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/step_plan.h"

namespace gpumem::alloc::detail {

// Calls a thread may send straight to the engine while the planner rests (StepPlanning::bypass):
// claimed from the planning's shared count in chunks, so that threads do not all write one word on
// every call. Valid for the planning `planning` (a number no other planning gets) while its wake
// count is `epoch`.
struct BypassCredit {
  std::uint64_t planning = 0;
  std::uint64_t epoch = 0;
  std::int64_t left = 0;
};
extern constinit thread_local BypassCredit t_bypass_credit;  // constinit: no guard on access

struct StepPlanning final : StepArenaHost {
  StepPlanning(CachingAllocator& owner, bool layout_thread);
  std::optional<std::uintptr_t> map_arena(std::size_t size_bytes, StreamId stream) override;
  void unmap_arena(std::uintptr_t, std::size_t) override {}  // the engine's memory: it keeps it

  // The planner's lock, taken by allocate_planned and free_planned. Threads that allocate at the
  // same time make the order of the events a matter of timing: no step repeats. So within each
  // window of kContentionWindow calls, when kContendedStop acquisitions find the lock held or
  // kSwitchStop calls come from another thread than the call before, the planner is stopped; once
  // it is, `off` is set and every call goes straight to the engine (frees too: a stopped planner
  // has no arena). The switches are what tells threads that take turns: the lock is not held
  // across the engine's call (allocate_through_planner), so they seldom find it held. A training
  // loop whose backward pass runs on autograd's thread switches a few times a step.
  void lock() {
    lock_only();
    // Dormant, and the calls it sleeps for have gone by without the lock (bypass_left): awake.
    if (planner.dormant() && bypass_left.load(std::memory_order_relaxed) <= 0) {
      planner.wake();
      end_bypass();
    }
  }
  // Under the lock: no call may go straight to the engine any more, nor one that a thread claimed
  // before (its credit's epoch is now old). Release: a thread that sees a block allocated after
  // this (a planned one) sees the new epoch too.
  void end_bypass() {
    bypass_left.store(0, std::memory_order_relaxed);
    epoch.fetch_add(1, std::memory_order_release);
  }
  void lock_only() {
    if (!mutex.try_lock()) {
      mutex.lock();
      if (++contended == kContendedStop)
        planner.stop(fmt::format("{} calls in {} found another thread in the planner: threads that allocate at "
                                 "the same time give the steps no order to repeat",
                                 kContendedStop, kContentionWindow));
    }
    // A thread's own address among thread-locals names it while it lives.
    const void* const thread = &t_bypass_credit;
    if (thread != last_thread) [[unlikely]] {
      last_thread = thread;
      if (++switches == kSwitchStop)
        planner.stop(fmt::format("{} calls in {} came from another thread than the call before: threads that "
                                 "allocate at the same time give the steps no order to repeat",
                                 kSwitchStop, kContentionWindow));
    }
    if (++calls % kContentionWindow == 0) {
      contended = 0;
      switches = 0;
    }
  }
  // Under the lock, after the planner may have changed mode: what calls read without the lock.
  void publish_mode() { recording.store(planner.only_records(), std::memory_order_relaxed); }
  void unlock() {
    publish_mode();
    if (planner.stopped()) off.store(true, std::memory_order_relaxed);
    // Detection rests (StepPlanOptions::dormant_events): the calls it rests for go straight to the
    // engine, counted here without the lock, and the call after them wakes it (lock()).
    if (planner.dormant() && bypass_left.load(std::memory_order_relaxed) <= 0)
      bypass_left.store(static_cast<std::int64_t>(planner.dormant_left()), std::memory_order_relaxed);
    mutex.unlock();
  }
  // One call that may go straight to the engine: the planner is stopped, or rests. A thread takes
  // kBypassChunk of the calls it rests for at once (BypassCredit) and spends them without touching
  // shared memory it writes; the planner's count of its rest is then off by at most a chunk a
  // thread, which only moves when it wakes.
  bool bypass() {
    BypassCredit& c = t_bypass_credit;
    if (c.left > 0 && c.planning == id && c.epoch == epoch.load(std::memory_order_acquire)) [[likely]] {
      --c.left;
      return true;
    }
    return bypass_claim();
  }
  // The rest of bypass(): the planner stopped, or a new chunk of calls to claim.
  [[gnu::noinline]] bool bypass_claim() {
    // The epoch is read before the claim: a wake between the two voids the chunk claimed.
    const std::uint64_t now = epoch.load(std::memory_order_acquire);
    if (off.load(std::memory_order_relaxed)) {
      // Stopped for good: this thread goes by it from now on without coming here again.
      t_bypass_credit = BypassCredit{id, now, std::numeric_limits<std::int64_t>::max()};
      return true;
    }
    if (bypass_left.load(std::memory_order_relaxed) <= 0) return false;
    const std::int64_t before = bypass_left.fetch_sub(kBypassChunk, std::memory_order_relaxed);
    if (before <= 0) return false;
    t_bypass_credit = BypassCredit{id, now, std::min(before, kBypassChunk) - 1};
    return true;
  }
  // The lock again after the engine's call (allocate_through_planner): no wake, not a call of the
  // contention count; released as any acquisition is (unlock()).
  struct Again {
    StepPlanning& p;
    void lock() { p.mutex.lock(); }
    void unlock() { p.unlock(); }
  };

  static constexpr std::uint32_t kContendedStop = 16;
  static constexpr std::uint32_t kSwitchStop = 2048;
  static constexpr std::uint64_t kContentionWindow = 4096;
  static constexpr std::int64_t kBypassChunk = 256;

  CachingAllocator& engine;
  mutable std::mutex mutex;
  StepPlanner planner;
  std::atomic<bool> off{false};
  // The planner only records (StepPlanner::only_records), as of the last release of the lock: an
  // allocation then goes to the engine first and takes the lock once, after (allocate_through_planner).
  std::atomic<bool> recording{false};
  std::atomic<std::int64_t> bypass_left{0};
  std::atomic<std::uint64_t> epoch{0};  // times bypassing ended (end_bypass): older credits are void
  const std::uint64_t id;               // this planning's number for BypassCredit
  Again again{*this};
  std::uint32_t contended = 0;  // under mutex
  std::uint32_t switches = 0;   // under mutex
  const void* last_thread = nullptr;  // under mutex: the thread of the last counted call
  std::uint64_t calls = 0;      // under mutex
};

std::unique_ptr<StepPlanning> make_step_planning(CachingAllocator& engine, bool layout_thread);

}  // namespace gpumem::alloc::detail
