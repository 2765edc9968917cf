// CachingAllocator: the caching engine of one device.
//
// Requests are rounded (512 bytes, or roundup_power2_divisions), sent to the small (<= 1 MiB) or
// large pool, and served best-fit from free blocks cached on the same stream. When nothing cached
// fits, the engine grows: in expandable mode (the default) it maps physical pieces into the
// stream's region of the pool, recycling wholly free pieces from elsewhere before creating new
// ones (Note [Physical page recycling] in docs/notes/); in classic mode it creates a segment the
// way PyTorch's native allocator does. When the source refuses or the cap is reached it frees
// cached memory and retries; if that fails the result carries an OomInfo. Nothing throws.
//
// Graph capture and private pools (Note [Engine during graph capture],
// docs/notes/graph-pools.md): while set_capturing(true), the engine makes no call that waits for or
// asks about work on a stream; while set_holding(true), it never gives back, unmaps or moves the
// memory it holds. allocate_at() re-creates an allocation at a recorded address (PyTorch's
// cudagraph trees restore a pool's state that way).
//
// Arenas (the default, arenas:auto, and arenas:N for N > 1; docs/notes/thread-caches.md,
// "Arenas"): threads that keep finding the engine's lock taken get engines of their own, behind
// this same interface.
//
// Thread-safety: every member function may be called from any thread. One spin lock per engine
// guards the block structures and is held only briefly: observers run after it is released, and
// the slow calls (the source's reserve/create/map/unmap/destroy/release, stream synchronization)
// run without it, serialized by a second, sleeping growth mutex, while other threads keep
// allocating from and freeing into cached memory (Note [Engine locking],
// docs/notes/engine-locking.md). Lock order: growth mutex -> engine lock -> the source's and the
// stream events' own locks. empty_cache() waits (sleeping) for a growth or release in progress.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/alloc/config.h"
#include "gpumem/alloc/events.h"
#include "gpumem/alloc/introspection.h"
#include "gpumem/alloc/memory_source.h"
#include "gpumem/alloc/step_plan.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc {

namespace detail {
struct Arenas;
struct StepPlanning;
}

// The facts of a failed request.
struct OomInfo {
  std::size_t requested_bytes = 0;
  std::size_t rounded_bytes = 0;
  std::size_t allocated_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t cached_free_bytes = 0;
  std::size_t largest_free_extent_bytes = 0;
  std::size_t cap_bytes = kNoLimit;
  ProviderMemInfo provider;               // the provider's free/total at the time
  SourceStatus cause = SourceStatus::out_of_memory;  // why growing failed
  bool cap_reached = false;               // the cap, not the provider, refused the growth
  StreamId stream = 0;
  PoolKind pool = PoolKind::large;
  std::string detail;                     // the source's last_error(), if any
};

std::string describe(const OomInfo& oom);

// The OomInfo of a failed request, made on the failure path only: an empty OomDetail is one null
// pointer. (A std::optional<OomInfo> in every result cost about 22 instructions per allocate to
// construct, with its string, on a path that succeeds.) Reads like the optional it replaces:
// has_value(), *, ->, and it converts to std::optional<OomInfo>. Copies copy the facts.
class OomDetail {
 public:
  OomDetail() noexcept = default;
  OomDetail(const OomDetail& other) : info_(other.info_ ? std::make_unique<OomInfo>(*other.info_) : nullptr) {}
  OomDetail(OomDetail&&) noexcept = default;
  OomDetail& operator=(const OomDetail& other) {
    if (this != &other) info_ = other.info_ ? std::make_unique<OomInfo>(*other.info_) : nullptr;
    return *this;
  }
  OomDetail& operator=(OomDetail&&) noexcept = default;
  OomDetail& operator=(OomInfo info) {
    info_ = std::make_unique<OomInfo>(std::move(info));
    return *this;
  }
  ~OomDetail() = default;

  bool has_value() const noexcept { return info_ != nullptr; }
  explicit operator bool() const noexcept { return info_ != nullptr; }
  const OomInfo& operator*() const noexcept { return *info_; }
  OomInfo& operator*() noexcept { return *info_; }
  const OomInfo* operator->() const noexcept { return info_.get(); }
  OomInfo* operator->() noexcept { return info_.get(); }
  operator std::optional<OomInfo>() const { return info_ ? std::optional<OomInfo>(*info_) : std::nullopt; }

 private:
  std::unique_ptr<OomInfo> info_;
};

struct AllocResult {
  void* ptr = nullptr;           // null iff the request failed (or size 0)
  std::size_t size_bytes = 0;    // rounded size of the block
  OomDetail oom;                 // set iff the request failed
  bool ok() const noexcept { return !oom.has_value(); }
};

enum class FreeStatus : std::uint8_t {
  ok,
  null_pointer,      // free(nullptr): nothing to do (not an error)
  double_free,       // the pointer starts a block that is already free
  interior_pointer,  // the pointer lies inside an allocated block but is not its start
  foreign_pointer,   // the pointer is not in memory this engine manages
};

// One sentence naming the problem and the fix.
const char* describe(FreeStatus status) noexcept;

struct BlockLookup {
  std::uintptr_t block_addr = 0;
  std::size_t block_size_bytes = 0;
  std::size_t requested_bytes = 0;
  std::uintptr_t segment_base = 0;       // classic segment start / expandable region start
  std::size_t segment_size_bytes = 0;
  StreamId stream = 0;
  bool expandable = false;
};

// How often allocate() and free() took the engine's lock, and how often they found it taken
// (another thread held it). Thread caches come on at the first contended acquisition (in an arena,
// at the first wait of an allocation whose thread shares it with nowhere to move); with them on,
// calls served by a thread's cache take no engine lock and are not counted.
struct EngineLockCounts {
  std::uint64_t acquisitions = 0;
  std::uint64_t contended = 0;
};

struct ExpandableRegionSize {
  StreamId stream = 0;
  bool is_small_pool = false;
  std::size_t mapped_bytes = 0;
};

class CachingAllocator {
 public:
  // source and events must outlive the engine. device is reported in events and views.
  CachingAllocator(MemorySource& source, StreamEvents& events, Config config, int device = 0);
  ~CachingAllocator();  // releases everything it reserved (blocks still allocated are leaked to
                        // the user; their memory is returned to the source regardless)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  AllocResult allocate(std::size_t size_bytes, StreamId stream);
  FreeStatus free(void* ptr);
  // The block ptr starts is also used on stream; its reuse waits for work queued there now.
  FreeStatus record_stream(void* ptr, StreamId stream);
  // Releases all cached physical memory back to the source (after pending frees complete).
  void empty_cache();

  // Note [Engine during graph capture]. While a CUDA graph capture is underway, CUDA forbids
  // querying or synchronizing events and streams (and an event recorded on a capturing stream
  // cannot be queried at all). While capturing: frees that wait on other streams stay pending
  // (nothing is queried; the markers themselves are StreamEvents' business: the torch adapter's
  // defer recording them until the capture ends), growth creates new pieces instead of recycling
  // (recycling synchronizes the streams of the pieces that move), and nothing is released: the OOM
  // retry and garbage collection skip their release steps and empty_cache() does nothing.
  // set_capturing(true) waits for a growth or release in progress (it may be synchronizing) to
  // finish, so no wait is in flight when it returns. Thread-safe.
  void set_capturing(bool capturing);
  // While holding, the engine keeps every byte it has mapped where it is: no release (OOM retry,
  // garbage collection, empty_cache()), no recycling. empty_cache() still waits for pending frees
  // (unless capturing). A CUDA graph's private pool holds its memory while any graph that may
  // replay uses it: a replay writes the addresses the capture used, whether or not a block is
  // allocated there now. Thread-safe.
  void set_holding(bool holding);
  bool capturing() const noexcept;
  bool holding() const noexcept;

  // Allocates exactly [ptr, ptr + size_bytes), which must lie inside one free (mapped) block of
  // this engine; never grows, never waits. For restoring a recorded state: the block gets the
  // stream of the memory it lies in and requested_bytes as its request. size_bytes must be a
  // positive multiple of 512 and ptr 512-byte aligned. Returns ok, or foreign_pointer when the
  // range is not wholly free memory of this engine (nothing changes then).
  FreeStatus allocate_at(void* ptr, std::size_t size_bytes, std::size_t requested_bytes);

  // Config::step_plan: a training step starts here. The planner then takes its steps from these
  // marks instead of finding them (the first mark turns detection off). Without step_plan it does
  // nothing. Thread-safe.
  void mark_step();
  // The step planner's counters (Config::step_plan), or nullopt without it.
  std::optional<StepPlanCounters> step_plan_counters() const;
  // Of those, the arenas mapped so far (0 without step_plan): cheaper, for a reader of every call.
  std::uint64_t step_plan_arenas() const;

  // Caps reserved bytes at fraction x provider total (1.0 = no fraction cap).
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
  // Caps reserved bytes at an absolute number (0 = no absolute cap).
  void set_memory_limit(std::size_t bytes);

  void attach_observer(std::shared_ptr<AllocObserver> observer);
  void detach_observer(const AllocObserver* observer);

  EngineSnapshot snapshot();  // also emits a snapshot event
  EngineTotals totals() const;
  // Whether thread caches came on (EngineTotals::thread_caches_on), without the engine's lock or
  // stopping the caches: cheap enough for a stats read every step.
  bool thread_caches_on() const noexcept;
  // EngineLockCounts since the engine was made: two loads, no lock. With arenas, their sums.
  EngineLockCounts lock_counts() const noexcept;
  // The engines serving the device now: 1, or with arenas (engines_per_device(config()) > 1) the
  // arenas made so far. A load, no lock.
  unsigned arenas() const noexcept;
  // Times the churn allowance opened (Config::recycle_churn; 0 while it is off). With arenas, their
  // sum. A load, no lock.
  std::uint64_t churn_openings() const noexcept;
  std::optional<BlockLookup> lookup(const void* ptr) const;
  std::vector<ExpandableRegionSize> expandable_region_sizes() const;
  std::size_t largest_free_block_bytes() const;

  // Aborts with a description if any invariant of the engine's structures is broken.
  void check_invariants() const;

  const Config& config() const noexcept;
  MemorySource& source() noexcept;
  int device() const noexcept;

  // The rounded size a request of size_bytes gets (exposed for tests and replay).
  std::size_t round_size(std::size_t size_bytes) const noexcept;

  struct Impl;

 private:
  friend struct detail::Arenas;
  // One engine (engines_per_device(config) == 1: arenas:1), or null and the device's arenas
  // (allocator/src/arenas.h; the default, arenas:auto), to which every call then goes.
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<detail::Arenas> arenas_;
  // Config::step_plan: the planner and its lock (allocator/src/step_planning.cpp); null without.
  std::unique_ptr<detail::StepPlanning> planning_;
  friend struct detail::StepPlanning;
  AllocResult allocate_engine(std::size_t size_bytes, StreamId stream);
  // allocate_at; with a stream (a step plan's placement), completed pending frees are processed
  // first, the range must be free memory of that stream, and the search for it starts at the
  // hint's block when that is a block of the range's region on the right side of it.
  FreeStatus allocate_at_impl(void* ptr, std::size_t size_bytes, std::size_t requested_bytes,
                              std::optional<StreamId> stream, StepPlacementHint hint = {});
  FreeStatus free_engine(void* ptr);
  // A step plan's arena (one engine; with arenas, the first arena's while no thread has moved,
  // else none): a free range of size_bytes on `stream`, found or grown as an allocation's would
  // be, and left free; no alloc or free event, no counter, no OOM event (the program made no
  // request). Null if there is none.
  void* take_arena_range(std::size_t size_bytes, StreamId stream);
  AllocResult allocate_planned(std::size_t size_bytes, StreamId stream);
  void free_planned(void* ptr);
  [[gnu::noinline]] AllocResult allocate_through_planner(std::size_t size_bytes, StreamId stream);
  AllocResult allocate_while_recording(std::size_t size_bytes, StreamId stream);
  [[gnu::noinline]] void free_through_planner(void* ptr);
  // The engine allocate() and free() call while one engine serves every thread: impl_, or with
  // arenas the first arena's (until a second is made, its calls cost what one engine's cost).
  Impl* first_ = nullptr;
};

}  // namespace gpumem::alloc
