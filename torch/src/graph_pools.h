// GraphPools: the private memory pools of one CUDA device: CUDA graphs' pools (torch.cuda.graph,
// make_graphed_callables, torch.compile's cudagraph trees) and torch.cuda.MemPool. Design and
// reasoning: docs/notes/graph-pools.md (Note [Graph pools]).
//
// A pool is an engine of its own (alloc::CachingAllocator) on the device's memory source, with the
// device's statistics and trace observers attached: its blocks are never handed out outside it,
// the device's numbers include it, and releasing the pool is emptying and dropping its engine.
// Frees find the pool by pointer (the pointer registry knows each pool's ranges under the pool's
// owner id; find_pool). PyTorch 2.11's semantics (c10/cuda/CUDACachingAllocator.cpp):
//
//   use count  create_or_incref makes the pool with count 1 or adds 1 (a capture sharing it,
//              use_mem_pool, a MemPool); release subtracts 1. At 0 the pool is freeable: empty_cache
//              (and the OOM path, release_freeable) give its free memory back and drop it once it
//              holds nothing. A pool whose count is above 0 holds its memory (engine holding): a
//              replay of a graph writes the addresses its capture used, allocated now or not.
//   capture    begin_allocate_to_pool(id, filter) increfs and appends (id, filter) to the captures
//              underway; an allocation goes to the first pool whose filter accepts its stream (the
//              filter checks the stream's capture id, or the calling thread for use_mem_pool).
//              end_allocate_to_pool removes the entry; the reference stays until release.
//   gate       while any capture is underway every engine of the device is capturing (no event
//              queries, waits or releases: Note [Engine during graph capture]) and the device's
//              CaptureGate is open, so its events defer markers (capture_events.h).
//   checkpoint checkpoint() records a pool's blocks; restore() frees every block allocated in it
//              now and re-allocates the recorded ones at their addresses (cudagraph trees).
//
// Errors a program can cause (an unknown or released pool, a capture begun twice) come back as a
// PoolError with one sentence; the adapter raises it as PyTorch would.
//
// Thread-safety: every member may be called from any thread. One mutex per device (a leaf except
// that set_capturing / set_holding on engines, which take the engines' own locks, run under it);
// filters are called under it and must not call into the allocator. Engine calls for allocations
// and frees run without it: a pool is kept alive by shared_ptr while in use.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "capture_events.h"
#include "device_engine.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/forensics/engine_snapshot.h"
#include "pointer_registry.h"

namespace gpumem::torch::detail {

// c10::MempoolId_t without the c10 header: {0, 0} is the device's default pool.
using PoolId = std::pair<unsigned long long, unsigned long long>;

std::string to_string(PoolId id);

// A program error in the use of pools (the adapter raises it as c10::Error).
struct PoolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct PrivatePool {
  PoolId id;
  int device = 0;
  int owner = 0;         // the pool's ranges in the pointer registry
  int use_count = 1;     // under GraphPools' mutex
  bool freeable = false; // use_count reached 0 (PyTorch's graph_pools_freeable)
  std::unique_ptr<RegisteringSource> source;
  std::unique_ptr<CaptureAwareEvents> events;
  std::unique_ptr<alloc::CachingAllocator> engine;
};

// A pool's blocks at a moment (cudagraph trees' checkpoint): every block of every mapped run, in
// address order.
struct PoolCheckpoint {
  struct Block {
    std::uintptr_t addr = 0;
    std::size_t size_bytes = 0;
    std::size_t requested_bytes = 0;
    bool allocated = false;
  };
  int device = 0;
  PoolId id;
  std::vector<std::vector<Block>> runs;
};

// What restore() changed: the pointers it freed (every block allocated in the pool before) and the
// pointers it allocated (every block allocated in the checkpoint). A pointer may be in both.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

class GraphPools {
 public:
  using Filter = std::function<bool(alloc::StreamId)>;

  // device must outlive this; sync_device synchronizes the whole device (a pool's memory may be
  // used by a replay on any stream); empty for a simulated device.
  GraphPools(DeviceEngine& device, PointerRegistry& registry, std::function<void()> sync_device);
  ~GraphPools();
  GraphPools(const GraphPools&) = delete;
  GraphPools& operator=(const GraphPools&) = delete;

  // ---- PyTorch's calls (CUDAAllocator)
  void create_or_incref(PoolId id);
  void begin_allocate_to_pool(PoolId id, Filter filter);
  void end_allocate_to_pool(PoolId id);
  void release(PoolId id);
  int use_count(PoolId id) const;
  bool check_live_allocations(PoolId id, const std::unordered_set<void*>& expected) const;
  PoolCheckpoint checkpoint(PoolId id) const;
  PoolRestore restore(const PoolCheckpoint& checkpoint);

  // ---- routing
  // Whether any capture is underway (the one check on the allocation path).
  bool capturing() const noexcept { return device_.capture.open(); }
  // The pool the first accepting filter names, or null (the device's main engine serves).
  std::shared_ptr<PrivatePool> route(alloc::StreamId stream) const;

  // ---- memory
  // id == {0, 0}: gives back the free memory of every freeable pool and drops those left empty;
  // otherwise only that pool's, if it is freeable. Does nothing while a capture is underway.
  // Returns the bytes given back.
  std::size_t empty_cache(PoolId id);

  // ---- views
  struct Entry {
    PoolId id;
    std::shared_ptr<PrivatePool> pool;
  };
  std::vector<Entry> pools() const;  // every pool, live and freeable
  // Every pool's engine state with its id (snapshots and postmortems tag the segments with it).
  std::vector<forensics::PoolEngineView> engine_views() const;
  std::size_t size() const;

 private:
  std::shared_ptr<PrivatePool> make_pool_locked(PoolId id);
  std::shared_ptr<PrivatePool> find_locked(PoolId id) const;
  void set_engines_capturing_locked(bool capturing);

  DeviceEngine& device_;
  PointerRegistry& registry_;
  const std::function<void()> sync_device_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<PrivatePool>> pools_;        // few: a linear search is fine
  std::vector<std::pair<PoolId, Filter>> captures_;        // PyTorch's captures_underway, in order
};

// The pool a pointer registry owner id names, or null (an owner that is a device, or a pool that
// was dropped). Owner ids of pools are >= kFirstPoolOwner.
inline constexpr int kFirstPoolOwner = 1 << 20;
std::shared_ptr<PrivatePool> find_pool(int owner);
// How many pools exist in the process (frees skip the pool lookup while there are none): read on
// every free, so a variable every translation unit reads directly rather than a call.
inline std::atomic<int> g_pool_count{0};  // changed under the pool table's lock (graph_pools.cpp)
inline int pool_count() noexcept { return g_pool_count.load(std::memory_order_acquire); }

}  // namespace gpumem::torch::detail
