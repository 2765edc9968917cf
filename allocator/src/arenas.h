// Arenas: several engines for one device (engines_per_device(config) > 1: the default, arenas:auto,
// and arenas:N for N > 1; docs/notes/thread-caches.md, "Arenas").
//
// One engine serves every thread until threads keep finding its lock taken. A thread whose
// allocations waited for its engine's lock kMoveAfterContended times, while it shares its engine
// with another thread, moves: to an arena no thread uses now (its threads exited), else to an
// engine of its own (an arena) made then while fewer than engines_per_device(config) exist, else
// to the arena with the fewest threads if that evens the load. An arena is a whole engine
// (CachingAllocator with arenas:1, thread caches as configured) over the device's one source and
// stream events, so it has its own regions, free blocks and lock: a thread allocating in its arena
// meets no other thread's allocations, and its pair costs what one thread's costs (thread-caches.md,
// "Nothing shared"). Threads that share an arena with nowhere to move (more threads than arenas)
// share its thread caches, which come on when an allocation of theirs waits for its lock (not, as
// in one engine, at any contended acquisition: see note_wait); a thread that moves hands its cache
// in the arena it left back. A StatsObserver counts in place only while there is one arena
// (Note [Stats in place]): when the second is made it is unbound from the first, which would
// otherwise apply every arena's events under its own lock.
//
// What the arenas share, and how:
//   - memory ownership: every arena knows its own memory exactly (its regions), so a pointer is
//     given to the calling thread's arena first and, when that arena says it is not its memory
//     (FreeStatus::foreign_pointer, or no lookup), to the others in turn. A free from the thread
//     that allocated costs one engine call, as without arenas; a free from another thread up to one
//     call per arena.
//   - one cap: each arena's source (ArenaSource) counts the physical bytes it holds into one sum for
//     the device and refuses a growth that would take the sum past the cap (fraction x provider
//     total, or the absolute limit: the engine's own rule, cap_policy.h); the refusal says so.
//   - out of memory: a request an arena cannot serve is tried once more after every other arena has
//     released its cached memory (empty_cache), before the failure is reported.
//   - settings: capture, holding, the cap and the observers are set on every arena, and an arena
//     made later starts with them. Events carry one sequence for the device (a counter the arenas
//     share), so a trace of several arenas is one trace.
//   - views: totals are summed (the largest free extent is the largest of any arena); a snapshot
//     holds every arena's segments, sorted by address. Each arena emits its own snapshot event.
//
// What a thread remembers: a few (Arenas id, arena) pairs in thread-local slots; a thread that uses
// more allocators than slots may lose its place and start again in the first arena. Each arena
// counts the threads whose place is in it (a thread that exits is forgotten); a thread alone in its
// arena never moves.
//
// Thread-safety: every member may be called from any thread. `mutex` guards making arenas and the
// settings; the arena list is read without it (an arena, once made, lives as long as the Arenas).
// CachingAllocator runs an engine's allocate and free itself, in the engine the arenas name
// (engine_for_allocation, engine_for_free); the arenas call the rest through each engine's public
// functions. note_wait runs with an arena's engine lock held (the engine's
// contended path): it takes no lock but g_live_mutex (a place given up, forget_place), which is
// never held while an engine lock is taken; a move, which may take the first arena's lock (a second
// arena unbinds its StatsObserver), runs in engine_for_allocation() with no engine lock held.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/forwarding_source.h"

namespace gpumem::alloc::detail {

// The physical bytes the arenas of a device hold, and their cap.
struct ArenaLedger {
  std::atomic<std::size_t> bytes{0};
  std::atomic<std::size_t> cap{kNoLimit};
  // Adds n if the sum stays within the cap; false (nothing added) if it would not.
  bool try_add(std::size_t n) noexcept {
    std::size_t now = bytes.load(std::memory_order_relaxed);
    for (;;) {
      const std::size_t c = cap.load(std::memory_order_relaxed);
      if (c != kNoLimit && (now > c || n > c - now)) return false;
      if (bytes.compare_exchange_weak(now, now + n, std::memory_order_relaxed)) return true;
    }
  }
  void sub(std::size_t n) noexcept { bytes.fetch_sub(n, std::memory_order_relaxed); }
};

// One arena's view of the device's source: every call goes to the source; the physical memory it
// backs (created pieces on a virtual-memory source, reserved ranges on one without) is counted in
// the ledger, and a call that would pass the ledger's cap is refused with out_of_memory.
class ArenaSource final : public ForwardingSource {
 public:
  ArenaSource(MemorySource& inner, ArenaLedger& ledger) noexcept
      : ForwardingSource(inner), ledger_(ledger), virtual_(inner.caps().virtual_memory) {}

  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override;
  SourceStatus release(VaRange range) override;
  SourceResult<PhysHandle> create(std::size_t size_bytes) override;
  SourceStatus destroy(PhysHandle handle) override;
  std::string last_error() const override;

 private:
  // Counts n bytes in, or records why not (the cap) and returns false.
  bool admit(std::size_t n);

  ArenaLedger& ledger_;
  const bool virtual_;
  mutable std::mutex mutex_;                                 // guards the two below
  std::unordered_map<PhysHandle, std::size_t> piece_bytes_;  // created pieces' sizes (virtual memory)
  std::string refusal_;  // why the last call was refused by the cap; empty once the source is called again
};

struct Arenas {
  // After this many of its allocations met the lock found taken, a thread moves to an arena of its own.
  static constexpr unsigned kMoveAfterContended = 8;

  Arenas(MemorySource& source, StreamEvents& events, const Config& config, int device);
  ~Arenas();
  Arenas(const Arenas&) = delete;
  Arenas& operator=(const Arenas&) = delete;

  // The engine the calling thread allocates in (CachingAllocator::allocate, once the arenas route):
  // its place's arena, after moving it if its waits made it due.
  CachingAllocator::Impl& engine_for_allocation();
  // An allocation in `own` (one of these arenas) failed after the engine's own retry: the other
  // arenas release their cached memory and it is tried once more; `result` becomes that try's
  // (its OOM detail says so). Nothing with one arena, or within the retry itself.
  void retry_out_of_memory(CachingAllocator::Impl& own, std::size_t size_bytes, StreamId stream, AllocResult& result);
  // The engine a free from the calling thread tries first (CachingAllocator::free, with more than
  // one arena): its arena's, the first if it has no place (a thread usually frees what it
  // allocated).
  CachingAllocator::Impl& engine_for_free() const noexcept;
  // A free that `tried` answered foreign_pointer: the other arenas in turn, until one does not.
  FreeStatus free_elsewhere(void* ptr, const CachingAllocator::Impl& tried);
  FreeStatus record_stream(void* ptr, StreamId stream);
  FreeStatus allocate_at(void* ptr, std::size_t size_bytes, std::size_t requested_bytes);
  std::optional<BlockLookup> lookup(const void* ptr) const;
  void empty_cache();
  void set_capturing(bool capturing);
  void set_holding(bool holding);
  bool capturing() const;
  bool holding() const;
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
  void set_memory_limit(std::size_t bytes);
  void attach_observer(std::shared_ptr<AllocObserver> observer);
  void detach_observer(const AllocObserver* observer);
  EngineSnapshot snapshot();
  EngineTotals totals() const;
  EngineLockCounts lock_counts() const noexcept;
  std::uint64_t churn_openings() const noexcept;
  std::vector<ExpandableRegionSize> expandable_region_sizes() const;
  std::size_t largest_free_block_bytes() const;
  void check_invariants() const;
  std::size_t round_size(std::size_t size_bytes) const noexcept { return engine(0).round_size(size_bytes); }
  unsigned count() const noexcept { return count_.load(std::memory_order_acquire); }
  // The first arena's engine: CachingAllocator calls it inline (no place, no routing) while it is
  // the only arena and no thread is due to move.
  CachingAllocator::Impl& first_engine() const noexcept { return *engine(0).impl_; }
  // The first arena (Config::step_plan: the planner lays its steps out there while no thread has
  // moved; docs/notes/thread-caches.md, "The step planner with arenas").
  CachingAllocator& first_arena() const noexcept { return engine(0); }
  // Whether allocations must ask engine_for_allocation(): more than one arena, or a thread due to
  // move.
  // One load: routing_ is set when the second arena is made or a move falls due, and never cleared
  // (a move that could make no arena leaves it on: allocations then take the slower way, no other
  // harm). A thread that reads it stale allocates in the first arena, where every thread that has
  // not moved allocates anyway; a thread that moved set it itself, or read it set, and never reads
  // it unset again.
  bool routing() const noexcept { return routing_.load(std::memory_order_relaxed); }
  // The calling thread's allocation waited for an arena's lock (the engine's contended path, with
  // that lock held: counts only, never moves). While the thread shares its arena, the wait counts
  // against it, and the kMoveAfterContended-th makes it due to move at its next allocation.
  // Returns whether the arena's thread caches should come on: the thread shares its arena and no
  // move is open to it (every arena made, none unused, none whose load a move would even), so
  // threads that stay together meet in its lock. A thread alone in its arena, or one that will
  // move, says no: its waits end by themselves (Note [Thread caches], "Caches in an arena only
  // where they help").
  bool note_wait() noexcept;
  // Whether thread caches came on in any arena (its lock was contended while threads shared it).
  // Loads, no lock.
  bool thread_caches_on() const noexcept;
  // Waits counted against threads that shared their arena (note_wait), since the Arenas was made.
  std::uint64_t waits_counted() const noexcept { return waits_.load(std::memory_order_relaxed); }
  // The arena the calling thread allocates in (0 until it moves).
  unsigned arena_of_this_thread() const noexcept { return arena_if_placed(); }
  // Moves the calling thread now, as contention would (to an unused arena, a new one, or a less
  // used one); false if it stays. For tests.
  bool move_this_thread();
  // engine's arenas, or null when it has one engine (engines_per_device(config) == 1). For tests.
  static Arenas* of(CachingAllocator& engine) noexcept { return engine.arenas_.get(); }

  const Config config;  // as the user gave it (arenas:N, or arenas:auto)
  MemorySource& source;
  const int device;

 private:
  struct Arena {
    Arena(MemorySource& inner, ArenaLedger& ledger, StreamEvents& events, const Config& config, int device)
        : source(inner, ledger), engine(source, events, config, device) {}
    ArenaSource source;
    CachingAllocator engine;
  };
  // This thread's place: which arena it allocates in, and how often it found a lock taken there.
 public:
  struct Place {
    std::uint64_t owner = 0;  // Arenas::id_ (0: free slot)
    unsigned arena = 0;
    unsigned contended = 0;
    bool move_due = false;  // kMoveAfterContended waits counted: moves at its next allocation
  };

 private:

  CachingAllocator& engine(unsigned i) const noexcept { return arenas_[i].load(std::memory_order_acquire)->engine; }
  // The calling thread's place, made (in the first arena) if it has none.
  Place& place_for_this_thread() noexcept;
  // The calling thread's place, or null; makes none.
  Place* find_place() const noexcept;
  // engine_for_allocation past its first look (the place found last, not due to move): the
  // thread's place, made if it has none, and its move.
  CachingAllocator::Impl& engine_for_allocation_placing();
  // The place found last (a thread-local pointer, no lookup) if it is this Arenas'; else null.
  // Every lookup of the calling thread's place starts here.
  Place* last_place() const noexcept;
  // find_place past its first look (the place found last): the thread's set of places.
  Place* find_place_in_set() const noexcept;
  // Makes `place` the one find_place looks at first (a thread-local pointer); returns it.
  static Place* remember(Place* place) noexcept;
  // The calling thread's arena, or the first if it has no place.
  unsigned arena_if_placed() const noexcept;
  // Where a thread of arena `from` could move (kMaxArenas: nowhere of that kind), in move_place's
  // order of preference: an unused arena, a new one, one at least two threads less used. move_place
  // reads it under the mutex; note_wait without it, as a hint (a thread that finds no move after
  // all stays, and its next waits say so).
  struct MoveOptions {
    unsigned unused = kMaxArenas;
    bool may_make = false;  // fewer arenas than engines_per_device(config)
    unsigned evener = kMaxArenas;
    bool any() const noexcept { return unused != kMaxArenas || may_make || evener != kMaxArenas; }
  };
  MoveOptions move_options(unsigned from) const noexcept;
  // Moves the thread of `place` to the first of its move_options (a new arena is made then); false
  // if it stays.
  bool move(Place& place);
  // move()'s choice and the counts, under the arenas' mutex; true if the thread moved.
  bool move_place(Place& place);
  // Makes arena count() with the current settings (mutex held); null if the host has no memory.
  Arena* make_arena_locked();
  // The cap the ledger enforces, from the settings (mutex held).
  void update_cap_locked();
  // The first arena stops counting a StatsObserver's events in place, for good (a second arena is
  // being made).
  static void unbind_stats(CachingAllocator& first);
  // Calls f(engine) on the calling thread's arena, then on the others, until f says it found the
  // pointer (returns true).
  template <class F>
  void for_owner(F&& f) const;

  // A thread stops using this Arenas (it exits, or its place is taken for another): its arena has
  // one user fewer. Safe after the Arenas is gone (then nothing happens).
  static void forget_place(const Place& place) noexcept;
  friend struct PlaceSet;

  const std::uint64_t id_;            // distinct for every Arenas made in the process
  const Config arena_config_;         // arenas:1, thread_cache as given
  StreamEvents& events_;
  ArenaLedger ledger_;
  std::atomic<std::uint64_t> seq_{0};  // the device's event sequence
  std::array<std::atomic<Arena*>, kMaxArenas> arenas_{};
  // Threads whose place is in each arena. A thread alone in its arena never moves: the contention
  // it meets there is another thread's free of memory it allocated before it moved, not a fight.
  std::array<std::atomic<unsigned>, kMaxArenas> users_{};
  std::atomic<unsigned> count_{0};
  std::atomic<bool> routing_{false};  // routing()
  std::atomic<std::uint64_t> waits_{0};  // waits_counted()
  mutable std::mutex mutex_;  // making arenas; the settings below
  std::vector<std::unique_ptr<Arena>> owned_;
  bool capturing_ = false;
  bool holding_ = false;
  double fraction_ = 1.0;
  std::size_t limit_bytes_ = 0;
  std::size_t provider_total_ = 0;
  std::vector<std::shared_ptr<AllocObserver>> observers_;
};

}  // namespace gpumem::alloc::detail
