// The caching engine: mechanism. Decisions come from growth_policy.h; the data model and its
// invariants are described in block.h. See docs/notes/physical-page-recycling.md for the design.
#include "gpumem/alloc/caching_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "block.h"
#include "block_arena.h"
#include "event_batch.h"
#include "free_index.h"
#include "growth_policy.h"
#include "live_table.h"
#include "gpumem/alloc/spin_lock.h"
#include "thread_cache.h"

namespace gpumem::alloc {

using detail::Block;
using detail::BlockArena;
using detail::EventBatch;
using detail::FreeIndex;
using detail::ShardedLiveTable;
using detail::SpinLock;
using detail::ThreadCache;
using detail::PieceSlot;
using detail::Region;

const char* to_string(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::alloc: return "alloc";
    case EventKind::free_requested: return "free_requested";
    case EventKind::free_completed: return "free_completed";
    case EventKind::segment_alloc: return "segment_alloc";
    case EventKind::segment_free: return "segment_free";
    case EventKind::segment_map: return "segment_map";
    case EventKind::segment_unmap: return "segment_unmap";
    case EventKind::oom: return "oom";
    case EventKind::empty_cache: return "empty_cache";
    case EventKind::snapshot: return "snapshot";
  }
  return "unknown";
}

const char* to_string(BlockState state) noexcept {
  switch (state) {
    case BlockState::allocated: return "allocated";
    case BlockState::pending_free: return "pending_free";
    case BlockState::free: return "free";
    case BlockState::unmapped: return "unmapped";
    case BlockState::cached: return "cached";
  }
  return "unknown";
}

const char* describe(FreeStatus status) noexcept {
  switch (status) {
    case FreeStatus::ok: return "ok";
    case FreeStatus::null_pointer: return "free of a null pointer: nothing to do";
    case FreeStatus::double_free:
      return "double free: this pointer was already freed; free each allocation exactly once";
    case FreeStatus::interior_pointer:
      return "free of an interior pointer: the pointer lies inside an allocation but is not its start; "
             "pass the pointer that allocate() returned";
    case FreeStatus::foreign_pointer:
      return "free of a foreign pointer: this engine did not allocate it; free it with the allocator "
             "that allocated it";
  }
  return "unknown free status";
}

std::string describe(const OomInfo& oom) {
  auto mib = [](std::size_t b) { return static_cast<double>(b) / static_cast<double>(kMiB); };
  std::string cap = oom.cap_bytes == kNoLimit ? std::string("none") : fmt::format("{:.2f} MiB", mib(oom.cap_bytes));
  return fmt::format(
      "out of memory: tried to allocate {:.2f} MiB (requested {} bytes) on stream {:#x}; "
      "{:.2f} MiB allocated, {:.2f} MiB reserved ({:.2f} MiB cached free, largest free extent "
      "{:.2f} MiB); cap {}; provider free {:.2f} of {:.2f} MiB; cause: {}{}{}",
      mib(oom.rounded_bytes), oom.requested_bytes, oom.stream, mib(oom.allocated_bytes), mib(oom.reserved_bytes),
      mib(oom.cached_free_bytes), mib(oom.largest_free_extent_bytes), cap, mib(oom.provider.free_bytes),
      mib(oom.provider.total_bytes), oom.cap_reached ? "the memory cap" : to_string(oom.cause),
      oom.detail.empty() ? "" : " — ", oom.detail);
}

namespace {

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::size_t round_up(std::size_t n, std::size_t m) noexcept { return (n + m - 1) / m * m; }

struct AddrKeyLess {
  bool operator()(std::uintptr_t a, const Block& b) const noexcept { return a < b.addr; }
  bool operator()(const Block& b, std::uintptr_t a) const noexcept { return b.addr < a; }
};

[[noreturn]] void invariant_failed(const std::string& what) {
  std::fprintf(stderr, "gpumem: engine invariant broken: %s\n", what.c_str());
  std::abort();
}

// Why growing failed.
struct GrowFailure {
  SourceStatus status = SourceStatus::ok;
  bool cap_reached = false;
  std::string detail;
};

std::uint64_t next_engine_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// Live engines by id, so that a thread that exits can hand its caches back to engines that still
// exist. Never destroyed: threads may exit after static destructors ran.
struct EngineRegistry {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, CachingAllocator::Impl*> engines;
};
EngineRegistry& registry() {
  static auto* r = new EngineRegistry();
  return *r;
}

void retire_thread_cache(CachingAllocator::Impl* engine, ThreadCache* cache);

// A thread's caches, one per engine it allocated through (up to kSlots engines at once).
struct ThreadCaches {
  static constexpr int kSlots = 8;
  struct Slot {
    std::uint64_t engine_id = 0;
    ThreadCache* cache = nullptr;
  };
  Slot slots[kSlots];
  ~ThreadCaches() {
    EngineRegistry& reg = registry();
    std::lock_guard lock(reg.mutex);
    for (Slot& s : slots) {
      if (s.engine_id == 0) continue;
      auto it = reg.engines.find(s.engine_id);
      if (it != reg.engines.end()) retire_thread_cache(it->second, s.cache);
      s = Slot{};
    }
  }
};
thread_local ThreadCaches t_caches;

}  // namespace

struct CachingAllocator::Impl {
  Impl(MemorySource& s, StreamEvents& e, Config c, int dev)
      : source(s), events(e), config(std::move(c)), device(dev), caps(s.caps()) {
    expandable = config.expandable_segments && caps.virtual_memory;
    const std::size_t g = caps.granularity_bytes ? caps.granularity_bytes : policy::kMinBlockBytes;
    piece_bytes[0] = round_up(std::max(config.small_piece_bytes, g), g);
    piece_bytes[1] = round_up(std::max(config.large_segment_size_bytes, g), g);
    provider_total = s.mem_info().total_bytes;
    fraction = config.per_process_memory_fraction;
    limit_bytes = config.memory_limit_bytes;
    cap = policy::cap_bytes(fraction, limit_bytes, provider_total);
    std::size_t va = config.va_reserve_bytes;
    if (va == 0) va = provider_total + provider_total / 8;
    region_va_bytes[0] = round_up(std::max(va, piece_bytes[0]), piece_bytes[0]);
    region_va_bytes[1] = round_up(std::max(va, piece_bytes[1]), piece_bytes[1]);
  }

  MemorySource& source;
  StreamEvents& events;
  const Config config;
  const int device;
  const SourceCaps caps;
  bool expandable = true;
  std::size_t piece_bytes[2] = {};
  std::size_t region_va_bytes[2] = {};
  std::size_t provider_total = 0;

  mutable SpinLock mutex;  // see spin_lock.h: no futex round trip when contended briefly
  BlockArena arena;
  FreeIndex free_index[2];  // by PoolKind
  ShardedLiveTable live;
  std::map<std::uintptr_t, std::unique_ptr<Region>> regions;  // by base address
  std::vector<Block*> pending;                               // pending_free blocks

  // Counters the mechanism needs (caps, OOM facts). Observers do the accounting for users.
  std::size_t allocated_bytes = 0;
  std::size_t requested_bytes = 0;
  std::size_t pending_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t va_bytes = 0;
  double fraction = 1.0;
  std::size_t limit_bytes = 0;
  std::size_t cap = kNoLimit;
  std::uint64_t tick = 0;                   // engine order of changes (under the lock)
  std::atomic<std::uint64_t> event_seq{0};  // AllocEvent::seq (only while recording)

  // Observers: copy-on-write lists, never freed before the engine (a fast path may still be
  // publishing to an older one); has_observers is the one branch taken when there are none.
  using ObserverList = std::vector<std::shared_ptr<AllocObserver>>;
  std::atomic<bool> has_observers{false};
  std::vector<std::unique_ptr<ObserverList>> observer_lists{};
  std::atomic<const ObserverList*> observers{nullptr};

  // Thread caches of recently freed blocks (see thread_cache.h), owned here, one per thread
  // that allocated through this engine; `id` tells this engine apart in threads' lookup slots.
  const std::uint64_t id = next_engine_id();
  const bool thread_cache = config.thread_cache;
  const bool any_divisions = std::any_of(config.roundup_power2_divisions.begin(),
                                         config.roundup_power2_divisions.end(), [](auto d) { return d > 1; });
  // Thread caches turn on the first time a thread finds the engine's lock taken: a program that
  // never allocates from two threads at once keeps the engine's exact best-fit choices.
  std::atomic<bool> caches_active{false};

  // Takes the engine lock, noting contention.
  std::unique_lock<SpinLock> lock_noting_contention() {
    std::unique_lock<SpinLock> lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) {
      lock.lock();
      // Set under the lock: every later holder of the lock sees it and locks live-table shards,
      // and no fast path can run before that.
      if (thread_cache) caches_active.store(true, std::memory_order_relaxed);
    }
    return lock;
  }
  bool use_caches() const noexcept { return thread_cache && caches_active.load(std::memory_order_relaxed); }
  std::vector<std::unique_ptr<ThreadCache>> caches;

  // ---------------------------------------------------------------- events

  // Under the engine lock: advances the engine's tick and records the event. Returns the event's
  // seq (0 when nothing is recording).
  std::uint64_t emit(EventBatch& batch, EventKind kind, PoolKind pool, std::uintptr_t addr, std::size_t size,
                     std::size_t requested, StreamId stream, std::uint16_t pieces = 0) {
    ++tick;
    return record(batch, kind, pool, addr, size, requested, stream, pieces);
  }

  // Records an event without the engine lock (thread-cache fast paths).
  std::uint64_t record(EventBatch& batch, EventKind kind, PoolKind pool, std::uintptr_t addr, std::size_t size,
                       std::size_t requested, StreamId stream, std::uint16_t pieces = 0) {
    if (!batch.recording()) return 0;
    AllocEvent e;
    e.kind = kind;
    e.pool = pool;
    e.device = static_cast<std::int8_t>(device);
    e.pieces_created_or_destroyed = pieces;
    e.addr = addr;
    e.size_bytes = size;
    e.requested_bytes = requested;
    e.stream = stream;
    if (batch.needs() & kNeedsSequence) e.seq = event_seq.fetch_add(1, std::memory_order_relaxed) + 1;
    if (batch.needs() & kNeedsTimestamps) e.t_ns = now_ns();
    batch.push(e);
    return e.seq;
  }

  // An empty batch for one engine call: recording if anyone observes, with what they need.
  EventBatch new_batch() const noexcept {
    if (!has_observers.load(std::memory_order_relaxed)) return EventBatch(false, kNeedsNothing);
    unsigned needs = kNeedsNothing;
    if (const ObserverList* list = observers.load(std::memory_order_acquire))
      for (const auto& o : *list) needs |= o->needs();
    return EventBatch(true, needs);
  }

  // Returns the observers to publish to after unlocking (null if the batch is empty).
  const ObserverList* observers_for(const EventBatch& batch) const {
    if (batch.empty()) return nullptr;
    return observers.load(std::memory_order_acquire);
  }

  static void publish(const ObserverList* obs, const EventBatch& batch) {
    if (!obs) return;
    for (const auto& o : *obs) o->on_events(batch.view());
  }

  // ---------------------------------------------------------------- block surgery

  // Splits b at `at` (b.addr < at < b.end()): b keeps the front, the returned block the rest, with
  // the same state. An unmapped rest joins the region's unmapped set; a free b must not be in the
  // free index while it changes size (callers erase it first).
  Block* split_at(Block* b, std::uintptr_t at) {
    Block* rest = arena.make();
    rest->addr = at;
    rest->size_bytes = b->end() - at;
    rest->stream = b->stream;
    rest->region = b->region;
    rest->state = BlockState(b->state);
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size_bytes = at - b->addr;
    if (rest->state == BlockState::unmapped) b->region->unmapped.insert(*rest);
    return rest;
  }

  // Absorbs b->next into b (both out of any container) and disposes of it.
  void absorb_next(Block* b) {
    Block* n = b->next;
    b->size_bytes += n->size_bytes;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    arena.dispose(n);
  }

  // b is free and in no container: merges it with free neighbours and inserts the result into the
  // free index. Returns the merged block.
  Block* insert_free_merged(Block* b) {
    FreeIndex& idx = free_index[static_cast<int>(b->region->pool)];
    Block* p = b->prev && b->prev->state == BlockState::free ? b->prev : nullptr;
    Block* n = b->next && b->next->state == BlockState::free ? b->next : nullptr;
    if (p) {
      // p grows over b (and n): it keeps its node, moved only if its rank changed.
      const std::size_t old = p->size_bytes;
      if (n) idx.erase(*n);
      absorb_next(p);
      if (n) absorb_next(p);
      p->free_seq = tick;
      idx.resized(*p, old);
      return p;
    }
    b->free_seq = tick;
    if (n) {
      // b takes n's node.
      const std::size_t old = n->size_bytes;
      b->size_bytes += old;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      idx.replace(*n, old, *b);
      arena.dispose(n);
      return b;
    }
    idx.insert(*b);
    return b;
  }

  // b is unmapped and in no container: merges it with unmapped neighbours and inserts the result
  // into the region's unmapped set.
  void insert_unmapped_merged(Block* b) {
    Region& r = *b->region;
    if (b->prev && b->prev->state == BlockState::unmapped) {
      Block* p = b->prev;
      r.unmapped.erase(r.unmapped.iterator_to(*p));
      absorb_next(p);
      b = p;
    }
    if (b->next && b->next->state == BlockState::unmapped) {
      r.unmapped.erase(r.unmapped.iterator_to(*b->next));
      absorb_next(b);
    }
    r.unmapped.insert(*b);
  }

  // b is free and out of the free index; cuts [addr, addr + size) out of it and returns that
  // block. The remainders go back to the free index.
  Block* carve(Block* b, std::uintptr_t addr, std::size_t size) {
    FreeIndex& idx = free_index[static_cast<int>(b->region->pool)];
    if (addr > b->addr) {
      Block* mid = split_at(b, addr);
      b->free_seq = tick;
      idx.insert(*b);
      b = mid;
    }
    if (b->size_bytes > size) {
      Block* rest = split_at(b, b->addr + size);
      rest->free_seq = tick;
      idx.insert(*rest);
    }
    return b;
  }

  // Hands out b (free, out of the free index) for a request of `rounded`, splitting off the rest
  // when the policy says so.
  Block* take_front(Block* b, std::size_t rounded) {
    const bool split = policy::should_split(b->region->expandable, b->region->pool, b->size_bytes, rounded,
                                            config.max_split_size_bytes);
    if (split) return carve(b, b->addr, rounded);
    return b;
  }

  // ---------------------------------------------------------------- the fast path

  Block* take_cached(PoolKind pool, StreamId stream, std::size_t rounded) {
    FreeIndex& idx = free_index[static_cast<int>(pool)];
    auto it = idx.best_fit(stream, rounded);
    if (it == idx.end()) return nullptr;
    Block* b = &*it;
    if (!b->region->expandable &&
        !policy::accept_cached_classic(b->size_bytes, rounded, config.max_split_size_bytes,
                                       config.max_non_split_rounding_bytes))
      return nullptr;
    if (!policy::should_split(b->region->expandable, pool, b->size_bytes, rounded, config.max_split_size_bytes)) {
      idx.erase(*b);
      return b;
    }
    // The rest takes b's node in the index.
    const std::size_t old = b->size_bytes;
    Block* rest = split_at(b, b->addr + rounded);
    rest->free_seq = tick;
    idx.replace(*b, old, *rest);
    return b;
  }

  // ---------------------------------------------------------------- regions

  Region* new_region(PoolKind pool, StreamId stream, bool expandable_region, std::size_t size,
                     EventBatch& batch, GrowFailure& fail) {
    // Expandable regions are aligned to a power of two at least a piece (sources take only powers
    // of two); slots are counted from the region's base, so any alignment would be correct.
    auto reserved =
        source.reserve(size, expandable_region ? std::bit_ceil(piece_bytes[static_cast<int>(pool)]) : 0);
    if (!reserved.ok()) {
      fail.status = reserved.status;
      fail.detail = source.last_error();
      return nullptr;
    }
    auto r = std::make_unique<Region>();
    r->va = reserved.value;
    r->pool = pool;
    r->stream = stream;
    r->expandable = expandable_region;
    r->created_seq = tick + 1;
    Block* b = arena.make();
    b->addr = r->va.base;
    b->size_bytes = r->va.size_bytes;
    b->stream = stream;
    b->region = r.get();
    r->first = b;
    if (expandable_region) {
      r->piece_bytes = piece_bytes[static_cast<int>(pool)];
      r->slots.resize(r->va.size_bytes / r->piece_bytes);
      b->state = BlockState::unmapped;
      r->unmapped.insert(*b);
    } else {
      r->piece_bytes = r->va.size_bytes;
      if (caps.virtual_memory) {
        auto h = source.create(size);
        if (!h.ok()) {
          fail.status = h.status;
          fail.detail = source.last_error();
          arena.dispose(b);
          source.release(r->va);
          return nullptr;
        }
        SourceStatus st = source.map(r->va.base, size, h.value);
        if (st != SourceStatus::ok) {
          fail.status = st;
          fail.detail = source.last_error();
          source.destroy(h.value);
          arena.dispose(b);
          source.release(r->va);
          return nullptr;
        }
        r->slots.push_back(PieceSlot{h.value, true});
      } else {
        r->backed_by_reservation = true;
      }
      r->mapped_bytes = size;
      reserved_bytes += size;
      b->state = BlockState::free;  // the caller carves from it; it is in no container yet
      emit(batch, EventKind::segment_alloc, pool, r->va.base, size, 0, stream, 1);
    }
    va_bytes += r->va.size_bytes;
    Region* raw = r.get();
    regions.emplace(raw->va.base, std::move(r));
    return raw;
  }

  // Gives a region's address space (and, for a classic segment, its memory) back. The region must
  // hold nothing but one free block (classic) or one unmapped block (expandable).
  void drop_region(Region* r, EventBatch& batch) {
    Block* b = r->first;
    if (r->expandable) {
      r->unmapped.erase(r->unmapped.iterator_to(*b));
    } else {
      free_index[static_cast<int>(r->pool)].erase(*b);
      if (!r->backed_by_reservation) {
        source.unmap(r->va.base, r->va.size_bytes);
        source.destroy(r->slots[0].handle);
      }
      reserved_bytes -= r->va.size_bytes;
      emit(batch, EventKind::segment_free, r->pool, r->va.base, r->va.size_bytes, 0, r->stream, 1);
    }
    arena.dispose(b);
    source.release(r->va);
    va_bytes -= r->va.size_bytes;
    regions.erase(r->va.base);
  }

  // ---------------------------------------------------------------- expandable growth

  struct Placement {
    Region* region = nullptr;
    std::uintptr_t addr = 0;
    std::size_t need = 0;  // unmapped slots in [addr, addr + size)
    std::size_t hole = 0;  // size of the run of free and unmapped blocks it lies in
  };

  static std::size_t unmapped_slots_in(const Region& r, std::uintptr_t addr, std::size_t size) {
    std::size_t n = 0;
    const std::size_t first = r.slot_of(addr), last = r.slot_of(addr + size - 1);
    for (std::size_t s = first; s <= last; ++s) n += r.slots[s].mapped ? 0 : 1;
    return n;
  }

  static bool is_hole_state(const Block* b) {
    return b && (b->state == BlockState::free || b->state == BlockState::unmapped);
  }

  // The placement of `size` bytes needing the fewest new pieces: in a run of free and unmapped
  // blocks ("hole") of a region of (pool, stream), at either end of the hole. Lowest address wins
  // ties, which keeps regions compact.
  Placement find_placement(PoolKind pool, StreamId stream, std::size_t size) {
    Placement best;
    for (auto& [base, rp] : regions) {
      Region& r = *rp;
      if (!r.expandable || r.pool != pool || r.stream != stream) continue;
      std::uintptr_t last_hole_end = 0;
      for (Block& u : r.unmapped) {
        if (u.addr < last_hole_end) continue;
        const Block* lo = &u;
        while (is_hole_state(lo->prev)) lo = lo->prev;
        const Block* hi = &u;
        while (is_hole_state(hi->next)) hi = hi->next;
        last_hole_end = hi->end();
        const std::size_t hole = hi->end() - lo->addr;
        if (hole < size) continue;
        const std::uintptr_t candidates[2] = {lo->addr, (hi->end() - size) & ~(policy::kMinBlockBytes - 1)};
        for (std::uintptr_t addr : candidates) {
          if (addr < lo->addr) continue;
          const std::size_t need = unmapped_slots_in(r, addr, size);
          if (!best.region || need < best.need ||
              (need == best.need && (hole < best.hole || (hole == best.hole && addr < best.addr))))
            best = {&r, addr, need, hole};
        }
      }
    }
    return best;
  }

  // A free block of the pool holding a whole slot outside [ex_lo, ex_hi): the smallest such block,
  // and the highest such slot in it. Returns {nullptr, 0} if none.
  std::pair<Block*, std::size_t> find_recyclable(PoolKind pool, std::uintptr_t ex_lo, std::uintptr_t ex_hi) {
    const std::size_t piece = piece_bytes[static_cast<int>(pool)];
    Block* best = nullptr;
    std::size_t best_slot = 0;
    for (Block& b : free_index[static_cast<int>(pool)].blocks()) {
      if (b.size_bytes < piece || !b.region->expandable) continue;
      if (best && b.size_bytes >= best->size_bytes) continue;
      const Region& r = *b.region;
      const std::uintptr_t lo = r.va.base + round_up(b.addr - r.va.base, piece);
      std::uintptr_t hi = r.va.base + (b.end() - r.va.base) / piece * piece;  // exclusive
      while (hi >= lo + piece) {
        const std::uintptr_t s = hi - piece;
        if (s + piece <= ex_lo || s >= ex_hi) {
          best = &b;
          best_slot = r.slot_of(s);
          break;
        }
        hi = s;
      }
    }
    return {best, best_slot};
  }

  std::size_t count_recyclable(PoolKind pool, std::uintptr_t ex_lo, std::uintptr_t ex_hi, std::size_t limit) {
    const std::size_t piece = piece_bytes[static_cast<int>(pool)];
    std::size_t n = 0;
    for (Block& b : free_index[static_cast<int>(pool)].blocks()) {
      if (b.size_bytes < piece || !b.region->expandable) continue;
      const Region& r = *b.region;
      const std::uintptr_t lo = r.va.base + round_up(b.addr - r.va.base, piece);
      const std::uintptr_t hi = r.va.base + (b.end() - r.va.base) / piece * piece;
      for (std::uintptr_t s = lo; s + piece <= hi; s += piece) {
        if (s + piece <= ex_lo || s >= ex_hi) ++n;
        if (n >= limit) return n;
      }
    }
    return n;
  }

  // Unmaps the slot of free block b (out of nothing: b is in the free index) and returns its
  // handle; the slot becomes an unmapped block. The caller made sure work on the region's stream
  // that touched the slot has completed. destroy_piece also destroys the handle (returns 0).
  SourceResult<PhysHandle> unmap_slot(Block* b, std::size_t slot, bool destroy_piece, EventBatch& batch) {
    Region& r = *b->region;
    const std::uintptr_t sa = r.slot_addr(slot);
    PieceSlot& ps = r.slots[slot];
    SourceStatus st = source.unmap(sa, r.piece_bytes);
    if (st != SourceStatus::ok) return {st, 0};
    FreeIndex& idx = free_index[static_cast<int>(r.pool)];
    idx.erase(*b);
    Block* mid = b;
    if (sa > b->addr) {
      mid = split_at(b, sa);
      b->free_seq = tick;
      idx.insert(*b);
    }
    if (mid->end() > sa + r.piece_bytes) {
      Block* rest = split_at(mid, sa + r.piece_bytes);
      rest->free_seq = tick;
      idx.insert(*rest);
    }
    mid->state = BlockState::unmapped;
    insert_unmapped_merged(mid);
    PhysHandle h = ps.handle;
    ps = PieceSlot{};
    r.mapped_bytes -= r.piece_bytes;
    if (destroy_piece) {
      source.destroy(h);
      reserved_bytes -= r.piece_bytes;
      h = 0;
    }
    emit(batch, EventKind::segment_unmap, r.pool, sa, r.piece_bytes, 0, r.stream, destroy_piece ? 1 : 0);
    return {SourceStatus::ok, h};
  }

  // Maps handle h at unmapped slot `slot` of r; the slot becomes free memory merged with its free
  // neighbours. Returns the merged free block (in the free index).
  Block* map_slot(Region& r, std::size_t slot, PhysHandle h, bool created, EventBatch& batch, SourceStatus& st) {
    const std::uintptr_t sa = r.slot_addr(slot);
    st = source.map(sa, r.piece_bytes, h);
    if (st != SourceStatus::ok) return nullptr;
    auto it = r.unmapped.upper_bound(sa, AddrKeyLess{});
    --it;
    Block* u = &*it;
    r.unmapped.erase(it);
    if (sa > u->addr) {
      Block* mid = split_at(u, sa);  // rest (mid) is inserted into the unmapped set
      r.unmapped.insert(*u);
      r.unmapped.erase(r.unmapped.iterator_to(*mid));
      u = mid;
    }
    if (u->end() > sa + r.piece_bytes) split_at(u, sa + r.piece_bytes);  // the tail stays unmapped
    u->state = BlockState::free;
    r.slots[slot] = PieceSlot{h, true};
    r.mapped_bytes += r.piece_bytes;
    emit(batch, EventKind::segment_map, r.pool, sa, r.piece_bytes, 0, r.stream, created ? 1 : 0);
    return insert_free_merged(u);
  }

  Block* grow_expandable(PoolKind pool, StreamId stream, std::size_t rounded, EventBatch& batch,
                         GrowFailure& fail) {
    const std::size_t piece = piece_bytes[static_cast<int>(pool)];
    Placement p = find_placement(pool, stream, rounded);
    if (!p.region) {
      if (rounded > region_va_bytes[static_cast<int>(pool)]) {
        fail.status = SourceStatus::out_of_memory;
        fail.detail = fmt::format("the request is larger than the address space of a region ({} bytes)",
                                  region_va_bytes[static_cast<int>(pool)]);
        return nullptr;
      }
      Region* r = new_region(pool, stream, true, region_va_bytes[static_cast<int>(pool)], batch, fail);
      if (!r) return nullptr;
      p = {r, r->va.base, round_up(rounded, piece) / piece, r->va.size_bytes};
    }
    const std::uintptr_t ex_lo = p.addr, ex_hi = p.addr + rounded;
    policy::GrowthInputs in;
    in.pieces_needed = p.need;
    in.pieces_recyclable = config.recycle ? count_recyclable(pool, ex_lo, ex_hi, p.need) : 0;
    in.piece_bytes = piece;
    in.reserved_bytes = reserved_bytes;
    in.cap_bytes = cap;
    in.recycle_enabled = config.recycle;
    const policy::GrowthPlan plan = policy::plan_growth(in);
    if (plan.over_cap) {
      fail.cap_reached = true;
      fail.status = SourceStatus::out_of_memory;
      return nullptr;
    }
    // Create first: if the provider refuses, nothing has moved yet.
    std::vector<std::pair<PhysHandle, bool>> handles;  // (handle, created)
    handles.reserve(p.need);
    for (std::size_t i = 0; i < plan.create; ++i) {
      auto h = source.create(piece);
      if (!h.ok()) {
        fail.status = h.status;
        fail.detail = source.last_error();
        for (auto& [hh, created] : handles) source.destroy(hh);
        reserved_bytes -= handles.size() * piece;
        return nullptr;
      }
      handles.emplace_back(h.value, true);
      reserved_bytes += piece;
    }
    std::vector<StreamId> synced;
    for (std::size_t i = 0; i < plan.recycle; ++i) {
      auto [b, slot] = find_recyclable(pool, ex_lo, ex_hi);
      if (!b) break;  // cannot happen: counted above under the same lock
      if (std::find(synced.begin(), synced.end(), b->region->stream) == synced.end()) {
        events.synchronize_stream(b->region->stream);
        synced.push_back(b->region->stream);
      }
      auto h = unmap_slot(b, slot, false, batch);
      if (!h.ok()) {
        fail.status = h.status;
        fail.detail = source.last_error();
        break;
      }
      handles.emplace_back(h.value, false);
    }
    if (handles.size() < p.need) {
      // A recycled unmap failed: give back what we hold; the structure is consistent.
      for (auto& [h, created] : handles) source.destroy(h);
      reserved_bytes -= handles.size() * piece;
      if (fail.status == SourceStatus::ok) fail.status = SourceStatus::driver_error;
      return nullptr;
    }
    Region& r = *p.region;
    Block* merged = nullptr;
    const std::size_t first = r.slot_of(ex_lo), last = r.slot_of(ex_hi - 1);
    std::size_t used = 0;
    for (std::size_t s = first; s <= last; ++s) {
      if (r.slots[s].mapped) continue;
      auto [h, created] = handles[used++];
      SourceStatus st;
      merged = map_slot(r, s, h, created, batch, st);
      if (!merged) {
        fail.status = st;
        fail.detail = source.last_error();
        for (std::size_t i = used - 1; i < handles.size(); ++i) source.destroy(handles[i].first);
        reserved_bytes -= (handles.size() - (used - 1)) * piece;
        return nullptr;
      }
    }
    if (!merged) {
      // Nothing needed mapping (the fast path normally finds such a range): find its block.
      for (Block* x = r.first; x; x = x->next)
        if (x->addr <= ex_lo && ex_hi <= x->end()) {
          merged = x;
          break;
        }
      if (!merged || merged->state != BlockState::free) invariant_failed("growth placement is not free memory");
    }
    // Every slot of [ex_lo, ex_hi) is mapped and free now: one free block holds the range.
    FreeIndex& idx = free_index[static_cast<int>(pool)];
    idx.erase(*merged);
    return carve(merged, ex_lo, rounded);
  }

  // ---------------------------------------------------------------- classic growth

  Block* grow_classic(PoolKind pool, StreamId stream, std::size_t rounded, EventBatch& batch, GrowFailure& fail) {
    const std::size_t seg =
        policy::classic_segment_bytes(rounded, config.large_segment_size_bytes, caps.granularity_bytes);
    if (cap != kNoLimit && (reserved_bytes > cap || seg > cap - reserved_bytes)) {
      fail.cap_reached = true;
      fail.status = SourceStatus::out_of_memory;
      return nullptr;
    }
    Region* r = new_region(pool, stream, false, seg, batch, fail);
    if (!r) return nullptr;
    return take_front(r->first, rounded);
  }

  Block* grow(PoolKind pool, StreamId stream, std::size_t rounded, EventBatch& batch, GrowFailure& fail) {
    fail = {};
    return expandable ? grow_expandable(pool, stream, rounded, batch, fail)
                      : grow_classic(pool, stream, rounded, batch, fail);
  }

  // ---------------------------------------------------------------- freeing and releasing

  void complete_free(Block* b, EventBatch& batch) {
    live.erase(*b, use_caches());
    b->uses.reset();
    b->state = BlockState::free;
    emit(batch, EventKind::free_completed, b->region->pool, b->addr, b->size_bytes, b->requested_bytes, b->stream);
    b->requested_bytes = 0;
    insert_free_merged(b);
  }

  // Frees pending blocks whose markers have all completed (synchronize: wait for them).
  void process_pending(EventBatch& batch, bool synchronize) {
    for (std::size_t i = 0; i < pending.size();) {
      Block* b = pending[i];
      bool done = true;
      for (EventToken t : b->uses->markers) {
        if (synchronize) events.synchronize(t);
        if (!events.query(t)) {
          done = false;
          break;
        }
      }
      if (!done) {
        ++i;
        continue;
      }
      for (EventToken t : b->uses->markers) events.release(t);
      pending[i] = pending.back();
      pending.pop_back();
      pending_bytes -= b->size_bytes;
      complete_free(b, batch);
    }
  }

  // Releases all cached physical memory: unmaps and destroys every wholly free piece, frees every
  // wholly free classic segment and every region left without mapped memory. Returns bytes released.
  std::size_t release_cached(EventBatch& batch) {
    {
      WorldStop stop(*this);
      stop.drain();
    }
    process_pending(batch, true);
    const std::size_t before = reserved_bytes;
    std::vector<StreamId> synced;
    for (int pool = 0; pool < 2; ++pool) {
      // Collect first: releasing changes the index.
      std::vector<Block*> candidates;
      for (Block& b : free_index[pool].blocks()) candidates.push_back(&b);
      for (Block* b : candidates) {
        Region& r = *b->region;
        if (r.expandable) {
          if (std::find(synced.begin(), synced.end(), r.stream) == synced.end()) {
            events.synchronize_stream(r.stream);
            synced.push_back(r.stream);
          }
          // Unmap whole slots from the highest down: b keeps the part below each unmapped slot, so
          // it stays the block holding the next one.
          const std::uintptr_t lo = r.va.base + round_up(b->addr - r.va.base, r.piece_bytes);
          const std::uintptr_t hi = r.va.base + (b->end() - r.va.base) / r.piece_bytes * r.piece_bytes;
          for (std::uintptr_t s = hi; s >= lo + r.piece_bytes; s -= r.piece_bytes)
            if (!unmap_slot(b, r.slot_of(s - r.piece_bytes), true, batch).ok()) break;
        } else if (b->prev == nullptr && b->next == nullptr) {
          if (std::find(synced.begin(), synced.end(), r.stream) == synced.end()) {
            events.synchronize_stream(r.stream);
            synced.push_back(r.stream);
          }
          drop_region(&r, batch);
        }
      }
    }
    // Expandable regions with nothing mapped give their address space back.
    std::vector<Region*> empty;
    for (auto& [base, r] : regions)
      if (r->expandable && r->mapped_bytes == 0 && r->first->next == nullptr) empty.push_back(r.get());
    for (Region* r : empty) drop_region(r, batch);
    return before - reserved_bytes;
  }

  // garbage_collection_threshold on classic segments: frees wholly free segments, least recently
  // used first, until reserved is back under the threshold.
  void collect_garbage(EventBatch& batch) {
    std::vector<Block*> unsplit;
    for (Block& b : free_index[static_cast<int>(PoolKind::large)].blocks())
      if (!b.region->expandable && !b.prev && !b.next) unsplit.push_back(&b);
    std::sort(unsplit.begin(), unsplit.end(), [](Block* a, Block* b) { return a->free_seq < b->free_seq; });
    for (Block* b : unsplit) {
      if (!policy::should_collect_garbage(config.garbage_collection_threshold, reserved_bytes, cap)) break;
      events.synchronize_stream(b->region->stream);
      drop_region(b->region, batch);
    }
  }

  // ---------------------------------------------------------------- queries

  // Why addr is not a pointer this engine can free (engine lock held).
  FreeStatus classify_bad_pointer_locked(std::uintptr_t addr) {
    if (const Block* b = live.find(addr, use_caches())) {
      (void)b;  // pending_free or cached: freed already
      return FreeStatus::double_free;
    }
    auto it = regions.upper_bound(addr);
    if (it == regions.begin()) return FreeStatus::foreign_pointer;
    --it;
    const Region& r = *it->second;
    if (!r.va.contains(addr)) return FreeStatus::foreign_pointer;
    for (const Block* x = r.first; x; x = x->next) {
      if (addr < x->addr || addr >= x->end()) continue;
      if (x->state == BlockState::allocated || x->state == BlockState::pending_free) return FreeStatus::interior_pointer;
      return x->addr == addr ? FreeStatus::double_free : FreeStatus::foreign_pointer;
    }
    return FreeStatus::foreign_pointer;
  }

  std::size_t largest_free_locked() const {
    std::size_t m = 0;
    for (int pool = 0; pool < 2; ++pool)
      for (const Block& b : free_index[pool].blocks()) m = std::max(m, b.size_bytes);
    return m;
  }

  OomInfo make_oom(std::size_t size, std::size_t rounded, StreamId stream, PoolKind pool, const GrowFailure& f) {
    OomInfo o;
    o.requested_bytes = size;
    o.rounded_bytes = rounded;
    o.allocated_bytes = allocated_bytes;
    o.reserved_bytes = reserved_bytes;
    o.cached_free_bytes = free_index[0].bytes() + free_index[1].bytes();
    o.largest_free_extent_bytes = largest_free_locked();
    o.cap_bytes = cap;
    o.provider = source.mem_info();
    o.cause = f.status == SourceStatus::ok ? SourceStatus::out_of_memory : f.status;
    o.cap_reached = f.cap_reached;
    o.stream = stream;
    o.pool = pool;
    o.detail = f.detail;
    return o;
  }

  // ---------------------------------------------------------------- invariants

  void check_locked() const {
    std::size_t live_count = 0, reserved = 0, alloc = 0, free_count[2] = {0, 0}, cached_count = 0;
    std::size_t va = 0;
    for (const auto& [base, rp] : regions) {
      const Region& r = *rp;
      if (base != r.va.base) invariant_failed("region keyed by the wrong base");
      va += r.va.size_bytes;
      std::uintptr_t at = r.va.base;
      std::size_t mapped_slots = 0;
      for (const PieceSlot& s : r.slots) mapped_slots += s.mapped ? 1 : 0;
      const std::size_t mapped = r.expandable ? mapped_slots * r.piece_bytes : r.va.size_bytes;
      if (mapped != r.mapped_bytes) invariant_failed(fmt::format("region {:#x}: mapped_bytes {} != {}", base, r.mapped_bytes, mapped));
      reserved += mapped;
      std::size_t unmapped_blocks = 0;
      const Block* prev = nullptr;
      for (const Block* b = r.first; b; prev = b, b = b->next) {
        if (b->addr != at) invariant_failed(fmt::format("region {:#x}: gap or overlap at {:#x}", base, at));
        if (b->prev != prev) invariant_failed(fmt::format("block {:#x}: prev link broken", b->addr));
        if (b->region != &r || b->stream != r.stream) invariant_failed(fmt::format("block {:#x}: wrong region or stream", b->addr));
        if (b->size_bytes == 0 || b->size_bytes % policy::kMinBlockBytes)
          invariant_failed(fmt::format("block {:#x}: size {} not a positive multiple of 512", b->addr, b->size_bytes));
        if (prev && prev->state == b->state && (b->state == BlockState::free || b->state == BlockState::unmapped))
          invariant_failed(fmt::format("block {:#x}: neighbouring {} blocks not merged", b->addr, to_string(b->state)));
        if (r.expandable) {
          const std::size_t s0 = r.slot_of(b->addr), s1 = r.slot_of(b->end() - 1);
          if (b->state == BlockState::unmapped) {
            if ((b->addr - r.va.base) % r.piece_bytes || b->size_bytes % r.piece_bytes)
              invariant_failed(fmt::format("unmapped block {:#x} not slot-aligned", b->addr));
            for (std::size_t s = s0; s <= s1; ++s)
              if (r.slots[s].mapped) invariant_failed(fmt::format("unmapped block {:#x} covers a mapped slot", b->addr));
          } else {
            for (std::size_t s = s0; s <= s1; ++s)
              if (!r.slots[s].mapped)
                invariant_failed(fmt::format("{} block {:#x} covers an unmapped slot", to_string(b->state), b->addr));
          }
        } else if (b->state == BlockState::unmapped) {
          invariant_failed(fmt::format("classic segment {:#x} holds an unmapped block", base));
        }
        switch (b->state) {
          case BlockState::free:
            if (!free_index[static_cast<int>(r.pool)].contains(*b))
              invariant_failed(fmt::format("free block {:#x} missing from the free index", b->addr));
            ++free_count[static_cast<int>(r.pool)];
            break;
          case BlockState::unmapped:
            ++unmapped_blocks;
            if (r.unmapped.find(*b) == r.unmapped.end()) invariant_failed(fmt::format("unmapped block {:#x} not in the unmapped set", b->addr));
            break;
          case BlockState::allocated:
          case BlockState::pending_free:
            if (live.find_unlocked(b->addr) != b) invariant_failed(fmt::format("live block {:#x} missing from the live table", b->addr));
            ++live_count;
            if (b->state == BlockState::allocated) alloc += b->size_bytes;
            break;
          case BlockState::cached:
            if (live.find_unlocked(b->addr) != b) invariant_failed(fmt::format("cached block {:#x} missing from the live table", b->addr));
            ++live_count;
            ++cached_count;
            break;
        }
        at = b->end();
      }
      if (at != r.va.end()) invariant_failed(fmt::format("region {:#x}: blocks end at {:#x}, not {:#x}", base, at, r.va.end()));
      if (unmapped_blocks != r.unmapped.size()) invariant_failed(fmt::format("region {:#x}: unmapped set size", base));
    }
    if (live_count != live.size_unlocked()) invariant_failed("live table holds blocks that are not live");
    std::size_t in_bins = 0;
    std::int64_t alloc_delta = 0;
    for (const auto& tc : caches) {
      std::size_t bytes = 0;
      for (const auto& bin : tc->bins)
        for (int i = 0; i < bin.count; ++i) {
          const Block* b = bin.blocks[i];
          if (b->state != BlockState::cached || b->stream != bin.stream || b->size_bytes != bin.size_bytes)
            invariant_failed(fmt::format("thread cache holds block {:#x} that does not belong there", b->addr));
          bytes += b->size_bytes;
          ++in_bins;
        }
      if (bytes != tc->cached_bytes) invariant_failed("thread cache cached_bytes out of step");
      alloc_delta += tc->allocated_delta;
    }
    if (in_bins != cached_count) invariant_failed("cached blocks and thread-cache bins disagree");
    for (int pool = 0; pool < 2; ++pool) {
      if (free_count[pool] != free_index[pool].size()) invariant_failed("free index holds blocks that are not free");
      if (!free_index[pool].check_order()) invariant_failed("free index out of order or its byte count out of step");
    }
    if (reserved != reserved_bytes) invariant_failed(fmt::format("reserved_bytes {} != mapped {}", reserved_bytes, reserved));
    if (alloc != allocated_bytes + static_cast<std::size_t>(alloc_delta))
      invariant_failed(fmt::format("allocated_bytes {} + thread-cache deltas {} != {}", allocated_bytes, alloc_delta, alloc));
    if (va != va_bytes) invariant_failed("va_bytes out of step");
    std::size_t pend = 0;
    for (const Block* b : pending) {
      if (b->state != BlockState::pending_free || !b->uses) invariant_failed("pending list holds a block not pending");
      pend += b->size_bytes;
    }
    if (pend != pending_bytes) invariant_failed("pending_bytes out of step");
  }

  void maybe_check() {
    if (config.check_invariants) [[unlikely]] check_now();
  }
  [[gnu::noinline]] void check_now() {
    WorldStop stop(*this);
    check_locked();
  }

  // ---------------------------------------------------------------- thread caches

  // This thread's cache for this engine; creates it (under the engine's lock) if `create`.
  ThreadCache* cache_for_this_thread(bool create) {
    ThreadCaches::Slot* free_slot = nullptr;
    for (auto& slot : t_caches.slots) {
      if (slot.engine_id == id) return slot.cache;
      if (slot.engine_id == 0 && !free_slot) free_slot = &slot;
    }
    if (!create) return nullptr;
    if (!free_slot) {
      // Reuse a slot of an engine that no longer exists.
      EngineRegistry& reg = registry();
      std::lock_guard lock(reg.mutex);
      for (auto& slot : t_caches.slots)
        if (!reg.engines.count(slot.engine_id)) {
          free_slot = &slot;
          break;
        }
      if (!free_slot) return nullptr;
    }
    auto tc = std::make_unique<ThreadCache>();
    ThreadCache* raw = tc.get();
    {
      std::lock_guard lock(mutex);
      caches.push_back(std::move(tc));
    }
    *free_slot = {id, raw};
    return raw;
  }

  // Returns a cache's blocks to the engine and folds its counters in. Engine lock and the
  // cache's lock held.
  void drain_locked(ThreadCache& tc) {
    allocated_bytes += static_cast<std::size_t>(tc.allocated_delta);
    requested_bytes += static_cast<std::size_t>(tc.requested_delta);
    tc.allocated_delta = tc.requested_delta = 0;
    if (tc.cached_bytes == 0) return;
    for (auto& bin : tc.bins) {
      for (int i = 0; i < bin.count; ++i) {
        Block* b = bin.blocks[i];
        live.erase(*b, true);
        b->state = BlockState::free;
        b->requested_bytes = 0;
        insert_free_merged(b);
      }
      bin.count = 0;
    }
    tc.cached_bytes = 0;
  }

  // Drains the calling thread's cache (engine lock held). Returns whether it held blocks.
  bool drain_own_cache_locked() {
    ThreadCache* tc = use_caches() ? cache_for_this_thread(false) : nullptr;
    if (!tc) return false;
    std::lock_guard lock(tc->lock);
    const bool had = tc->cached_bytes > 0;
    drain_locked(*tc);
    return had;
  }

  // Holds every thread cache's lock (engine lock held), so no fast path runs; drain() empties them.
  struct WorldStop {
    explicit WorldStop(Impl& m) : m(m) {
      for (auto& tc : m.caches) tc->lock.lock();
    }
    ~WorldStop() {
      for (auto& tc : m.caches) tc->lock.unlock();
    }
    void drain() {
      for (auto& tc : m.caches) m.drain_locked(*tc);
    }
    Impl& m;
  };

  // ---------------------------------------------------------------- teardown

  void release_all() {
    for (auto& [base, rp] : regions) {
      Region& r = *rp;
      if (r.unmapped.size()) r.unmapped.clear();
      for (std::size_t s = 0; s < r.slots.size(); ++s) {
        if (!r.slots[s].mapped) continue;
        const std::size_t sz = r.expandable ? r.piece_bytes : r.va.size_bytes;
        source.unmap(r.slot_addr(s), sz);
        source.destroy(r.slots[s].handle);
      }
      source.release(r.va);
    }
    for (int pool = 0; pool < 2; ++pool) free_index[pool].blocks().clear();
    live.clear_unlocked();
    for (auto& [base, rp] : regions) {
      for (Block* b = rp->first; b;) {
        Block* n = b->next;
        arena.dispose(b);
        b = n;
      }
    }
    regions.clear();
  }
};

namespace {

void retire_thread_cache(CachingAllocator::Impl* engine, ThreadCache* cache) {
  std::lock_guard lock(engine->mutex);
  {
    std::lock_guard cl(cache->lock);
    engine->drain_locked(*cache);
  }
  auto& v = engine->caches;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& p) { return p.get() == cache; }), v.end());
}

}  // namespace

// ==================================================================== public interface

CachingAllocator::CachingAllocator(MemorySource& source, StreamEvents& events, Config config, int device)
    : impl_(std::make_unique<Impl>(source, events, std::move(config), device)) {
  EngineRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.engines.emplace(impl_->id, impl_.get());
}

CachingAllocator::~CachingAllocator() {
  {
    // After this, exiting threads no longer hand caches back to this engine.
    EngineRegistry& reg = registry();
    std::lock_guard lock(reg.mutex);
    reg.engines.erase(impl_->id);
  }
  std::lock_guard lock(impl_->mutex);
  Impl::WorldStop stop(*impl_);
  for (Block* b : impl_->pending)
    for (EventToken t : b->uses->markers) impl_->events.release(t);
  impl_->pending.clear();
  impl_->release_all();
}

std::size_t CachingAllocator::round_size(std::size_t size_bytes) const noexcept {
  return policy::round_size(size_bytes, impl_->config.roundup_power2_divisions, impl_->any_divisions);
}

AllocResult CachingAllocator::allocate(std::size_t size_bytes, StreamId stream) {
  Impl& m = *impl_;
  AllocResult result;
  if (size_bytes == 0) return result;
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  const bool too_large = size_bytes >= policy::kMaxRequestBytes;
  const std::size_t rounded = too_large ? size_bytes : round_size(size_bytes);
  const PoolKind pool = policy::pool_for(rounded);

  // Fast path: a block of this size this thread freed recently. No engine lock.
  if (m.use_caches() && !too_large) {
    if (ThreadCache* tc = m.cache_for_this_thread(true)) {
      Block* b = nullptr;
      {
        std::lock_guard cl(tc->lock);
        tc->note_recent(stream, rounded);
        b = tc->pop(stream, rounded);
        if (b) {
          m.live.with_shard(b->addr, [&](auto&) {
            b->state = BlockState::allocated;
            b->requested_bytes = size_bytes;
          });
          tc->cached_bytes -= b->size_bytes;
          tc->allocated_delta += static_cast<std::int64_t>(b->size_bytes);
          tc->requested_delta += static_cast<std::int64_t>(size_bytes);
          b->alloc_seq = m.record(batch, EventKind::alloc, pool, b->addr, b->size_bytes, size_bytes, stream);
        }
      }
      if (b) {
        Impl::publish(m.observers_for(batch), batch);
        result.ptr = reinterpret_cast<void*>(b->addr);
        result.size_bytes = b->size_bytes;
        return result;
      }
    }
  }

  {
    auto lock = m.lock_noting_contention();
    if (!m.pending.empty()) m.process_pending(batch, false);
    Block* b = nullptr;
    GrowFailure fail;
    if (too_large) {
      fail.status = SourceStatus::out_of_memory;
      fail.detail = "requests of 1 EiB or more are refused";
    } else {
      // The engine's choices see all of this thread's free memory: what its cache holds goes back
      // first (the cache only ever serves exact repeats between two visits to the engine).
      m.drain_own_cache_locked();
      b = m.take_cached(pool, stream, rounded);
      if (!b && policy::should_collect_garbage(m.config.garbage_collection_threshold, m.reserved_bytes, m.cap))
        m.collect_garbage(batch);
      if (!b) b = m.grow(pool, stream, rounded, batch, fail);
      if (!b) {
        // Free what is cached (every pool, every stream) and try once more.
        m.release_cached(batch);
        b = m.take_cached(pool, stream, rounded);
        if (!b) b = m.grow(pool, stream, rounded, batch, fail);
      }
    }
    if (!b) {
      result.oom = m.make_oom(size_bytes, rounded, stream, pool, fail);
      m.emit(batch, EventKind::oom, pool, 0, rounded, size_bytes, stream);
      m.maybe_check();
      obs = m.observers_for(batch);
    } else {
      b->state = BlockState::allocated;
      b->requested_bytes = size_bytes;
      m.live.insert(*b, m.use_caches());
      m.allocated_bytes += b->size_bytes;
      m.requested_bytes += size_bytes;
      b->alloc_seq = m.emit(batch, EventKind::alloc, pool, b->addr, b->size_bytes, size_bytes, stream);
      result.ptr = reinterpret_cast<void*>(b->addr);
      result.size_bytes = b->size_bytes;
      m.maybe_check();
      obs = m.observers_for(batch);
    }
  }
  Impl::publish(obs, batch);
  return result;
}

FreeStatus CachingAllocator::free(void* ptr) {
  Impl& m = *impl_;
  if (ptr == nullptr) return FreeStatus::null_pointer;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;

  // Fast path: keep the block in this thread's cache if this thread allocates its size often.
  if (m.use_caches()) {
    if (ThreadCache* tc = m.cache_for_this_thread(false)) {
      bool cached = false;
      {
        std::lock_guard cl(tc->lock);
        Block* b = m.live.with_shard(addr, [&](auto& table) -> Block* {
          Block* x = table.find(addr);
          if (!x || x->state != BlockState::allocated || x->uses || x->size_bytes > ThreadCache::kMaxBlockBytes ||
              tc->cached_bytes + x->size_bytes > ThreadCache::kMaxCachedBytes ||
              !tc->is_recent(x->stream, x->size_bytes))
            return nullptr;
          ThreadCache::Bin* bin = tc->bin_for_push(x->stream, x->size_bytes);
          if (!bin) return nullptr;
          x->state = BlockState::cached;
          bin->blocks[bin->count++] = x;
          return x;
        });
        if (b) {
          cached = true;
          tc->cached_bytes += b->size_bytes;
          tc->allocated_delta -= static_cast<std::int64_t>(b->size_bytes);
          tc->requested_delta -= static_cast<std::int64_t>(b->requested_bytes);
          const PoolKind pool = b->region->pool;
          m.record(batch, EventKind::free_requested, pool, addr, b->size_bytes, b->requested_bytes, b->stream);
          m.record(batch, EventKind::free_completed, pool, addr, b->size_bytes, b->requested_bytes, b->stream);
        }
      }
      if (cached) {
        Impl::publish(m.observers_for(batch), batch);
        return FreeStatus::ok;
      }
    }
  }

  {
    auto lock = m.lock_noting_contention();
    Block* b = m.live.find(addr, m.use_caches());
    if (b == nullptr || b->state != BlockState::allocated) return m.classify_bad_pointer_locked(addr);
    m.allocated_bytes -= b->size_bytes;
    m.requested_bytes -= b->requested_bytes;
    m.emit(batch, EventKind::free_requested, b->region->pool, b->addr, b->size_bytes, b->requested_bytes, b->stream);
    if (b->uses && !b->uses->streams.empty()) {
      for (StreamId s : b->uses->streams) b->uses->markers.push_back(m.events.record(s));
      b->state = BlockState::pending_free;
      m.pending.push_back(b);
      m.pending_bytes += b->size_bytes;
    } else {
      m.complete_free(b, batch);
    }
    m.maybe_check();
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
  return FreeStatus::ok;
}

FreeStatus CachingAllocator::record_stream(void* ptr, StreamId stream) {
  Impl& m = *impl_;
  if (ptr == nullptr) return FreeStatus::null_pointer;
  std::lock_guard lock(m.mutex);
  Block* b = m.live.find(reinterpret_cast<std::uintptr_t>(ptr), m.use_caches());
  if (b == nullptr || b->state != BlockState::allocated)
    return m.classify_bad_pointer_locked(reinterpret_cast<std::uintptr_t>(ptr));
  if (stream == b->stream) return FreeStatus::ok;
  if (!b->uses) b->uses = std::make_unique<detail::StreamUses>();
  auto& s = b->uses->streams;
  if (std::find(s.begin(), s.end(), stream) == s.end()) s.push_back(stream);
  return FreeStatus::ok;
}

void CachingAllocator::empty_cache() {
  Impl& m = *impl_;
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  {
    std::lock_guard lock(m.mutex);
    const std::size_t released = m.release_cached(batch);
    m.emit(batch, EventKind::empty_cache, PoolKind::large, 0, released, 0, 0);
    m.maybe_check();
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
}

void CachingAllocator::set_memory_fraction(double fraction) {
  std::lock_guard lock(impl_->mutex);
  impl_->fraction = std::clamp(fraction, 0.0, 1.0);
  impl_->cap = policy::cap_bytes(impl_->fraction, impl_->limit_bytes, impl_->provider_total);
}

double CachingAllocator::memory_fraction() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->fraction;
}

void CachingAllocator::set_memory_limit(std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  impl_->limit_bytes = bytes;
  impl_->cap = policy::cap_bytes(impl_->fraction, impl_->limit_bytes, impl_->provider_total);
}

void CachingAllocator::attach_observer(std::shared_ptr<AllocObserver> observer) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  const Impl::ObserverList* now = m.observers.load(std::memory_order_relaxed);
  auto next = now ? std::make_unique<Impl::ObserverList>(*now) : std::make_unique<Impl::ObserverList>();
  next->push_back(std::move(observer));
  m.observers.store(next.get(), std::memory_order_release);
  m.observer_lists.push_back(std::move(next));
  m.has_observers.store(true, std::memory_order_relaxed);
}

void CachingAllocator::detach_observer(const AllocObserver* observer) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  const Impl::ObserverList* now = m.observers.load(std::memory_order_relaxed);
  auto next = std::make_unique<Impl::ObserverList>();
  if (now)
    for (const auto& o : *now)
      if (o.get() != observer) next->push_back(o);
  m.has_observers.store(!next->empty(), std::memory_order_relaxed);
  m.observers.store(next.get(), std::memory_order_release);
  m.observer_lists.push_back(std::move(next));
}

EngineTotals CachingAllocator::totals() const {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  Impl::WorldStop stop(m);
  std::int64_t alloc_delta = 0, req_delta = 0;
  std::size_t in_caches = 0;
  for (const auto& tc : m.caches) {
    alloc_delta += tc->allocated_delta;
    req_delta += tc->requested_delta;
    in_caches += tc->cached_bytes;
  }
  EngineTotals t;
  t.allocated_bytes = m.allocated_bytes + static_cast<std::size_t>(alloc_delta);
  t.requested_bytes = m.requested_bytes + static_cast<std::size_t>(req_delta);
  t.active_bytes = t.allocated_bytes + m.pending_bytes;
  t.reserved_bytes = m.reserved_bytes;
  t.cached_free_bytes = m.free_index[0].bytes() + m.free_index[1].bytes() + in_caches;
  t.thread_caches = m.use_caches() ? m.caches.size() : 0;
  t.thread_cached_bytes = in_caches;
  t.largest_free_extent_bytes = m.largest_free_locked();
  t.va_reserved_bytes = m.va_bytes;
  t.cap_bytes = m.cap;
  t.segments = m.regions.size();
  for (const auto& [base, r] : m.regions)
    t.pieces_mapped += r->expandable ? r->mapped_bytes / r->piece_bytes : 1;
  return t;
}

EngineSnapshot CachingAllocator::snapshot() {
  Impl& m = *impl_;
  EngineSnapshot snap;
  snap.device = m.device;
  snap.settings = to_string(m.config);
  {
    // Views show cached blocks as the free memory they are: hand them back first.
    std::lock_guard lock(m.mutex);
    Impl::WorldStop stop(m);
    stop.drain();
  }
  snap.totals = totals();
  EventBatch batch = m.new_batch();
  const Impl::ObserverList* obs = nullptr;
  {
    std::lock_guard lock(m.mutex);
    snap.segments.reserve(m.regions.size());
    for (const auto& [base, rp] : m.regions) {
      const Region& r = *rp;
      SegmentView sv;
      sv.device = m.device;
      sv.base = r.va.base;
      sv.size_bytes = r.va.size_bytes;
      sv.mapped_bytes = r.mapped_bytes;
      sv.stream = r.stream;
      sv.pool = r.pool;
      sv.expandable = r.expandable;
      sv.created_seq = r.created_seq;
      for (const Block* b = r.first; b; b = b->next)
        sv.blocks.push_back(BlockView{b->addr, b->size_bytes, b->requested_bytes,
                                      b->state == BlockState::cached ? BlockState::free : BlockState(b->state),
                                      b->alloc_seq});
      if (r.expandable)
        for (std::size_t s = 0; s < r.slots.size(); ++s)
          if (r.slots[s].mapped) sv.pieces.push_back(PieceView{r.slot_addr(s), r.piece_bytes, true});
      snap.segments.push_back(std::move(sv));
    }
    m.emit(batch, EventKind::snapshot, PoolKind::large, 0, snap.totals.active_bytes, 0, 0);
    obs = m.observers_for(batch);
  }
  Impl::publish(obs, batch);
  return snap;
}

std::optional<BlockLookup> CachingAllocator::lookup(const void* ptr) const {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  const Block* b = m.live.find(reinterpret_cast<std::uintptr_t>(ptr), m.use_caches());
  if (!b || b->state != BlockState::allocated) return std::nullopt;
  BlockLookup l;
  l.block_addr = b->addr;
  l.block_size_bytes = b->size_bytes;
  l.requested_bytes = b->requested_bytes;
  l.segment_base = b->region->va.base;
  l.segment_size_bytes = b->region->va.size_bytes;
  l.stream = b->stream;
  l.expandable = b->region->expandable;
  return l;
}

std::vector<ExpandableRegionSize> CachingAllocator::expandable_region_sizes() const {
  const Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  std::vector<ExpandableRegionSize> out;
  for (const auto& [base, r] : m.regions)
    if (r->expandable) out.push_back({r->stream, r->pool == PoolKind::small, r->mapped_bytes});
  return out;
}

std::size_t CachingAllocator::largest_free_block_bytes() const {
  std::lock_guard lock(impl_->mutex);
  {
    Impl::WorldStop stop(*impl_);
    stop.drain();
  }
  return impl_->largest_free_locked();
}

void CachingAllocator::check_invariants() const {
  std::lock_guard lock(impl_->mutex);
  Impl::WorldStop stop(*impl_);
  impl_->check_locked();
}

const Config& CachingAllocator::config() const noexcept { return impl_->config; }
MemorySource& CachingAllocator::source() noexcept { return impl_->source; }
int CachingAllocator::device() const noexcept { return impl_->device; }

}  // namespace gpumem::alloc
