#include "gpumem/pinned/pinned_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "block_table.h"
#include "carve_policy.h"
#include "deferred_frees.h"
#include "host_mapping.h"
#include "jemalloc_arena.h"
#include "observer_hub.h"
#include "region_table.h"

namespace gpumem::pinned {

using alloc::AllocEvent;
using alloc::EventKind;
using alloc::FreeStatus;
using alloc::PoolKind;

std::string validate(const PinnedOptions& options) {
  const std::size_t a = options.min_alignment_bytes;
  if (a < 16 || (a & (a - 1)) != 0)
    return fmt::format("pinned min_alignment_bytes = {} is not a power of two of at least 16; use 64 (the default)", a);
  if (options.direct_min_bytes < (std::size_t{16} << 10))
    return fmt::format("pinned direct_min_bytes = {} is below 16384 (jemalloc's small size classes end at 14 KiB); "
                       "use 1048576 (the default), 16384 or more, or SIZE_MAX for jemalloc's classes only",
                       options.direct_min_bytes);
  const std::size_t page = detail::system_page_bytes();
  if (options.region_bytes == 0 || options.region_bytes % page != 0)
    return fmt::format("pinned region_bytes = {} is not a positive multiple of the page size ({} bytes); use 2097152 "
                       "(2 MiB, the default) or another multiple of {}",
                       options.region_bytes, page, page);
  return {};
}

namespace {

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void raise_to(std::atomic<std::size_t>& peak, std::size_t value) {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Larger requests are refused before any rounding could overflow (64 TiB: more than any host has).
constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 46;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "gpumem pinned: invariant broken: %s\n", what.c_str());
  std::abort();
}

class CallEvents;
thread_local CallEvents* tl_call = nullptr;

}  // namespace

struct PinnedAllocator::Impl final : detail::ExtentProvider {
  Impl(HostMemorySource& src, alloc::StreamEvents& ev, PinnedOptions opts)
      : source(src), events(ev), options(opts), page_bytes(src.caps().page_bytes) {}

  HostMemorySource& source;
  alloc::StreamEvents& events;
  const PinnedOptions options;
  const std::size_t page_bytes;
  detail::RegionTable regions;
  detail::BlockTable blocks;
  detail::DeferredFrees deferred;
  detail::ObserverHub observers;
  std::unique_ptr<detail::JemallocArena> arena;  // created last, destroyed first (~PinnedAllocator)

  std::atomic<std::uint64_t> seq{0};
  std::atomic<std::size_t> allocated_bytes{0}, requested_bytes{0}, pending_bytes{0};
  std::atomic<std::size_t> allocations{0}, pending_count{0};
  std::atomic<std::size_t> peak_allocated{0}, peak_requested{0}, peak_reserved{0}, peak_locked{0};
  std::atomic<std::uint64_t> num_allocs{0}, num_frees{0}, num_deferred{0}, num_maps{0}, num_unmaps{0},
      num_failures{0};
  std::atomic<std::size_t> unmapped_bytes_total{0};
  std::atomic<std::size_t> high_water_reserved{0};  // the policy's mark (reset_peaks leaves it alone)

  // The background thread (PinnedOptions::background_period_us), stopped before anything else dies.
  std::thread background;
  std::mutex background_mutex;
  std::condition_variable background_wake;
  bool background_stop = false;

  std::mutex side_mutex;                 // guards the two below
  std::vector<AllocEvent> orphan_events;  // hook events of calls made outside an allocator call
  std::string last_source_error;

  // Blocks from the jemalloc arena live in small-pool regions, direct blocks in large-pool ones.
  PoolKind pool_of_request(std::size_t requested_bytes) const noexcept {
    return is_direct(requested_bytes) ? PoolKind::large : PoolKind::small;
  }
  AllocEvent make_event(unsigned needs, EventKind kind, PoolKind pool, std::uintptr_t addr, std::size_t size,
                        std::size_t requested, alloc::StreamId stream) {
    AllocEvent e;
    e.kind = kind;
    e.pool = pool;
    e.device = static_cast<std::int8_t>(kPinnedHostDevice);
    e.addr = addr;
    e.size_bytes = size;
    e.requested_bytes = requested;
    e.stream = stream;
    if (needs & alloc::kNeedsSequence) e.seq = seq.fetch_add(1, std::memory_order_relaxed) + 1;
    if (needs & alloc::kNeedsTimestamps) e.t_ns = now_ns();
    return e;
  }
  void note_region(EventKind kind, PoolKind pool, const HostRegion& region);
  void update_region_peaks() {
    const auto t = regions.totals();
    raise_to(high_water_reserved, t.reserved_bytes);
    raise_to(peak_reserved, t.reserved_bytes);
    raise_to(peak_locked, t.locked_bytes);
  }

  // Unlocks and unmaps regions the table let go of.
  std::size_t unmap_regions(const std::vector<detail::PooledRegion>& gone) {
    std::size_t bytes = 0;
    for (const auto& [r, pool] : gone) {
      if (const auto status = source.unmap(r); status != alloc::SourceStatus::ok) {
        // The table no longer has it; the source keeps it mapped (and unmaps it when it dies).
        std::fprintf(stderr, "gpumem pinned: could not unmap a free region of %zu bytes: %s\n", r.size_bytes,
                     source.last_error().c_str());
      }
      num_unmaps.fetch_add(1, std::memory_order_relaxed);
      bytes += r.size_bytes;
      note_region(EventKind::segment_free, pool, r);
    }
    unmapped_bytes_total.fetch_add(bytes, std::memory_order_relaxed);
    return bytes;
  }

  bool is_direct(std::size_t size_bytes) const noexcept { return size_bytes >= options.direct_min_bytes; }
  std::size_t size_class(std::size_t size_bytes) const noexcept {
    if (is_direct(size_bytes)) return (size_bytes + page_bytes - 1) / page_bytes * page_bytes;
    return arena->usable_size(size_bytes, options.min_alignment_bytes);
  }

  // Pages for a jemalloc extent or a direct block: the best-fitting free range, else a new region.
  // *zero on entry: the memory must read as zero; on return: whether it does.
  // Pages for a jemalloc extent (pool small) or a direct block (pool large). See Note [Pinned
  // memory on a jemalloc arena]:
  //   * best fit among the free ranges of the pool's regions; an idle region more than twice the
  //     request (and larger than a new region would be) stays whole for a request of its size;
  //   * when nothing fits, a new region, unless that would raise locked memory above its high-water
  //     mark while idle regions are held: then those are unlocked and unmapped first. Below the mark
  //     idle regions stay for later requests (no cudaHostRegister churn).
  // *zero on entry: the memory must read as zero; on return: whether it does.
  void* carve(PoolKind pool, std::size_t size_bytes, std::size_t alignment_bytes, bool* zero) {
    const std::size_t max_idle_split = detail::max_idle_split_bytes(size_bytes, options.region_bytes);
    if (std::uintptr_t at = regions.take_free(pool, size_bytes, alignment_bytes, max_idle_split)) {
      if (*zero) std::memset(reinterpret_cast<void*>(at), 0, size_bytes);
      return reinterpret_cast<void*>(at);
    }
    const std::size_t region_size = detail::new_region_bytes(size_bytes, options.region_bytes);
    if (detail::release_idle_before_map(regions.totals().reserved_bytes, region_size,
                                        high_water_reserved.load(std::memory_order_relaxed)))
      unmap_regions(regions.release_idle());
    // A new region: the extent at its start, the rest free for later extents.
    auto mapped = source.map_locked(region_size, alignment_bytes);
    if (!mapped.ok()) {
      std::string words = source.last_error();
      std::lock_guard lock(side_mutex);
      last_source_error = words.empty() ? std::string(alloc::to_string(mapped.status)) : std::move(words);
      return nullptr;
    }
    regions.insert(mapped.value, pool, seq.load(std::memory_order_relaxed));
    num_maps.fetch_add(1, std::memory_order_relaxed);
    update_region_peaks();
    note_region(EventKind::segment_alloc, pool, mapped.value);
    if (region_size > size_bytes) regions.give_back(mapped.value.base + size_bytes, region_size - size_bytes);
    *zero = true;  // fresh anonymous memory
    return reinterpret_cast<void*>(mapped.value.base);
  }

  // ---- detail::ExtentProvider (runs inside jemalloc's locks) ----
  void* obtain_extent(std::size_t size_bytes, std::size_t alignment_bytes, bool* zero) override {
    return carve(PoolKind::small, size_bytes, alignment_bytes, zero);
  }
  void give_back_extent(void* addr, std::size_t size_bytes) override {
    regions.give_back(reinterpret_cast<std::uintptr_t>(addr), size_bytes);
  }
  bool may_merge(const void* a, const void* b) override {
    return regions.same_region(reinterpret_cast<std::uintptr_t>(a), reinterpret_cast<std::uintptr_t>(b));
  }

  // ---- calls ----
  void release_block(std::uintptr_t addr, std::size_t size_bytes, std::size_t requested_bytes, bool direct) {
    if (direct)
      regions.give_back(addr, size_bytes);
    else
      arena->deallocate(reinterpret_cast<void*>(addr), requested_bytes, options.min_alignment_bytes);
  }
  void* allocate_once(std::size_t size_bytes) {
    if (!is_direct(size_bytes)) return arena->allocate(size_bytes, options.min_alignment_bytes);
    bool zero = false;
    return carve(PoolKind::large, size_class(size_bytes), page_bytes, &zero);
  }
  void return_to_arena(const detail::PendingFree& done, CallEvents& call);
  std::size_t drain_completed(CallEvents& call, bool wait);
  FreeStatus classify_unknown(std::uintptr_t addr) const;
};

namespace {

// The events of one allocator call: collected while it runs (the extent hooks add theirs from
// inside jemalloc on this thread), published when it ends, with no lock held.
class CallEvents {
 public:
  explicit CallEvents(PinnedAllocator::Impl& impl)
      : impl_(impl), recording_(impl.observers.active()), needs_(recording_ ? impl.observers.needs() : 0u),
        outer_(tl_call) {
    tl_call = this;
  }
  ~CallEvents() {
    tl_call = outer_;
    if (!recording_) return;
    {
      std::lock_guard lock(impl_.side_mutex);
      if (!impl_.orphan_events.empty()) {
        events_.insert(events_.begin(), impl_.orphan_events.begin(), impl_.orphan_events.end());
        impl_.orphan_events.clear();
      }
    }
    impl_.observers.publish({events_.data(), events_.size()});
  }
  CallEvents(const CallEvents&) = delete;
  CallEvents& operator=(const CallEvents&) = delete;

  bool recording() const noexcept { return recording_; }
  const PinnedAllocator::Impl* owner() const noexcept { return &impl_; }
  std::uint64_t add(EventKind kind, PoolKind pool, std::uintptr_t addr, std::size_t size, std::size_t requested,
                    alloc::StreamId stream = 0) {
    if (!recording_) return 0;
    events_.push_back(impl_.make_event(needs_, kind, pool, addr, size, requested, stream));
    return events_.back().seq;
  }

 private:
  PinnedAllocator::Impl& impl_;
  const bool recording_;
  const unsigned needs_;
  CallEvents* const outer_;
  boost::container::small_vector<AllocEvent, 4> events_;
};

}  // namespace

void PinnedAllocator::Impl::note_region(EventKind kind, PoolKind pool, const HostRegion& region) {
  if (!observers.active()) return;
  if (tl_call != nullptr && tl_call->owner() == this) {
    tl_call->add(kind, pool, region.base, region.size_bytes, 0);
    return;
  }
  // A hook ran outside any call of this allocator (cannot happen today: every path into jemalloc,
  // the background thread's included, runs inside one); keep the event for the next call to publish.
  AllocEvent e = make_event(observers.needs(), kind, pool, region.base, region.size_bytes, 0, 0);
  std::lock_guard lock(side_mutex);
  orphan_events.push_back(e);
}

void PinnedAllocator::Impl::return_to_arena(const detail::PendingFree& done, CallEvents& call) {
  blocks.erase(done.addr);
  release_block(done.addr, done.size_bytes, done.requested_bytes, done.direct);
  pending_bytes.fetch_sub(done.size_bytes, std::memory_order_relaxed);
  pending_count.fetch_sub(1, std::memory_order_relaxed);
  call.add(EventKind::free_completed, pool_of_request(done.requested_bytes), done.addr, done.size_bytes, done.requested_bytes);
}

std::size_t PinnedAllocator::Impl::drain_completed(CallEvents& call, bool wait) {
  auto done = deferred.take_completed(events, wait);
  for (const auto& d : done) return_to_arena(d, call);
  return done.size();
}

FreeStatus PinnedAllocator::Impl::classify_unknown(std::uintptr_t addr) const {
  if (!regions.region_of(addr)) return FreeStatus::foreign_pointer;
  if (auto found = blocks.find_containing(addr); found && found->first != addr) return FreeStatus::interior_pointer;
  return FreeStatus::double_free;
}

// ---------------------------------------------------------------- PinnedAllocator

PinnedAllocator::PinnedAllocator(HostMemorySource& source, alloc::StreamEvents& events, PinnedOptions options) {
  if (auto bad = validate(options); !bad.empty()) throw std::invalid_argument(bad);
  impl_ = std::make_unique<Impl>(source, events, options);
  std::string error;
  impl_->arena = detail::JemallocArena::create(*impl_, options.region_bytes, &error);
  if (!impl_->arena) throw std::runtime_error("gpumem pinned: cannot create the jemalloc arena: " + error);
  if (options.background_period_us > 0) {
    impl_->background = std::thread([this, period = std::chrono::microseconds(options.background_period_us)] {
      std::unique_lock lock(impl_->background_mutex);
      while (!impl_->background_wake.wait_for(lock, period, [this] { return impl_->background_stop; })) {
        lock.unlock();
        if (impl_->deferred.size() != 0) process_events();
        lock.lock();
      }
    });
  }
}

PinnedAllocator::~PinnedAllocator() {
  Impl& m = *impl_;
  if (m.background.joinable()) {
    {
      std::lock_guard lock(m.background_mutex);
      m.background_stop = true;
    }
    m.background_wake.notify_all();
    m.background.join();
  }
  {
    CallEvents call(m);
    for (const auto& d : m.deferred.take_all(m.events)) {
      m.blocks.erase(d.addr);
      call.add(EventKind::free_completed, m.pool_of_request(d.requested_bytes), d.addr, d.size_bytes, d.requested_bytes);
    }
    m.arena.reset();  // arena.<i>.destroy: every extent comes back through the hooks
    m.unmap_regions(m.regions.take_all());
  }
}

PinnedAllocResult PinnedAllocator::allocate(std::size_t size_bytes) {
  if (size_bytes == 0) return {};
  Impl& m = *impl_;
  CallEvents call(m);
  if (size_bytes > kMaxRequestBytes) {
    m.num_failures.fetch_add(1, std::memory_order_relaxed);
    call.add(EventKind::oom, PoolKind::large, 0, size_bytes, size_bytes);
    PinnedAllocResult r;
    r.error = fmt::format("gpumem pinned: cannot allocate {} bytes of pinned host memory: more than the {} bytes "
                          "(2^46) one request may ask for; check the size computation",
                          size_bytes, kMaxRequestBytes);
    return r;
  }
  m.drain_completed(call, false);
  void* p = m.allocate_once(size_bytes);
  if (p == nullptr) {
    // The source refused: give back what completed and every cached extent, then try once more.
    m.drain_completed(call, true);
    m.arena->purge();
    call.add(EventKind::empty_cache, PoolKind::large, 0, m.unmap_regions(m.regions.release_idle()), 0);
    p = m.allocate_once(size_bytes);
  }
  const std::size_t usize = m.size_class(size_bytes);
  if (p == nullptr) {
    m.num_failures.fetch_add(1, std::memory_order_relaxed);
    call.add(EventKind::oom, m.pool_of_request(size_bytes), 0, usize, size_bytes);
    std::string why;
    {
      std::lock_guard lock(m.side_mutex);
      why = m.last_source_error;
    }
    const auto t = m.regions.totals();
    PinnedAllocResult r;
    r.error = fmt::format(
        "gpumem pinned: cannot allocate {} bytes of pinned host memory (size class {}): {}. {} bytes are page-locked "
        "in {} regions, {} of them allocated and {} pending on copies; free pinned buffers, call empty_cache(), or "
        "raise the locked-memory limit (ulimit -l) / free host memory",
        size_bytes, usize, why.empty() ? "the host memory source refused" : why, t.locked_bytes, t.regions,
        m.allocated_bytes.load(), m.pending_bytes.load());
    return r;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const std::uint64_t seq = call.add(EventKind::alloc, m.pool_of_request(size_bytes), addr, usize, size_bytes);
  m.blocks.insert(addr, detail::BlockRecord{usize, size_bytes, seq, false, m.is_direct(size_bytes), {}});
  raise_to(m.peak_allocated, m.allocated_bytes.fetch_add(usize, std::memory_order_relaxed) + usize);
  raise_to(m.peak_requested, m.requested_bytes.fetch_add(size_bytes, std::memory_order_relaxed) + size_bytes);
  m.allocations.fetch_add(1, std::memory_order_relaxed);
  m.num_allocs.fetch_add(1, std::memory_order_relaxed);
  return {p, usize, {}};
}

FreeStatus PinnedAllocator::free(void* ptr) {
  if (ptr == nullptr) return FreeStatus::null_pointer;
  Impl& m = *impl_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  detail::BlockRecord rec;
  const detail::FreeAction action = m.blocks.begin_free(addr, &rec);
  if (action == detail::FreeAction::not_found) return m.classify_unknown(addr);
  if (action == detail::FreeAction::already_pending) return FreeStatus::double_free;
  CallEvents call(m);
  const PoolKind pool = m.pool_of_request(rec.requested_bytes);
  call.add(EventKind::free_requested, pool, addr, rec.size_bytes, rec.requested_bytes,
           rec.streams.empty() ? 0 : rec.streams.front());
  m.allocated_bytes.fetch_sub(rec.size_bytes, std::memory_order_relaxed);
  m.requested_bytes.fetch_sub(rec.requested_bytes, std::memory_order_relaxed);
  m.allocations.fetch_sub(1, std::memory_order_relaxed);
  m.num_frees.fetch_add(1, std::memory_order_relaxed);
  if (action == detail::FreeAction::now) {
    m.release_block(addr, rec.size_bytes, rec.requested_bytes, rec.direct);
    call.add(EventKind::free_completed, pool, addr, rec.size_bytes, rec.requested_bytes);
    return FreeStatus::ok;
  }
  detail::PendingFree pending{addr, rec.size_bytes, rec.requested_bytes, rec.direct, {}};
  for (alloc::StreamId s : rec.streams) pending.markers.push_back(m.events.record(s));
  m.pending_bytes.fetch_add(rec.size_bytes, std::memory_order_relaxed);
  m.pending_count.fetch_add(1, std::memory_order_relaxed);
  m.num_deferred.fetch_add(1, std::memory_order_relaxed);
  m.deferred.push(std::move(pending));
  return FreeStatus::ok;
}

FreeStatus PinnedAllocator::record_stream(void* ptr, alloc::StreamId stream) {
  if (ptr == nullptr) return FreeStatus::null_pointer;
  Impl& m = *impl_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  bool pending = false;
  if (m.blocks.add_stream(addr, stream, &pending)) return FreeStatus::ok;
  return pending ? FreeStatus::double_free : m.classify_unknown(addr);
}

std::size_t PinnedAllocator::process_events() {
  CallEvents call(*impl_);
  return impl_->drain_completed(call, true);
}

std::size_t PinnedAllocator::empty_cache() {
  Impl& m = *impl_;
  CallEvents call(m);
  m.drain_completed(call, true);
  m.arena->purge();  // jemalloc's cached extents (empty slabs, with decay 0 nothing else) come back
  const std::size_t released = m.unmap_regions(m.regions.release_idle());
  call.add(EventKind::empty_cache, PoolKind::large, 0, released, 0);
  return released;
}

std::optional<PinnedBlockInfo> PinnedAllocator::lookup(const void* ptr) const {
  auto found = impl_->blocks.find_containing(reinterpret_cast<std::uintptr_t>(ptr));
  if (!found) return std::nullopt;
  return PinnedBlockInfo{found->first, found->second.size_bytes, found->second.requested_bytes,
                         found->second.pending_free};
}

bool PinnedAllocator::owns(const void* ptr) const {
  return impl_->regions.region_of(reinterpret_cast<std::uintptr_t>(ptr)).has_value();
}

std::size_t PinnedAllocator::round_size(std::size_t size_bytes) const noexcept {
  return size_bytes == 0 ? 0 : impl_->size_class(size_bytes);
}

void PinnedAllocator::attach_observer(std::shared_ptr<alloc::AllocObserver> observer) {
  impl_->observers.attach(std::move(observer));
}

void PinnedAllocator::detach_observer(const alloc::AllocObserver* observer) { impl_->observers.detach(observer); }

PinnedTotals PinnedAllocator::totals() const {
  const Impl& m = *impl_;
  const auto r = m.regions.totals();
  PinnedTotals t;
  t.allocated_bytes = m.allocated_bytes.load(std::memory_order_relaxed);
  t.requested_bytes = m.requested_bytes.load(std::memory_order_relaxed);
  t.pending_free_bytes = m.pending_bytes.load(std::memory_order_relaxed);
  t.reserved_bytes = r.reserved_bytes;
  t.locked_bytes = r.locked_bytes;
  const std::size_t active = t.allocated_bytes + t.pending_free_bytes;
  t.cached_bytes = r.reserved_bytes > active ? r.reserved_bytes - active : 0;
  t.allocations = m.allocations.load(std::memory_order_relaxed);
  t.pending_frees = m.pending_count.load(std::memory_order_relaxed);
  t.regions = r.regions;
  t.peak_allocated_bytes = m.peak_allocated.load(std::memory_order_relaxed);
  t.peak_requested_bytes = m.peak_requested.load(std::memory_order_relaxed);
  t.peak_reserved_bytes = m.peak_reserved.load(std::memory_order_relaxed);
  t.peak_locked_bytes = m.peak_locked.load(std::memory_order_relaxed);
  t.num_allocs = m.num_allocs.load(std::memory_order_relaxed);
  t.num_frees = m.num_frees.load(std::memory_order_relaxed);
  t.num_deferred_frees = m.num_deferred.load(std::memory_order_relaxed);
  t.num_region_maps = m.num_maps.load(std::memory_order_relaxed);
  t.num_region_unmaps = m.num_unmaps.load(std::memory_order_relaxed);
  t.num_alloc_failures = m.num_failures.load(std::memory_order_relaxed);
  return t;
}

void PinnedAllocator::reset_peaks() {
  Impl& m = *impl_;
  const auto r = m.regions.totals();
  m.peak_allocated.store(m.allocated_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  m.peak_requested.store(m.requested_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  m.peak_reserved.store(r.reserved_bytes, std::memory_order_relaxed);
  m.peak_locked.store(r.locked_bytes, std::memory_order_relaxed);
}

alloc::EngineSnapshot PinnedAllocator::snapshot() {
  Impl& m = *impl_;
  alloc::EngineSnapshot snap;
  snap.device = kPinnedHostDevice;
  snap.settings = settings();
  const auto blocks = m.blocks.copy();
  std::size_t active_bytes = 0;
  auto next_block = blocks.begin();
  for (const auto& rc : m.regions.copy()) {
    alloc::SegmentView seg;
    seg.device = kPinnedHostDevice;
    seg.base = rc.region.base;
    seg.size_bytes = rc.region.size_bytes;
    seg.mapped_bytes = rc.region.size_bytes;
    seg.pool = rc.pool;
    seg.created_seq = rc.created_seq;
    std::uintptr_t at = seg.base;
    while (next_block != blocks.end() && next_block->first < rc.region.end()) {
      const auto& [addr, rec] = *next_block++;
      if (addr < at) continue;  // not in this region (cannot happen while the invariants hold)
      if (addr > at) seg.blocks.push_back({at, addr - at, 0, alloc::BlockState::free, 0});
      seg.blocks.push_back({addr, rec.size_bytes, rec.requested_bytes,
                            rec.pending_free ? alloc::BlockState::pending_free : alloc::BlockState::allocated,
                            rec.alloc_seq});
      at = addr + rec.size_bytes;
      active_bytes += rec.size_bytes;
    }
    if (at < rc.region.end()) seg.blocks.push_back({at, rc.region.end() - at, 0, alloc::BlockState::free, 0});
    snap.segments.push_back(std::move(seg));
  }
  const PinnedTotals t = totals();
  snap.totals.allocated_bytes = t.allocated_bytes;
  snap.totals.requested_bytes = t.requested_bytes;
  snap.totals.active_bytes = t.allocated_bytes + t.pending_free_bytes;
  snap.totals.reserved_bytes = t.reserved_bytes;
  snap.totals.cached_free_bytes = t.cached_bytes;
  snap.totals.va_reserved_bytes = t.reserved_bytes;
  snap.totals.cap_bytes = alloc::kNoLimit;
  snap.totals.segments = t.regions;
  CallEvents call(m);
  call.add(EventKind::snapshot, PoolKind::large, 0, active_bytes, 0);
  return snap;
}

std::string PinnedAllocator::settings() const {
  const Impl& m = *impl_;
  return fmt::format(
      "pinned: source={}, min_alignment_bytes={}, direct_min_bytes={}, region_bytes={}, background_period_us={}, {}",
      m.source.caps().name, m.options.min_alignment_bytes, m.options.direct_min_bytes, m.options.region_bytes,
      m.options.background_period_us,
                     detail::JemallocArena::global_options());
}

PinnedAllocator::HookCalls PinnedAllocator::hook_calls() const noexcept {
  const auto c = impl_->arena->hook_counts();
  return {c.allocs, c.dallocs, c.destroys, c.decommit_refusals, c.purge_lazy_refusals + c.purge_forced_refusals,
          c.merges, c.merge_refusals, c.splits};
}

void PinnedAllocator::check_invariants() const {
  const Impl& m = *impl_;
  m.regions.check_invariants();
  const auto regions = m.regions.copy();
  const auto blocks = m.blocks.copy();
  std::size_t allocated = 0, requested = 0, pending = 0, live = 0, pending_n = 0, in_arena = 0;
  std::uintptr_t prev_end = 0;
  auto region = regions.begin();
  for (const auto& [addr, rec] : blocks) {
    if (addr < prev_end) broken(fmt::format("blocks overlap at {:#x}", addr));
    prev_end = addr + rec.size_bytes;
    if (addr % m.options.min_alignment_bytes != 0) broken(fmt::format("block {:#x} is misaligned", addr));
    while (region != regions.end() && region->region.end() <= addr) ++region;
    if (region == regions.end() || addr < region->region.base || prev_end > region->region.end())
      broken(fmt::format("block [{:#x}, +{}) is not inside one region", addr, rec.size_bytes));
    for (const auto& [fb, fs] : region->free_ranges)
      if (addr < fb + fs && fb < prev_end) broken(fmt::format("block {:#x} overlaps a free range", addr));
    if (rec.size_bytes != m.size_class(rec.requested_bytes) || rec.direct != m.is_direct(rec.requested_bytes))
      broken(fmt::format("block {:#x} has size {} but its request {} has another size class", addr, rec.size_bytes,
                         rec.requested_bytes));
    if (!rec.direct) in_arena += rec.size_bytes;
    if (rec.pending_free) {
      pending += rec.size_bytes;
      ++pending_n;
    } else {
      allocated += rec.size_bytes;
      requested += rec.requested_bytes;
      ++live;
    }
  }
  if (allocated != m.allocated_bytes.load() || requested != m.requested_bytes.load() ||
      pending != m.pending_bytes.load() || live != m.allocations.load() || pending_n != m.pending_count.load() ||
      pending_n != m.deferred.size())
    broken(fmt::format("totals disagree with the blocks: allocated {} vs {}, requested {} vs {}, pending {} vs {}, "
                       "blocks {} vs {}, pending blocks {} vs {} (queue {})",
                       allocated, m.allocated_bytes.load(), requested, m.requested_bytes.load(), pending,
                       m.pending_bytes.load(), live, m.allocations.load(), pending_n, m.pending_count.load(),
                       m.deferred.size()));
  const auto js = m.arena->stats();
  if (js.small_allocated_bytes + js.large_allocated_bytes != in_arena)
    broken(fmt::format("jemalloc counts {} bytes allocated in the arena, the block table {}",
                       js.small_allocated_bytes + js.large_allocated_bytes, in_arena));
}

}  // namespace gpumem::pinned
