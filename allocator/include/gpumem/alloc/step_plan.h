// StepPlanner: learns a training step that repeats and serves it from one arena laid out once.
//
// An online allocator places each request when it comes. On a loop whose steps make the same
// requests in the same order, the place it picks for a step's largest tensors moves from step to
// step, and a recycling allocator moves physical pages after it at every step
// (docs/notes/allocation-policy.md, "Why the logits find no place of their own"). A layout that
// gives every request of the step the same offset at every step needs about the same memory and
// makes no driver call once mapped ("A step plan").
//
// The owner (the replay's gpumem+plan policy; the engine later) shows the planner every request
// and free, and may tell it where steps start (mark_step):
//
//   * Finding the step. Without marks, the planner keeps the last events in a ring (an allocation
//     by its rounded size and stream, a free by how many allocations ago its block was made) with
//     prefix hashes, and at every event looks up a key (the hash of the last 16 events and the
//     bytes live) in a table of where each key was last seen. At the same point of two repeats of
//     a step both agree, so the distance is the step's length; equal hashes over the last repeats
//     are then checked event by event. Repeats shorter than min_step_events are loops inside a
//     step. With marks (the first mark_step() turns detection off for good), the events between
//     two marks are a step.
//   * Planning. When the last two steps (more after early fallbacks, below) are the same event for
//     event, the step is laid out: each block gets an offset in an arena so that blocks live at
//     the same time never share bytes. Blocks live over the step's end wrap around to its start.
//     The layout is greedy (blocks placed largest first, or by size x lifetime, lifetime or start,
//     each at the lowest offset or in the smallest gap that holds it; the smallest arena of the
//     eight is kept); blocks of different streams never share bytes (no events are needed). With
//     StepPlanOptions::layout_thread the layout runs on a thread of its own while the planner goes
//     on checking the program's events against the step; serving then starts at the first trough
//     after the layout is done.
//   * Serving. In the next step, the planner checks each event against the plan. At the plan's
//     trough (the point of the step with the fewest planned bytes live, so that the least is held
//     twice) it asks the owner for the arena, and from then on gives every planned allocation
//     arena base + its offset while events match. Blocks live at the trough, allocated before the
//     arena, stay where the owner put them.
//   * Falling back. At the first event that differs (a size, a stream, a free of another block, a
//     step longer or shorter than the plan), or when the owner cannot place a block at its planned
//     address, the planner stops serving: every request goes to the owner again. Once no block it
//     placed in the arena is live, the arena is given back and recording goes on. A plan that fell
//     back before serving two whole steps makes the next plan wait for one more repeat; after
//     `max_fallbacks` such plans in a row the planner stops.
//
// Safety: a block is given its planned address only while the events so far match the plan
// exactly, so the blocks live together are the plan's, which share no bytes. A block that lives
// longer than a step (it would overlap its own next instance), or that the step never frees, is
// left to the owner; so is every block of a step that frees a block from before the step before
// it (such a step is not planned). The owner must still check that a planned address is free in
// its own memory (the replay's owner does: allocate_at refuses anything else), because blocks it
// places itself may lie in the arena's range.
//
// Thread-safety: none; the owner serializes calls (the engine calls it under its lock). A layout
// thread (layout_thread) reads only its own copy of the step and hands its plan over through an
// atomic flag that the planner's calls check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/alloc/address_table.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc {

// What the planner asks of its owner: the arena's memory.
class StepArenaHost {
 public:
  virtual ~StepArenaHost() = default;
  // Provides `size_bytes` of contiguous memory for the arena, free now, and returns its base, or
  // nullopt if it cannot (the planner then does not serve this plan). `stream` is the stream of the
  // request that needs it. The owner may give back cached memory first, or take a free range of
  // its own memory (the replay's owner does: planned blocks are then its blocks, placed at the
  // planned addresses).
  virtual std::optional<std::uintptr_t> map_arena(std::size_t size_bytes, StreamId stream) = 0;
  // The plan is dropped and no block of the arena is live: the owner may give the range back.
  virtual void unmap_arena(std::uintptr_t base, std::size_t size_bytes) = 0;
};

struct StepPlanOptions {
  std::size_t round_bytes = 512;          // blocks are sized and aligned to this (a power of two)
  // A longer step is not planned (nor recorded further). Laying a step out costs time quadratic
  // in its blocks (about 0.8 s for the 4,227 blocks of llama3b_train's step, eight layouts).
  std::size_t max_step_events = 1 << 15;
  // Find the step's length without marks (until the first mark_step()): see "Finding the step" above.
  bool detect_steps = true;
  std::size_t min_step_events = 64;       // detection ignores shorter repeats (loops inside a step)
  // Plans in a row that fell back before serving two whole steps, after which the planner stops.
  unsigned max_fallbacks = 4;
  // Detection rests where it finds nothing: after awake_events events recorded with no plan made
  // or dropped, the planner is dormant for dormant_events events (it records nothing; a request
  // costs a count), then starts afresh (the blocks live before are unknown to it). A program whose
  // steps never repeat then pays for detection an eighth of the time by default. 0: never dormant.
  // Each rest that follows another with no step found in between is twice as long as the one before,
  // up to 2^dormant_doublings x dormant_events (by default detection is then awake one event in
  // 113); a step found starts the count again (marks end detection, and with it the rests).
  std::uint64_t awake_events = std::uint64_t{1} << 17;
  std::uint64_t dormant_events = std::uint64_t{7} << 17;
  unsigned dormant_doublings = 4;
  // Plan only steps whose allocations are all on one stream (an owner that places planned blocks
  // in memory of one stream, as the engine does).
  bool one_stream = false;
  // Lay a step out on a thread of its own (the engine: the layout took 36-40 ms for llama_train's
  // step live, about 0.8 s for llama3b_train's in the replay; the allocating thread would wait).
  // Meanwhile the planner checks the events against the step as it does while armed; the plan
  // serves from the first trough after it is done. Off (the replay): laid out at the event the
  // step is found, so that a replay is the same every time.
  bool layout_thread = false;
  // Called on the layout thread before it lays the step out (tests hold the layout back with it).
  std::function<void()> layout_hook;
};

// One event of a recorded step.
struct StepEvent {
  bool is_free = false;
  std::uint8_t steps_back = 0;  // free: 0 = an allocation of this step, 1 = of the step before
  std::uint32_t index = 0;      // free: which allocation of that step (0-based)
  std::uint64_t size_bytes = 0; // allocation: rounded size
  StreamId stream = 0;          // allocation: its stream
  friend bool operator==(const StepEvent&, const StepEvent&) = default;
};

// A step's layout. offsets[j] is allocation j's offset in the arena, or kNotPlanned for a block
// left to the owner.
struct StepPlan {
  static constexpr std::uint64_t kNotPlanned = ~std::uint64_t{0};
  std::vector<std::uint64_t> offsets;
  std::size_t arena_bytes = 0;        // the arena the layout needs
  std::size_t peak_live_bytes = 0;    // the most planned bytes live at once (a lower bound on it)
  std::size_t trough = 0;             // the event position (before that event) where serving starts
  std::size_t trough_live_bytes = 0;  // planned bytes live there
  std::size_t unplanned_blocks = 0;   // blocks left to the owner
  const char* order = "";             // the greedy order that gave the smallest arena ("size",
                                      // "area", "duration", "start")
  bool best_fit = false;              // ... with best-fit placement (else first fit)
  // neighbours[j], for a planned allocation j: a planned block live where j is allocated and next
  // to it in the arena (the one with the highest offset below j's, else the one with the lowest
  // above), or kNoNeighbour when none is live. A block live over the step's end counts with its
  // instance of the step before. An owner can start its search for j's range there instead of at
  // the arena's start (StepPlanner::placement_hint).
  static constexpr std::uint32_t kNoNeighbour = ~std::uint32_t{0};
  std::vector<std::uint32_t> neighbours;
};

// Where an owner may start looking for the range of the address StepPlanner::allocate just gave:
// the address of a block the plan has live next to it, below (above == false: the block ends at or
// before the planned address) or above it. neighbour == 0: none. A hint, not a promise: in the
// first step served, or after the owner placed blocks of its own in the arena's range, no block of
// the owner's may start there; the owner checks it.
struct StepPlacementHint {
  std::uintptr_t neighbour = 0;
  bool above = false;
};

// Plans one step (pure). Returns nullopt with `why` set if the step cannot be planned: a free of a
// block the step does not know, no allocation, or no block that can be planned.
std::optional<StepPlan> plan_step(const std::vector<StepEvent>& step, std::size_t round_bytes, std::string* why);

struct StepPlanCounters {
  std::uint64_t marks = 0;
  std::uint64_t detected_steps = 0;   // steps found without marks (each one planned)
  std::uint64_t step_events = 0;      // the events of the last step found without marks
  std::uint64_t plans = 0;            // steps planned
  std::uint64_t arenas_mapped = 0;
  std::uint64_t fallbacks = 0;        // plans abandoned at an event that differed
  std::uint64_t served_allocations = 0;
  std::uint64_t served_steps = 0;     // steps that ended (at a mark, or where a detected step
                                      // ends) while served, the first from its trough on
  std::size_t arena_bytes = 0;        // the arena mapped now (0 if none)
  std::size_t last_plan_arena_bytes = 0;
  std::size_t last_plan_peak_live_bytes = 0;
  std::size_t last_plan_trough_live_bytes = 0;  // planned bytes live where serving starts
  std::string last_reason;            // why the last step recorded was not planned (empty: it was, or no
                                      // step was compared yet)
  std::string last_fallback;          // the event at which the last plan fell back
  bool stopped = false;               // the planner stopped for good (max_fallbacks, or stop())
  std::uint64_t dormant_periods = 0;  // times detection rested (StepPlanOptions::dormant_events)
  bool dormant = false;               // ... and whether it rests now
  std::uint64_t layouts = 0;          // steps laid out (plans and steps that could not be planned)
  std::uint64_t last_layout_us = 0;   // how long the last layout took, in microseconds
  bool laying_out = false;            // a layout thread is at work for the plan armed now
};

class StepPlanner {
 public:
  StepPlanner(StepArenaHost& host, StepPlanOptions options = {});
  ~StepPlanner();  // waits for a layout thread still at work
  StepPlanner(const StepPlanner&) = delete;
  StepPlanner& operator=(const StepPlanner&) = delete;

  // A step starts here.
  void mark_step();

  // Before the owner serves a request: the address in the arena that the plan gives it, or nullopt
  // (the owner places it where it likes). Either way the owner then calls note_allocated with the
  // address the block got; if it could not place the block at the planned address, it calls
  // placement_failed() first (the plan falls back) and places it elsewhere. A zero-byte request is
  // no event of the step: nullopt, and note_allocated after it is ignored; a request that fails
  // (no note_allocated) leaves the next request to be compared with the same event of the plan.
  std::optional<std::uintptr_t> allocate(std::size_t size_bytes, StreamId stream);
  void placement_failed();
  // After allocate() gave an address: a neighbour to start looking from (StepPlacementHint).
  StepPlacementHint placement_hint() const noexcept { return hint_; }
  void note_allocated(std::uintptr_t addr);
  // The request allocate() was last asked about, for an owner that serves it without the planner's
  // lock (another thread's allocate() may come in between): taken right after an allocate() that
  // gave no address, handed back with the block's address. Taking it leaves no request pending.
  struct Request {
    std::uint64_t size_bytes = 0;  // rounded; 0: no event (a zero-byte request)
    StreamId stream = 0;
  };
  Request take_request() noexcept;
  void note_allocated(std::uintptr_t addr, Request request);
  // Before the owner frees a block: true if the plan placed it in the arena (a block the owner
  // placed itself in the arena's range, after a fallback, is not the arena's).
  bool free(std::uintptr_t addr);

  // Stops planning for good: the owner found that its program's events have no order to repeat
  // (threads that allocate at the same time). A plan being served falls back; once no block of its
  // arena is live the planner is stopped, and from then on allocate() gives nothing and free()
  // returns false at once (an owner may stop calling it).
  void stop(const std::string& why);
  bool stopped() const noexcept { return mode_ == Mode::stopped; }
  // Whether it only records (looks for a step, no plan armed or served): allocate() then gives no
  // address, whatever the request, until an event of the owner's changes that.
  bool only_records() const noexcept { return mode_ == Mode::recording; }
  // Dormancy (StepPlanOptions::dormant_events): whether detection rests, and the events left until
  // it wakes. An owner may count those events itself and not call the planner meanwhile, then
  // wake() it (the planner then starts afresh, as after counting them itself).
  bool dormant() const noexcept { return mode_ == Mode::dormant; }
  std::uint64_t dormant_left() const noexcept { return mode_ == Mode::dormant ? dormant_left_ : 0; }
  void wake();

  bool serving() const noexcept { return mode_ == Mode::serving; }
  // layout_thread: whether a layout is at work, and waiting for it (then taking its plan, as the
  // next call would). For tests, and an owner that wants the plan at once.
  bool laying_out() const noexcept { return layout_ != nullptr; }
  void wait_for_layout();
  bool in_arena(std::uintptr_t addr) const noexcept {
    return arena_bytes_ != 0 && addr >= arena_base_ && addr < arena_base_ + arena_bytes_;
  }
  const StepPlanCounters& counters() const noexcept { return counters_; }

 private:
  enum class Mode : std::uint8_t { recording, armed, serving, draining, stopped, dormant };
  struct Live {
    std::uint64_t ordinal = 0;           // the how-manyth allocation the planner saw
    std::uint64_t size_bytes = 0;        // rounded
    std::uint64_t arena_generation = 0;  // served in the arena mapped as this one (0: not served)
  };
  // The detector's record of one event.
  struct RawEvent {
    std::uint64_t value = 0;          // allocation: rounded size; free: its block's ordinal (~0: unknown)
    std::uint64_t allocs_before = 0;  // allocations seen before this event
    StreamId stream = 0;
    bool is_free = false;
  };

  StepEvent free_event(std::uint64_t ordinal) const noexcept;
  void note(const StepEvent& e, std::uintptr_t addr, bool served);
  void record(const StepEvent& e, std::uint64_t ordinal);
  std::uint64_t range_hash(std::uint64_t a, std::uint64_t b, std::uint64_t base_power) const noexcept;
  void plan_detected(std::uint64_t n, std::uint64_t period);
  // A step to plan: laid out now (plan, then adopt), or on a layout thread (arm, then take_plan
  // when it is done). `period`: the step's length if it was found without marks, else 0.
  void lay_out(std::vector<StepEvent> step, std::uint64_t period);
  void adopt(StepPlan plan, std::vector<StepEvent> events);
  void arm(std::vector<StepEvent> events);
  void take_plan(StepPlan plan);
  void not_planned(const std::string& why, std::uint64_t period);
  // layout_thread: a layout done is taken (finish_layout) at the next call.
  void poll_layout() {
    if (layout_ != nullptr) [[unlikely]]
      poll_layout_slow();
  }
  void poll_layout_slow();
  void finish_layout();
  // The options' own conditions (one_stream); then plan(): those and plan_step.
  bool plannable(const std::vector<StepEvent>& step, std::string* why) const;
  std::optional<StepPlan> plan(const std::vector<StepEvent>& step, std::string* why);
  bool matches(const StepEvent& e) const;
  void advance();
  void end_step();
  void fall_back(const std::string& reason);
  void maybe_unmap();
  // Dormancy (StepPlanOptions::dormant_events): rest() enters it, tick() counts an event in it and
  // wakes up after the last.
  void rest();
  void tick();
  void start_serving_if_due();
  struct LayoutJob;  // a layout thread and what it hands over (step_plan.cpp)
  // Equal steps in a row needed to plan: 2, and one more per plan in a row that fell back before
  // serving two whole steps.
  std::uint64_t required_repeats() const noexcept { return 2 + unproductive_fallbacks_; }

  StepArenaHost& host_;
  StepPlanOptions options_;
  Mode mode_ = Mode::recording;
  bool marked_ = false;                 // the program marks steps (detection is off)

  // Blocks: every live block the planner saw allocated, and where steps start, by ordinal.
  AddressTable<Live> live_;  // (an address 0 is not recorded: its free is of an unknown block)
  std::uint64_t next_ordinal_ = 0;
  std::uint64_t step_first_ = 0;        // the ordinal of the current step's first allocation
  std::uint64_t previous_first_ = 0;    // ... of the step before's
  std::uint64_t freed_bytes_ = 0;       // the size of the block free() is recording

  // Marked steps.
  bool step_overflowed_ = false;        // the current step outgrew max_step_events
  bool step_foreign_ = false;           // the current step freed a block from before the step before
  std::vector<StepEvent> current_;      // the current step's events
  std::vector<StepEvent> previous_;     // the last whole step's
  bool previous_ok_ = false;            // previous_ is whole and plannable
  std::uint64_t equal_steps_ = 0;       // whole steps in a row, ending with previous_, that are the same

  // Detection: the last events (a ring of the power of two at or above 2 x max_step_events + 2),
  // prefix hashes of their
  // signatures, and a table of keys (the last kWindow events' hash and the bytes live) to the
  // event where each was last seen.
  std::vector<RawEvent> ring_;
  std::vector<std::uint64_t> prefix_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> keys_;
  std::uint64_t window_power_ = 1;
  std::uint64_t events_ = 0;
  std::uint64_t live_bytes_ = 0;
  std::uint64_t cooldown_period_ = 0;   // a period found not to plan, ignored until cooldown_until_
  std::uint64_t cooldown_until_ = 0;
  std::uint64_t fallback_event_ = 0;    // the event of the last fallback: repeats count from there
  std::uint64_t awake_since_ = 0;       // events_ when detection last woke, or a plan was made or dropped
  std::uint64_t dormant_left_ = 0;      // events until detection wakes (dormant)
  unsigned quiet_rests_ = 0;            // rests since the last step found: the next is 2^this longer

  // The plan and its arena.
  StepPlan plan_;
  std::vector<StepEvent> plan_events_;
  bool plan_ready_ = false;             // plan_ is plan_events_' layout (armed: it may still be at work)
  bool wait_next_step_ = false;         // the layout was done past the trough: serve from the next step's
  std::unique_ptr<LayoutJob> layout_;   // a layout thread at work (or done and not yet taken)
  std::uint64_t layout_period_ = 0;     // the step it lays out was found without marks, this long (0: marked)
  std::size_t pos_ = 0;                 // events of the current step matched so far (armed/serving)
  std::uint64_t plan_served_steps_ = 0;
  unsigned unproductive_fallbacks_ = 0;
  bool stop_requested_ = false;         // stop(): stopped once the arena is empty
  std::uintptr_t arena_base_ = 0;
  std::size_t arena_bytes_ = 0;
  std::size_t arena_live_ = 0;          // blocks served in the arena and live
  std::uint64_t arena_generation_ = 0;  // arenas mapped so far
  std::uint64_t pending_size_ = 0;      // the request allocate() was last asked about
  StreamId pending_stream_ = 0;
  std::uintptr_t planned_addr_ = 0;     // the address allocate() gave it (0: none)
  StepPlacementHint hint_;              // ... and where to look for it from

  StepPlanCounters counters_;
};

}  // namespace gpumem::alloc
