// TraceRing: the bounded history of one engine's events, and the only one: the trace of gpumem's
// snapshots and OOM postmortems (EngineForensics) and the history the torch adapter shows as
// torch.cuda.memory._snapshot()'s device_traces (_record_memory_history). An AllocObserver that
// copies each event into a ring whose oldest records are overwritten, tagged with what was current
// on the publishing thread: the op and user scope (when op recording is on, see OpStack), and what
// the program attached (a stack context, a compile context, user metadata; TraceNotes).
//
// Two readers, one buffer:
//   history()   what the history settings ask for (TraceSettings: the last `capacity` records of
//               the kinds not skipped, since the last clear): PyTorch's view.
//   records()   everything kept: the history, plus the recent records a postmortem keeps whatever
//               the history settings say (keep_at_least). EngineForensics reads this.
// With only one of them in use the two are the same records. No event is stored twice.
//
// OOM records: by default the engine's oom event is kept as it comes. A caller that adds what the
// engine does not know (the torch adapter: the provider's free bytes, PyTorch's oom entry) calls
// leave_oom_to_caller(true); the engine's oom event is then held on the publishing thread until
// that thread calls record_oom(), which keeps it with the free bytes.
//
// Stack contexts: an alloc record carries the allocation's AllocContext (alloc_context.h) when the
// history asks for contexts (TraceSettings::contexts) or a postmortem does (keep_contexts); so
// does the oom record of record_oom().
//
// Cost: while inactive (no history, no floor, no hook) on_events returns after one atomic load.
// Active, it reads the CPU's tick counter once per batch (tick_clock.h; the engine is asked for
// sequence numbers only, never for its clock), and the ring's lock (a spin lock) is held only to
// copy the batch's records in. In the common case (no hooks, nothing attached to the records) an
// event is a few plain stores into its aligned 64-byte slot (the event's bytes, then time, op and
// scope); a full ring fetches the line it will overwrite a few records ahead, so those stores do
// not wait for memory. Callgrind, bench_forensics_observers: about 240 instructions per
// alloc+free pair (two batches, three events) over plain gpumem. The buffer grows on demand up to
// its capacity (a few allocations, amortized), and hooks run after the lock is released.
// 64 bytes a record (what the program attached is kept once per run of records that share it).
// Times are ticks while kept and steady-clock nanoseconds in every record handed out.
//
// Invariants: records().size() <= max(settings().capacity, floor); records() is oldest first, in
// publication order; history() is an ordered subset of records(); dropped() counts records
// overwritten since construction or the last clear().
// Thread-safety: every member may be called from any thread; hooks are called on the thread that
// published the events, with no lock of the ring held.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "gpumem/alloc/events.h"
#include "gpumem/alloc/spin_lock.h"
#include "gpumem/forensics/detail/tick_clock.h"

namespace gpumem::forensics {

// What the program attached to a record (all optional).
struct TraceNotes {
  std::shared_ptr<void> stack_context;  // opaque (the torch adapter's c10::GatheredContext), or null
  std::string compile_context;          // empty = none
  std::string user_metadata;            // empty = none
  std::size_t device_free_bytes = 0;    // oom records from record_oom: provider free bytes
};

struct TraceRecord {
  alloc::AllocEvent event;
  std::uint32_t op = 0;     // OpRegistry id of the innermost op, 0 = none / not recorded
  std::uint32_t scope = 0;  // OpRegistry id of the innermost user scope, 0 = none
  std::shared_ptr<const TraceNotes> notes;  // null = nothing attached

  const std::shared_ptr<void>& stack_context() const noexcept;
  const std::string& compile_context() const noexcept;
  const std::string& user_metadata() const noexcept;
  std::size_t device_free_bytes() const noexcept { return notes ? notes->device_free_bytes : 0; }
};

// The history PyTorch's _record_memory_history configures.
struct TraceSettings {
  std::size_t capacity = 0;     // records kept; 0 = none (SIZE_MAX = unbounded)
  std::uint32_t skip_mask = 0;  // bit (1u << EventKind) set = leave that kind out
  bool contexts = false;        // attach the thread's stack context to alloc records
};

constexpr std::uint32_t skip_bit(alloc::EventKind kind) noexcept {
  return std::uint32_t{1} << static_cast<unsigned>(kind);
}

class TraceRing final : public alloc::AllocObserver {
 public:
  static constexpr std::size_t kDefaultCapacity = 262144;  // about 50 training steps of BERT-base

  // Inactive (asleep to the engine: kSleeping) until configure(), keep_at_least() or add_hook().
  TraceRing() : alloc::AllocObserver(alloc::kSleeping) {}
  // Keeps the last `capacity` records of every kind (capacity >= 1; throws ForensicsError for 0:
  // trace_entries:0 turns tracing off, so no ring should be made then). record_ops: tag records
  // with the publishing thread's op and scope.
  explicit TraceRing(std::size_t capacity, bool record_ops = false);

  // needs(): order (kNeedsSequence) while it keeps records or feeds hooks, else kSleeping; times
  // come from its own clock.
  void on_events(std::span<const alloc::AllocEvent> events) override;

  // ---- configuration ----
  // New history settings; clear starts the history afresh (see clear()). If the buffer's capacity
  // falls below what is kept, the oldest records that no longer fit are dropped.
  void configure(const TraceSettings& settings, bool clear);
  TraceSettings settings() const;
  // Keeps at least the last `records` records of every kind, whatever the history settings (the
  // postmortem's need). 0 = no floor.
  void keep_at_least(std::size_t records);
  // Tag records with the publishing thread's op and scope (OpStack) from now on.
  void set_record_ops(bool on) noexcept { record_ops_.store(on, std::memory_order_relaxed); }
  bool records_ops() const noexcept { return record_ops_.load(std::memory_order_relaxed); }
  // Attach the allocation's stack context to alloc records whatever the history settings (the
  // postmortem's stacks). Contexts the history asks for are attached either way.
  void set_keep_contexts(bool on) noexcept { keep_contexts_.store(on, std::memory_order_relaxed); }
  // See "OOM records" above.
  void leave_oom_to_caller(bool on);
  // Adds a hook called for every record of a kind the history does not skip, from now on (even
  // when the history keeps none).
  using Hook = std::function<void(const TraceRecord&)>;
  void add_hook(Hook hook);

  // ---- what the program attaches ----
  void set_user_metadata(std::string metadata);
  std::string user_metadata() const;
  void push_compile_context(std::string context);
  void pop_compile_context();
  // Sets the calling thread's AllocContext (alloc_context.h) for its next engine call; kept for
  // callers that set and clear it around the call (the torch adapter). Prefer AllocContext::Scope.
  static void set_thread_context(std::shared_ptr<void> context) noexcept;
  // The oom record of the failure the calling thread just saw: the engine's oom event held for it
  // (leave_oom_to_caller), else `fallback`, with the provider's free bytes and the calling
  // thread's AllocContext (when contexts are kept).
  void record_oom(const alloc::AllocEvent& fallback, std::size_t device_free_bytes);

  // ---- reading ----
  std::vector<TraceRecord> history() const;  // PyTorch's view, oldest first
  std::vector<TraceRecord> records() const;  // everything kept, oldest first
  std::size_t size() const;                  // records().size()
  std::size_t capacity() const;              // max(settings().capacity, floor)
  std::uint64_t dropped() const;
  bool active() const noexcept { return active_.load(std::memory_order_acquire); }
  // Drops the history: history() is empty until new records arrive. Records kept for the floor
  // stay (records()); without a floor everything is dropped and dropped() restarts at 0.
  void clear();

 private:
  // A kept record: plain data, exactly one cache line and aligned to it, so that overwriting the
  // oldest one writes one whole line. Notes are kept beside, in notes_.
  struct alignas(64) Slot {
    alloc::AllocEvent event;
    std::uint32_t op = 0;
    std::uint32_t scope = 0;
  };
  static_assert(sizeof(Slot) == 64, "a slot is one cache line");
  // The notes of kept records: one entry per run of consecutive records (by ordinal) that share
  // one notes object, oldest first; records in no run have none.
  struct NotesRun {
    std::shared_ptr<const TraceNotes> notes;
    std::uint64_t first_ordinal = 0;
    std::uint64_t last_ordinal = 0;
  };

  bool skipped_locked(alloc::EventKind kind) const noexcept { return (settings_.skip_mask & skip_bit(kind)) != 0; }
  std::size_t capacity_locked() const noexcept { return std::max(settings_.capacity, floor_); }
  std::uint64_t oldest_ordinal_locked() const noexcept { return appended_ - buffer_.size(); }
  void append_locked(const alloc::AllocEvent& event, std::uint64_t ticks, std::uint32_t op, std::uint32_t scope,
                     const std::shared_ptr<const TraceNotes>& notes, std::size_t cap);
  void publish_slow(std::span<const alloc::AllocEvent> events, const std::shared_ptr<void>* context, std::uint32_t op,
                    std::uint32_t scope, std::uint64_t ticks);
  void note_locked(const std::shared_ptr<const TraceNotes>& notes, std::uint64_t ordinal);
  void grow_locked(const Slot& slot);
  void trim_notes_locked();
  void fit_locked();
  void clear_locked();
  void update_active_locked();
  void refresh_notes_locked();
  // Kept records from position `first` (0 = oldest) on, oldest first, keep(record) deciding which.
  template <class Keep>
  std::vector<TraceRecord> copy_out_locked(std::size_t first, Keep keep) const;

  // Held per batch for a few stores per record: a spin lock (an uncontended std::mutex cost about
  // 55 instructions per batch in callgrind, a third of the ring's cost); it yields after a short
  // spin, so publishers waiting while a reader copies the whole ring out do not burn their slice.
  mutable alloc::detail::SpinLock mutex_;
  std::atomic<bool> active_{false};
  std::atomic<bool> record_ops_{false};
  std::atomic<bool> contexts_{false};  // settings_.contexts, read without the lock
  std::atomic<bool> keep_contexts_{false};
  detail::TickCalibration clock_;      // ticks of kept records -> steady ns
  TraceSettings settings_;
  std::size_t floor_ = 0;
  bool oom_to_caller_ = false;
  std::vector<Slot> buffer_;         // grows to capacity_locked(), then wraps
  std::size_t head_ = 0;             // when full: index of the oldest record
  std::uint64_t appended_ = 0;       // records ever appended (ordinal of the next one)
  std::uint64_t history_start_ = 0;  // ordinal of the first record the history shows
  std::uint64_t dropped_ = 0;
  std::deque<NotesRun> notes_;
  std::vector<Hook> hooks_;
  std::string user_metadata_;
  std::vector<std::string> compile_contexts_;
  std::shared_ptr<const TraceNotes> current_notes_;  // metadata + compile context; null when both empty
};

}  // namespace gpumem::forensics
