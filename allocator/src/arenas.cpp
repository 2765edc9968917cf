#include "arenas.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>
#include <unordered_map>

#include "cap_policy.h"
#include "engine.h"

namespace gpumem::alloc::detail {

// ==================================================================== ArenaSource

bool ArenaSource::admit(std::size_t n) {
  if (ledger_.try_add(n)) return true;
  const std::size_t cap = ledger_.cap.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  refusal_ = fmt::format(
      "the device's memory cap ({:.2f} MiB, per_process_memory_fraction or memory_limit_mb) is shared by its "
      "arenas, which hold {:.2f} MiB: {:.2f} MiB more would pass it",
      static_cast<double>(cap) / static_cast<double>(kMiB),
      static_cast<double>(ledger_.bytes.load(std::memory_order_relaxed)) / static_cast<double>(kMiB),
      static_cast<double>(n) / static_cast<double>(kMiB));
  return false;
}

SourceResult<VaRange> ArenaSource::reserve(std::size_t size_bytes, std::size_t alignment_bytes) {
  // Without virtual memory a reserved range is backed: it is physical memory.
  if (!virtual_ && !admit(size_bytes)) return {SourceStatus::out_of_memory, {}};
  {
    std::lock_guard lock(mutex_);
    refusal_.clear();
  }
  SourceResult<VaRange> r = ForwardingSource::reserve(size_bytes, alignment_bytes);
  if (!virtual_ && !r.ok()) ledger_.sub(size_bytes);
  return r;
}

SourceStatus ArenaSource::release(VaRange range) {
  const SourceStatus s = ForwardingSource::release(range);
  if (!virtual_ && s == SourceStatus::ok) ledger_.sub(range.size_bytes);
  return s;
}

SourceResult<PhysHandle> ArenaSource::create(std::size_t size_bytes) {
  if (!admit(size_bytes)) return {SourceStatus::out_of_memory, {}};
  {
    std::lock_guard lock(mutex_);
    refusal_.clear();
  }
  SourceResult<PhysHandle> r = ForwardingSource::create(size_bytes);
  if (!r.ok()) {
    ledger_.sub(size_bytes);
    return r;
  }
  try {
    std::lock_guard lock(mutex_);
    piece_bytes_.emplace(r.value, size_bytes);
  } catch (const std::bad_alloc&) {
    // The host cannot remember the piece: give it back rather than lose count of it.
    ForwardingSource::destroy(r.value);
    ledger_.sub(size_bytes);
    return {SourceStatus::out_of_memory, {}};
  }
  return r;
}

SourceStatus ArenaSource::destroy(PhysHandle handle) {
  const SourceStatus s = ForwardingSource::destroy(handle);
  if (s != SourceStatus::ok) return s;
  std::size_t n = 0;
  {
    std::lock_guard lock(mutex_);
    if (auto it = piece_bytes_.find(handle); it != piece_bytes_.end()) {
      n = it->second;
      piece_bytes_.erase(it);
    }
  }
  ledger_.sub(n);
  return s;
}

std::string ArenaSource::last_error() const {
  {
    std::lock_guard lock(mutex_);
    if (!refusal_.empty()) return refusal_;
  }
  return ForwardingSource::last_error();
}

// ==================================================================== Arenas

namespace {

std::atomic<std::uint64_t> g_next_arenas_id{1};

// How many Arenas a thread remembers its place in; the oldest place is reused when all are taken.
constexpr std::size_t kPlaces = 8;

// The Arenas alive now, by id: a thread that exits forgets its places only in those.
std::mutex g_live_mutex;
std::unordered_map<std::uint64_t, Arenas*>& live_arenas() {
  static auto* live = new std::unordered_map<std::uint64_t, Arenas*>();  // never destroyed: threads exit late
  return *live;
}

Config arena_config(const Config& c) {
  Config a = c;
  a.arenas = 1;  // thread_cache as given: threads that share an arena share its caches
  // The step planner sits in front of the arenas (CachingAllocator::planning_), not in each.
  a.step_plan = false;
  return a;
}

// Sums b into a (the largest free extent: the largest of the two).
void add_totals(EngineTotals& a, const EngineTotals& b) {
  a.allocated_bytes += b.allocated_bytes;
  a.requested_bytes += b.requested_bytes;
  a.active_bytes += b.active_bytes;
  a.reserved_bytes += b.reserved_bytes;
  a.cached_free_bytes += b.cached_free_bytes;
  a.largest_free_extent_bytes = std::max(a.largest_free_extent_bytes, b.largest_free_extent_bytes);
  a.va_reserved_bytes += b.va_reserved_bytes;
  a.segments += b.segments;
  a.pieces_mapped += b.pieces_mapped;
  a.kept_mapping_bytes += b.kept_mapping_bytes;
  a.kept_mappings += b.kept_mappings;
  a.thread_caches += b.thread_caches;
  a.thread_cached_bytes += b.thread_cached_bytes;
  a.thread_caches_on = a.thread_caches_on || b.thread_caches_on;
}

}  // namespace

// A thread's places (Arenas::Place), forgotten when the thread exits.
struct PlaceSet {
  std::array<Arenas::Place, kPlaces> places{};
  std::size_t next = 0;
  Arenas::Place* last = nullptr;  // most threads use one device's allocator
  PlaceSet() = default;
  PlaceSet(const PlaceSet&) = delete;
  PlaceSet& operator=(const PlaceSet&) = delete;
  ~PlaceSet();
};

namespace {
// The place found last, in a thread-local that needs no construction or destruction: read with no
// initialization check (t_places, which has a destructor, is reached through one on every access).
// Its owner is read from the place itself (a slot may have been given to another Arenas since).
// Cleared when the thread's places go.
thread_local Arenas::Place* t_last_place = nullptr;
}  // namespace

PlaceSet::~PlaceSet() {
  t_last_place = nullptr;
  for (const Arenas::Place& p : places)
    if (p.owner != 0) Arenas::forget_place(p);
}

Arenas::Arenas(MemorySource& src, StreamEvents& events, const Config& cfg, int dev)
    : config(cfg),
      source(src),
      device(dev),
      id_(g_next_arenas_id.fetch_add(1, std::memory_order_relaxed)),
      arena_config_(arena_config(cfg)),
      events_(events),
      fraction_(std::clamp(cfg.per_process_memory_fraction, 0.0, 1.0)),
      limit_bytes_(cfg.memory_limit_bytes),
      provider_total_(src.mem_info().total_bytes) {
  {
    std::lock_guard lock(mutex_);
    update_cap_locked();
    if (make_arena_locked() == nullptr) throw std::bad_alloc();
  }
  std::lock_guard live(g_live_mutex);
  live_arenas().emplace(id_, this);
}

// owned_ then destroys the arenas, each giving its memory back to the source.
Arenas::~Arenas() {
  std::lock_guard live(g_live_mutex);
  live_arenas().erase(id_);
}

void Arenas::forget_place(const Place& place) noexcept {
  std::lock_guard live(g_live_mutex);
  auto it = live_arenas().find(place.owner);
  if (it != live_arenas().end()) it->second->users_[place.arena].fetch_sub(1, std::memory_order_relaxed);
}

Arenas::Arena* Arenas::make_arena_locked() {
  const unsigned i = count_.load(std::memory_order_relaxed);
  std::unique_ptr<Arena> a;
  try {
    owned_.reserve(owned_.size() + 1);
    a = std::make_unique<Arena>(source, ledger_, events_, arena_config_, device);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  CachingAllocator& e = a->engine;
  e.impl_->seq_source = &seq_;
  e.impl_->arenas = this;
  e.impl_->device_footprint = &ledger_.bytes;
  if (i >= 1) {
    // More than one arena from now on: no StatsObserver counts in place in any of them (Note
    // [Stats in place]). Bound to the first, it would apply every other arena's events under the
    // first arena's lock, and the arenas would wait on each other there; unbound, it takes their
    // events on its own, in per-thread shards once they meet.
    e.impl_->may_bind_stats.store(false, std::memory_order_relaxed);
    if (i == 1) unbind_stats(engine(0));
  }
  if (capturing_) e.set_capturing(true);
  if (holding_) e.set_holding(true);
  e.set_memory_fraction(fraction_);
  e.set_memory_limit(limit_bytes_);
  for (const auto& o : observers_) e.attach_observer(o);
  Arena* raw = a.get();
  owned_.push_back(std::move(a));
  arenas_[i].store(raw, std::memory_order_release);
  count_.store(i + 1, std::memory_order_release);
  if (i >= 1) routing_.store(true, std::memory_order_relaxed);
  return raw;
}

void Arenas::unbind_stats(CachingAllocator& first) {
  CachingAllocator::Impl& m = *first.impl_;
  StatsObserver* sink = nullptr;
  {
    std::lock_guard lock(m.mutex);
    m.may_bind_stats.store(false, std::memory_order_relaxed);
    sink = m.stats_sink.exchange(nullptr, std::memory_order_relaxed);
    m.sync_sink_alone_locked();
  }
  if (sink != nullptr) sink->unbind_engine();
}

void Arenas::update_cap_locked() {
  ledger_.cap.store(policy::cap_bytes(fraction_, limit_bytes_, provider_total_), std::memory_order_relaxed);
}

namespace {
thread_local PlaceSet t_places;
}  // namespace

[[gnu::always_inline]] inline Arenas::Place* Arenas::last_place() const noexcept {
  Place* last = t_last_place;
  return last != nullptr && last->owner == id_ ? last : nullptr;
}

Arenas::Place* Arenas::find_place() const noexcept {
  if (Place* last = last_place()) [[likely]]
    return last;
  return find_place_in_set();
}

Arenas::Place* Arenas::find_place_in_set() const noexcept {
  PlaceSet& set = t_places;
  if (set.last != nullptr && set.last->owner == id_) return remember(set.last);
  for (Place& p : set.places)
    if (p.owner == id_) return remember(set.last = &p);
  return nullptr;
}

Arenas::Place* Arenas::remember(Place* place) noexcept {
  t_last_place = place;
  return place;
}

Arenas::Place& Arenas::place_for_this_thread() noexcept {
  if (Place* p = find_place()) return *p;
  PlaceSet& set = t_places;
  Place& p = set.places[set.next];
  set.next = (set.next + 1) % kPlaces;
  if (p.owner != 0) forget_place(p);
  p = Place{id_, 0, 0};
  users_[0].fetch_add(1, std::memory_order_relaxed);
  return *remember(set.last = &p);
}

bool Arenas::note_wait() noexcept {
  Place& place = place_for_this_thread();
  if (users_[place.arena].load(std::memory_order_relaxed) <= 1) {
    place.contended = 0;  // alone in its arena: nothing to move away from
    return false;
  }
  waits_.fetch_add(1, std::memory_order_relaxed);
  if (place.move_due || move_options(place.arena).any()) {
    if (++place.contended < kMoveAfterContended) return false;
    place.contended = 0;
    place.move_due = true;
    routing_.store(true, std::memory_order_relaxed);
    return false;
  }
  // Shared, and no arena to move to: the threads stay together, and caches serve them.
  return true;
}

Arenas::MoveOptions Arenas::move_options(unsigned from) const noexcept {
  // Where to: an arena no thread uses now (its threads exited: its memory is there to reuse), else
  // a new one while fewer than engines_per_device(config) exist, else the arena with the fewest
  // threads if that evens the load (a thread that exits leaves its arena to the next one that
  // needs it).
  MoveOptions o;
  const unsigned n = count();
  unsigned fewest = from;
  for (unsigned i = 0; i < n; ++i) {
    if (i == from) continue;
    const unsigned u = users_[i].load(std::memory_order_relaxed);
    if (u == 0 && o.unused == kMaxArenas) o.unused = i;
    if (u < users_[fewest].load(std::memory_order_relaxed)) fewest = i;
  }
  o.may_make = n < engines_per_device(config);
  if (fewest != from &&
      users_[fewest].load(std::memory_order_relaxed) + 1 < users_[from].load(std::memory_order_relaxed))
    o.evener = fewest;
  return o;
}

bool Arenas::move(Place& place) {
  const unsigned from = place.arena;
  if (!move_place(place)) return false;
  // The thread's cache in the arena it left (thread caches come on in an arena whose lock is
  // contended) goes back now: its leases would otherwise hold free memory that no allocation of
  // the thread uses until it exits. Without the arenas' mutex: this takes the engine's lock.
  engine(from).impl_->retire_this_threads_cache();
  return true;
}

bool Arenas::move_place(Place& place) {
  std::lock_guard lock(mutex_);
  const unsigned from = place.arena, n = count();
  const MoveOptions o = move_options(from);
  unsigned to = o.unused;
  if (to == kMaxArenas && o.may_make && make_arena_locked() != nullptr) to = n;
  if (to == kMaxArenas) to = o.evener;
  if (to == kMaxArenas) return false;
  users_[from].fetch_sub(1, std::memory_order_relaxed);
  users_[to].fetch_add(1, std::memory_order_relaxed);
  place.arena = to;
  return true;
}

bool Arenas::move_this_thread() { return move(place_for_this_thread()); }

bool Arenas::thread_caches_on() const noexcept {
  const unsigned n = count();
  for (unsigned i = 0; i < n; ++i)
    if (engine(i).impl_->use_caches()) return true;
  return false;
}

unsigned Arenas::arena_if_placed() const noexcept {
  // Looks only: a thread that frees or looks up, and never allocates, takes no place (it would
  // count as a user of an arena, and a thread alone in its arena never moves).
  const Place* p = find_place();
  return p != nullptr ? p->arena : 0;
}

template <class F>
void Arenas::for_owner(F&& f) const {
  // The calling thread's arena first: a thread usually frees what it allocated.
  const unsigned own = arena_if_placed();
  if (f(engine(own))) return;
  const unsigned n = count();
  for (unsigned i = 0; i < n; ++i)
    if (i != own && f(engine(i))) return;
}

// ---------------------------------------------------------------- requests

CachingAllocator::Impl& Arenas::engine_for_allocation() {
  // CachingAllocator::allocate calls the first arena while it is alone and nobody is due to move;
  // then the calling thread's arena, moving it first if its waits made it due.
  if (const Place* last = last_place(); last != nullptr && !last->move_due) [[likely]]
    return *engine(last->arena).impl_;
  return engine_for_allocation_placing();
}

CachingAllocator::Impl& Arenas::engine_for_allocation_placing() {
  Place& place = place_for_this_thread();
  if (place.move_due) [[unlikely]] {
    place.move_due = false;
    move(place);  // may make no arena (the host is out of memory): routing stays on, as it is cheap
  }
  return *engine(place.arena).impl_;
}

void Arenas::retry_out_of_memory(CachingAllocator::Impl& own, std::size_t size_bytes, StreamId stream,
                                 AllocResult& result) {
  // Once per request: the retry's own failure is the answer.
  thread_local bool retrying = false;
  const unsigned n = count();
  if (retrying || n == 1) return;
  unsigned own_index = 0;
  for (unsigned i = 0; i < n; ++i)
    if (engine(i).impl_.get() == &own) own_index = i;
  // The engine's own retry has released this arena's cache; the others give theirs back.
  for (unsigned i = 0; i < n; ++i)
    if (i != own_index) engine(i).empty_cache();
  retrying = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{retrying};
  result = own.allocate(size_bytes, stream);
  if (!result.ok())
    result.oom->detail += fmt::format("{}arena {} of {}: the other arenas' cached memory was released and the request "
                                      "tried again",
                                      result.oom->detail.empty() ? "" : "; ", own_index, n);
}

CachingAllocator::Impl& Arenas::engine_for_free() const noexcept {
  // arena_if_placed, with the first look inline (a free is as frequent as an allocation).
  const Place* p = last_place();
  if (p == nullptr) [[unlikely]]
    p = find_place_in_set();
  return *engine(p != nullptr ? p->arena : 0).impl_;
}

FreeStatus Arenas::free_elsewhere(void* ptr, const CachingAllocator::Impl& tried) {
  FreeStatus status = FreeStatus::foreign_pointer;
  for (unsigned i = 0, n = count(); i < n && status == FreeStatus::foreign_pointer; ++i) {
    CachingAllocator& e = engine(i);
    if (e.impl_.get() != &tried) status = e.free(ptr);
  }
  return status;
}

FreeStatus Arenas::record_stream(void* ptr, StreamId stream) {
  if (ptr == nullptr) return FreeStatus::null_pointer;
  FreeStatus status = FreeStatus::foreign_pointer;
  for_owner([&](CachingAllocator& e) {
    status = e.record_stream(ptr, stream);
    return status != FreeStatus::foreign_pointer;
  });
  return status;
}

FreeStatus Arenas::allocate_at(void* ptr, std::size_t size_bytes, std::size_t requested_bytes) {
  FreeStatus status = FreeStatus::foreign_pointer;
  for_owner([&](CachingAllocator& e) {
    status = e.allocate_at(ptr, size_bytes, requested_bytes);
    return status != FreeStatus::foreign_pointer;
  });
  return status;
}

std::optional<BlockLookup> Arenas::lookup(const void* ptr) const {
  std::optional<BlockLookup> found;
  for_owner([&](CachingAllocator& e) {
    found = e.lookup(ptr);
    return found.has_value();
  });
  return found;
}

void Arenas::empty_cache() {
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).empty_cache();
}

// ---------------------------------------------------------------- settings

void Arenas::set_capturing(bool capturing) {
  std::lock_guard lock(mutex_);
  capturing_ = capturing;
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).set_capturing(capturing);
}

void Arenas::set_holding(bool holding) {
  std::lock_guard lock(mutex_);
  holding_ = holding;
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).set_holding(holding);
}

bool Arenas::capturing() const {
  std::lock_guard lock(mutex_);
  return capturing_;
}

bool Arenas::holding() const {
  std::lock_guard lock(mutex_);
  return holding_;
}

void Arenas::set_memory_fraction(double fraction) {
  std::lock_guard lock(mutex_);
  fraction_ = std::clamp(fraction, 0.0, 1.0);
  update_cap_locked();
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).set_memory_fraction(fraction_);
}

double Arenas::memory_fraction() const {
  std::lock_guard lock(mutex_);
  return fraction_;
}

void Arenas::set_memory_limit(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  limit_bytes_ = bytes;
  update_cap_locked();
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).set_memory_limit(bytes);
}

void Arenas::attach_observer(std::shared_ptr<AllocObserver> observer) {
  std::lock_guard lock(mutex_);
  observers_.push_back(observer);
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).attach_observer(observer);
}

void Arenas::detach_observer(const AllocObserver* observer) {
  std::lock_guard lock(mutex_);
  std::erase_if(observers_, [&](const std::shared_ptr<AllocObserver>& o) { return o.get() == observer; });
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).detach_observer(observer);
}

// ---------------------------------------------------------------- views

EngineSnapshot Arenas::snapshot() {
  EngineSnapshot snap;
  snap.device = device;
  snap.settings = to_string(config);
  snap.totals.cap_bytes = ledger_.cap.load(std::memory_order_relaxed);
  for (unsigned i = 0, n = count(); i < n; ++i) {
    EngineSnapshot one = engine(i).snapshot();
    add_totals(snap.totals, one.totals);
    for (SegmentView& s : one.segments) snap.segments.push_back(std::move(s));
  }
  snap.totals.arenas = count();
  std::sort(snap.segments.begin(), snap.segments.end(),
            [](const SegmentView& a, const SegmentView& b) { return a.base < b.base; });
  return snap;
}

EngineTotals Arenas::totals() const {
  EngineTotals t;
  t.cap_bytes = ledger_.cap.load(std::memory_order_relaxed);
  const unsigned n = count();
  for (unsigned i = 0; i < n; ++i) add_totals(t, engine(i).totals());
  t.arenas = n;
  return t;
}

EngineLockCounts Arenas::lock_counts() const noexcept {
  EngineLockCounts c;
  for (unsigned i = 0, n = count(); i < n; ++i) {
    const EngineLockCounts one = engine(i).lock_counts();
    c.acquisitions += one.acquisitions;
    c.contended += one.contended;
  }
  return c;
}

std::uint64_t Arenas::churn_openings() const noexcept {
  std::uint64_t n = 0;
  for (unsigned i = 0, count_now = count(); i < count_now; ++i) n += engine(i).churn_openings();
  return n;
}

std::vector<ExpandableRegionSize> Arenas::expandable_region_sizes() const {
  std::vector<ExpandableRegionSize> out;
  for (unsigned i = 0, n = count(); i < n; ++i)
    for (const ExpandableRegionSize& r : engine(i).expandable_region_sizes()) out.push_back(r);
  return out;
}

std::size_t Arenas::largest_free_block_bytes() const {
  std::size_t m = 0;
  for (unsigned i = 0, n = count(); i < n; ++i) m = std::max(m, engine(i).largest_free_block_bytes());
  return m;
}

void Arenas::check_invariants() const {
  for (unsigned i = 0, n = count(); i < n; ++i) engine(i).check_invariants();
}

}  // namespace gpumem::alloc::detail

void gpumem::alloc::CachingAllocator::Impl::note_wait_in_arenas() noexcept {
  if (arenas->note_wait() && thread_caches.enabled) thread_caches.active.store(true, std::memory_order_relaxed);
}
