#include "graph_pools.h"

#include <algorithm>
#include <shared_mutex>
#include <unordered_map>

#include "snapshot_ranges.h"

namespace gpumem::torch::detail {
namespace {

// A MemorySource that forwards to the device's source without owning it: every pool of a device
// takes its pieces from the same provider (and, on a simulated device, the same capacity).
class SourceView final : public alloc::ForwardingSource {
 public:
  using ForwardingSource::ForwardingSource;
};

// Pools by pointer-registry owner id, for frees that arrive with a bare pointer.
struct OwnerTable {
  std::shared_mutex mutex;
  std::unordered_map<int, std::shared_ptr<PrivatePool>> pools;
  std::atomic<int> next_owner{kFirstPoolOwner};
};

OwnerTable& owners() {
  static auto* table = new OwnerTable();  // never destroyed: frees may run during exit
  return *table;
}

}  // namespace

std::string to_string(PoolId id) { return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")"; }

std::shared_ptr<PrivatePool> find_pool(int owner) {
  OwnerTable& t = owners();
  std::shared_lock lock(t.mutex);
  auto it = t.pools.find(owner);
  return it == t.pools.end() ? nullptr : it->second;
}

GraphPools::GraphPools(DeviceEngine& device, PointerRegistry& registry, std::function<void()> sync_device)
    : device_(device), registry_(registry), sync_device_(std::move(sync_device)) {}

GraphPools::~GraphPools() {
  OwnerTable& t = owners();
  std::unique_lock lock(t.mutex);
  for (const auto& pool : pools_)
    if (t.pools.erase(pool->owner) != 0) g_pool_count.fetch_sub(1, std::memory_order_release);
}

std::shared_ptr<PrivatePool> GraphPools::find_locked(PoolId id) const {
  for (const auto& pool : pools_)
    if (pool->id == id) return pool;
  return nullptr;
}

std::shared_ptr<PrivatePool> GraphPools::make_pool_locked(PoolId id) {
  auto pool = std::make_shared<PrivatePool>();
  pool->id = id;
  pool->device = device_.device;
  OwnerTable& t = owners();
  pool->owner = t.next_owner.fetch_add(1, std::memory_order_relaxed);
  pool->source = std::make_unique<RegisteringSource>(std::make_unique<SourceView>(device_.source->inner()),
                                                     registry_, pool->owner);
  pool->events = std::make_unique<CaptureAwareEvents>(*device_.device_events, device_.capture, sync_device_);
  // A pool never moves pieces (recycling would synchronize, and must not take memory a replay
  // writes); the rest of the device's settings apply as they are.
  alloc::Config config = device_.config.engine;
  config.recycle = false;
  // One engine per pool: a capture allocates from one thread, and arenas would split the memory a
  // pool holds for its replays (arenas:N applies to the device's engine).
  config.arenas = 1;
  // Nor a step planner (step_plan): a pool holds its memory for replays, and an arena taken for a
  // plan would stay held; gpumem.step() marks the device's engine only.
  config.step_plan = false;
  pool->engine = std::make_unique<alloc::CachingAllocator>(*pool->source, *pool->events, config, device_.device);
  pool->engine->set_memory_fraction(device_.engine->memory_fraction());
  pool->engine->set_holding(true);
  if (!captures_.empty()) pool->engine->set_capturing(true);
  pool->engine->attach_observer(device_.stats);
  pool->engine->attach_observer(device_.trace);
  {
    std::unique_lock lock(t.mutex);
    t.pools.emplace(pool->owner, pool);
    g_pool_count.fetch_add(1, std::memory_order_release);
  }
  pools_.push_back(pool);
  return pool;
}

void GraphPools::create_or_incref(PoolId id) {
  std::lock_guard lock(mutex_);
  if (auto pool = find_locked(id)) {
    if (pool->freeable)
      throw PoolError("gpumem: private pool " + to_string(id) +
                      " was released by every graph and MemPool that used it (use count 0); a released pool "
                      "cannot be used again. Keep a reference to it (its MemPool, or a graph that uses it) while "
                      "you share it");
    ++pool->use_count;
    return;
  }
  make_pool_locked(id);
}

void GraphPools::set_engines_capturing_locked(bool capturing) {
  device_.engine->set_capturing(capturing);
  for (const auto& pool : pools_) pool->engine->set_capturing(capturing);
}

void GraphPools::begin_allocate_to_pool(PoolId id, Filter filter) {
  std::lock_guard lock(mutex_);
  for (const auto& [underway, f] : captures_)
    if (underway == id)
      throw PoolError("gpumem: beginAllocateToPool: already recording to private pool " + to_string(id) +
                      " (a capture or use_mem_pool context into this pool is underway; end it first)");
  if (auto pool = find_locked(id)) {
    if (pool->freeable)
      throw PoolError("gpumem: private pool " + to_string(id) +
                      " was released by every graph and MemPool that used it (use count 0) and cannot take "
                      "allocations again");
    ++pool->use_count;
  } else {
    make_pool_locked(id);
  }
  if (captures_.empty()) {
    // The gate first (markers defer from now on), then the engines (each waits for a growth or
    // release in progress, which may be synchronizing, before it returns).
    device_.capture.captures.store(1, std::memory_order_release);
    set_engines_capturing_locked(true);
  }
  captures_.emplace_back(id, std::move(filter));
  device_.capture.captures.store(static_cast<int>(captures_.size()), std::memory_order_release);
}

void GraphPools::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(captures_.begin(), captures_.end(), [&](const auto& c) { return c.first == id; });
  if (it == captures_.end())
    throw PoolError("gpumem: endAllocateToPool: not currently recording to private pool " + to_string(id));
  captures_.erase(it);
  if (captures_.empty()) {
    set_engines_capturing_locked(false);
    device_.capture.captures.store(0, std::memory_order_release);
    return;
  }
  device_.capture.captures.store(static_cast<int>(captures_.size()), std::memory_order_release);
}

void GraphPools::release(PoolId id) {
  std::lock_guard lock(mutex_);
  auto pool = find_locked(id);
  if (!pool || pool->freeable)
    throw PoolError("gpumem: releasePool: private pool " + to_string(id) +
                    (pool ? " was already released by every user (use count 0)" : " does not exist on this device"));
  if (--pool->use_count == 0) {
    pool->freeable = true;
    pool->engine->set_holding(false);  // empty_cache may give its free memory back now
  }
}

int GraphPools::use_count(PoolId id) const {
  std::lock_guard lock(mutex_);
  auto pool = find_locked(id);
  if (!pool) throw PoolError("gpumem: private pool " + to_string(id) + " does not exist on this device");
  return pool->use_count;
}

std::shared_ptr<PrivatePool> GraphPools::route(alloc::StreamId stream) const {
  std::lock_guard lock(mutex_);
  for (const auto& [id, filter] : captures_)
    if (filter(stream)) return find_locked(id);
  return nullptr;
}

std::size_t GraphPools::empty_cache(PoolId id) {
  if (device_.capture.open()) return 0;  // nothing may be waited for or released during a capture
  const bool all = id == PoolId{0, 0};
  std::vector<std::shared_ptr<PrivatePool>> chosen;
  {
    std::lock_guard lock(mutex_);
    for (const auto& pool : pools_)
      if (pool->freeable && (all || pool->id == id)) chosen.push_back(pool);
  }
  std::size_t released = 0;
  for (const auto& pool : chosen) {
    const std::size_t before = pool->engine->totals().reserved_bytes;
    pool->engine->empty_cache();
    const std::size_t after = pool->engine->totals().reserved_bytes;
    released += before > after ? before - after : 0;
  }
  std::vector<std::shared_ptr<PrivatePool>> dropped;
  {
    std::lock_guard lock(mutex_);
    for (const auto& pool : chosen) {
      const alloc::EngineTotals t = pool->engine->totals();
      if (!pool->freeable || t.reserved_bytes != 0 || t.active_bytes != 0 || t.segments != 0) continue;
      pools_.erase(std::find(pools_.begin(), pools_.end(), pool));
      dropped.push_back(pool);
    }
  }
  if (!dropped.empty()) {
    OwnerTable& t = owners();
    std::unique_lock lock(t.mutex);
    for (const auto& pool : dropped)
      if (t.pools.erase(pool->owner) != 0) g_pool_count.fetch_sub(1, std::memory_order_release);
  }
  return released;  // the dropped engines go with the last reference (here, or a free in flight)
}

bool GraphPools::check_live_allocations(PoolId id, const std::unordered_set<void*>& expected) const {
  std::shared_ptr<PrivatePool> pool;
  {
    std::lock_guard lock(mutex_);
    pool = find_locked(id);
  }
  if (!pool) throw PoolError("gpumem: checkPoolLiveAllocations: could not find private pool " + to_string(id));
  std::size_t allocated = 0;
  for (const auto& segment : pool->engine->snapshot().segments)
    for (const auto& block : segment.blocks) {
      if (block.state != alloc::BlockState::allocated) continue;
      if (!expected.count(reinterpret_cast<void*>(block.addr))) return false;
      ++allocated;
    }
  return allocated == expected.size();
}

PoolCheckpoint GraphPools::checkpoint(PoolId id) const {
  std::shared_ptr<PrivatePool> pool;
  {
    std::lock_guard lock(mutex_);
    pool = find_locked(id);
  }
  if (!pool) throw PoolError("gpumem: getCheckpointState: could not find private pool " + to_string(id));
  if (pool->freeable)
    throw PoolError("gpumem: getCheckpointState: private pool " + to_string(id) +
                    " was released (use count 0); a released pool cannot be checkpointed");
  PoolCheckpoint cp;
  cp.device = device_.device;
  cp.id = id;
  for (const auto& segment : pool->engine->snapshot().segments) {
    for (const auto& run : mapped_runs(segment)) {
      auto& blocks = cp.runs.emplace_back();
      for (const auto& b : run.blocks) {
        // Pending frees count as free: a restore happens when the streams are idle (it waits).
        const bool allocated = b.state == alloc::BlockState::allocated;
        blocks.push_back({b.addr, b.size_bytes, allocated ? b.requested_bytes : 0, allocated});
      }
    }
  }
  return cp;
}

PoolRestore GraphPools::restore(const PoolCheckpoint& cp) {
  std::shared_ptr<PrivatePool> pool;
  {
    std::lock_guard lock(mutex_);
    pool = find_locked(cp.id);
  }
  if (!pool) throw PoolError("gpumem: setCheckpointPoolState: could not find private pool " + to_string(cp.id));
  if (pool->freeable)
    throw PoolError("gpumem: setCheckpointPoolState: private pool " + to_string(cp.id) +
                    " was released (use count 0); a released pool cannot be restored");
  alloc::CachingAllocator& engine = *pool->engine;
  PoolRestore result;
  // Free every block allocated now...
  for (const auto& segment : engine.snapshot().segments)
    for (const auto& b : segment.blocks)
      if (b.state == alloc::BlockState::allocated) result.freed.push_back(reinterpret_cast<void*>(b.addr));
  for (void* p : result.freed) {
    const alloc::FreeStatus status = engine.free(p);
    if (status != alloc::FreeStatus::ok)
      throw PoolError(std::string("gpumem: setCheckpointPoolState: cannot free ") + std::to_string(
                          reinterpret_cast<std::uintptr_t>(p)) + ": " + alloc::describe(status));
  }
  // ... and wait for the ones used on other streams (the pool holds its memory: nothing is given
  // back, pending frees complete).
  if (engine.totals().active_bytes != 0) engine.empty_cache();
  if (engine.totals().active_bytes != 0)
    throw PoolError("gpumem: setCheckpointPoolState: blocks of private pool " + to_string(cp.id) +
                    " are still in use on other streams (record_stream); restore the pool once that work is done");
  // ... then the checkpoint's allocations, at their addresses.
  for (const auto& run : cp.runs)
    for (const auto& b : run) {
      if (!b.allocated) continue;
      void* p = reinterpret_cast<void*>(b.addr);
      if (engine.allocate_at(p, b.size_bytes, b.requested_bytes) != alloc::FreeStatus::ok)
        throw PoolError("gpumem: setCheckpointPoolState: the checkpoint's block at " + std::to_string(b.addr) +
                        " (" + std::to_string(b.size_bytes) + " bytes) is no longer free memory of private pool " +
                        to_string(cp.id) + "; the checkpoint does not belong to this pool's current memory");
      result.allocated.push_back(p);
    }
  return result;
}

std::vector<forensics::PoolEngineView> GraphPools::engine_views() const {
  std::vector<forensics::PoolEngineView> out;
  for (const auto& entry : pools()) {  // entry keeps its pool alive while the engine is read
    forensics::PoolEngineView& view = out.emplace_back();
    view.pool_id = {static_cast<std::int64_t>(entry.id.first), static_cast<std::int64_t>(entry.id.second)};
    view.engine = entry.pool->engine->snapshot();
  }
  return out;
}

std::vector<GraphPools::Entry> GraphPools::pools() const {
  std::lock_guard lock(mutex_);
  std::vector<Entry> out;
  out.reserve(pools_.size());
  for (const auto& pool : pools_) out.push_back({pool->id, pool});
  return out;
}

std::size_t GraphPools::size() const {
  std::lock_guard lock(mutex_);
  return pools_.size();
}

}  // namespace gpumem::torch::detail
