// Private pools (CUDA graphs, torch.cuda.MemPool, cudagraph trees' checkpoints) through gpumem's
// CUDAAllocator on a simulated device (source:sim, GPUMEM_ALLOW_SIM=1), the way libtorch calls
// them: routing by the capture's filter, blocks never reused outside their pool, use counts and
// sharing, release when the last user goes, statistics and snapshots tagged with the pool, no
// event query or wait while a capture is underway, the checkpoint round trip, and one clear error
// for each misuse. Plus CaptureAwareEvents alone (torch/src/capture_events.h).
//
// Addresses are fake: nothing here dereferences them. The allocator is one per process, so every
// case leaves no pool behind.
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <variant>
#include <vector>

#include "capture_events.h"
#include "catch.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/forensics/snapshot_io.h"
#include "gpumem/torch/c_api.h"
#include "gpumem/torch/cuda_allocator.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"
#include "sim_support.h"

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

cca::CUDAAllocator& sim_allocator() { return gpumem::test::sim_allocator("source:sim,memory_limit_mb:2048"); }
using gpumem::test::error_of;

cudaStream_t stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }
void* alloc(std::size_t n, std::uintptr_t s = 0) { return gpumem_malloc(n, 0, stream(s)); }
void release(void* p) { gpumem_free(p, 0, 0, nullptr); }

// What torch.cuda.graph's capture_begin installs: a filter accepting the capture's stream.
std::function<bool(cudaStream_t)> capture_filter(std::uintptr_t capturing) {
  return [capturing](cudaStream_t s) { return s == stream(capturing); };
}

std::int64_t reserved() { return cca::getDeviceStats(0).reserved_bytes[0].current; }
std::int64_t active() { return cca::getDeviceStats(0).active_bytes[0].current; }

// The segments a snapshot tags with pool id, and the addresses of their allocated blocks.
struct PoolView {
  std::size_t segments = 0;
  std::size_t total_bytes = 0;
  std::set<std::uintptr_t> allocated;
};
PoolView view(const cca::SnapshotInfo& snap, c10::MempoolId_t id) {
  PoolView v;
  for (const auto& seg : snap.segments) {
    if (seg.owner_private_pool_id != id) continue;
    ++v.segments;
    v.total_bytes += seg.total_size;
    std::uintptr_t addr = seg.address;
    for (const auto& b : seg.blocks) {
      if (b.allocated) v.allocated.insert(addr);
      addr += b.size;
    }
  }
  return v;
}

}  // namespace

TEST_CASE("pools 1: a capture's allocations go to its pool; the pool's blocks never serve others") {
  auto& a = sim_allocator();
  const c10::MempoolId_t id{1001, 0};
  const auto reserved_before = reserved();
  a.beginAllocateToPool(0, id, capture_filter(0x5000));
  CHECK(a.getPoolUseCount(0, id) == 1);
  void* in_pool = alloc(3 * kMiB, 0x5000);      // on the capturing stream: the pool
  void* small_in_pool = alloc(4096, 0x5000);
  void* outside = alloc(3 * kMiB, 0x6000);      // another stream: the default pool
  const auto during = a.snapshot({0, 0}, false);
  CHECK(view(during, id).allocated == std::set<std::uintptr_t>{reinterpret_cast<std::uintptr_t>(in_pool),
                                                                reinterpret_cast<std::uintptr_t>(small_in_pool)});
  CHECK(view(during, {0, 0}).allocated.count(reinterpret_cast<std::uintptr_t>(outside)) == 1);
  CHECK(view(during, id).segments == 2);  // one large-pool, one small-pool mapped run
  // snapshot(pool id): that pool's segments only, tagged.
  const auto only = a.snapshot(id, false);
  REQUIRE(only.segments.size() == 2);
  for (const auto& seg : only.segments) CHECK(seg.owner_private_pool_id == id);
  // The device's statistics include the pool.
  CHECK(reserved() - reserved_before >= static_cast<std::int64_t>(view(during, id).total_bytes));
  // gpumem's own snapshot (gpumem.dump_snapshot, the postmortem) holds the pool's segments, tagged.
  {
    const auto path = std::filesystem::temp_directory_path() / "gpumem_test_graph_pools_snapshot.pickle";
    gpumem::torch::write_snapshot(c10::Device(c10::kCUDA, 0), path.string());
    const auto own = gpumem::forensics::load_snapshot(path.string());
    std::filesystem::remove(path);
    std::size_t tagged = 0;
    bool in_pool_tagged = false;
    for (const auto& seg : own.segments) {
      if (seg.pool_id != std::pair<std::int64_t, std::int64_t>{1001, 0}) continue;
      ++tagged;
      for (const auto& b : seg.blocks)
        in_pool_tagged |= b.address == reinterpret_cast<std::uintptr_t>(in_pool) && b.state == "active_allocated";
    }
    CHECK(tagged == 2);
    CHECK(in_pool_tagged);
  }

  // Freed inside the pool during the capture: reused inside it, never by the default pool.
  release(in_pool);
  void* again = alloc(3 * kMiB, 0x5000);
  CHECK(again == in_pool);
  release(again);
  a.endAllocateToPool(0, id);
  void* after = alloc(3 * kMiB, 0x5000);  // same stream, capture over: the default pool
  CHECK(after != in_pool);
  CHECK(view(a.snapshot({0, 0}, false), id).allocated.size() == 1);  // small_in_pool still lives there

  // The graph goes: the pool is freeable; its free memory returns at empty_cache, the rest when
  // its last block is freed.
  a.releasePool(0, id);
  a.emptyCache({0, 0});
  CHECK(view(a.snapshot({0, 0}, false), id).segments == 1);
  release(small_in_pool);
  a.emptyCache({0, 0});
  CHECK(view(a.snapshot({0, 0}, false), id).segments == 0);
  CHECK(error_of([&] { a.getPoolUseCount(0, id); }).find("does not exist") != std::string::npos);
  release(outside);
  release(after);
  a.emptyCache({0, 0});
  CHECK(reserved() == reserved_before);
}

TEST_CASE("pools 2: graphs share a pool; memory returns only when the last one goes") {
  auto& a = sim_allocator();
  const c10::MempoolId_t shared{0, 2001};  // graph_pool_handle(): the second value set
  const auto reserved_before = reserved();
  a.createOrIncrefPool(0, shared, nullptr);  // graph_pool_handle's MemPool, or a first graph
  CHECK(a.getPoolUseCount(0, shared) == 1);
  a.beginAllocateToPool(0, shared, capture_filter(0x5000));  // graph 1 captures into it
  CHECK(a.getPoolUseCount(0, shared) == 2);
  void* g1 = alloc(8 * kMiB, 0x5000);
  release(g1);  // freed during capture: a free block of the pool (the graph still writes it)
  a.endAllocateToPool(0, shared);
  a.beginAllocateToPool(0, shared, capture_filter(0x5000));  // graph 2 shares it
  CHECK(a.getPoolUseCount(0, shared) == 3);
  void* g2 = alloc(8 * kMiB, 0x5000);
  CHECK(g2 == g1);  // sharing: graph 2 reuses what graph 1 freed, inside the pool
  release(g2);
  a.endAllocateToPool(0, shared);
  const auto with_pool = reserved();
  CHECK(with_pool > reserved_before);

  a.releasePool(0, shared);  // the handle goes
  a.releasePool(0, shared);  // graph 1 goes
  a.emptyCache({0, 0});
  CHECK(reserved() == with_pool);  // graph 2 may still replay: the pool keeps its memory
  a.emptyCache(shared);            // nor does emptying the pool alone give it back
  CHECK(reserved() == with_pool);
  CHECK(a.getPoolUseCount(0, shared) == 1);
  a.releasePool(0, shared);        // graph 2 goes
  a.emptyCache(shared);            // MemPool's destructor: emptyCache(id)
  CHECK(reserved() == reserved_before);
  CHECK(error_of([&] { a.releasePool(0, shared); }).find("does not exist") != std::string::npos);
}

TEST_CASE("pools 3: use_mem_pool routes by thread; MemPool round trip") {
  auto& a = sim_allocator();
  const c10::MempoolId_t pool{0, 3001};
  a.createOrIncrefPool(0, pool, nullptr);  // MemPool()
  // torch.cuda.use_mem_pool: _cuda_beginAllocateCurrentThreadToPool + endAllocateToPool + releasePool
  const auto me = std::this_thread::get_id();
  a.beginAllocateToPool(0, pool, [me](cudaStream_t) { return std::this_thread::get_id() == me; });
  void* mine = alloc(2 * kMiB);
  void* theirs = nullptr;
  std::thread other([&] { theirs = alloc(2 * kMiB); });
  other.join();
  a.endAllocateToPool(0, pool);
  a.releasePool(0, pool);
  CHECK(a.getPoolUseCount(0, pool) == 1);
  const auto snap = a.snapshot(pool, true);
  CHECK(view(snap, pool).allocated == std::set<std::uintptr_t>{reinterpret_cast<std::uintptr_t>(mine)});
  release(theirs);
  // MemPool.__del__: setUseOnOOM(false), releasePool, emptyCache(id). The tensor outlives it.
  a.setUseOnOOM(0, pool, false);
  a.releasePool(0, pool);
  a.emptyCache(pool);
  CHECK(view(a.snapshot({0, 0}, false), pool).allocated.size() == 1);
  release(mine);  // freed into the released pool...
  a.emptyCache({0, 0});  // ...which the next empty_cache drops
  CHECK(view(a.snapshot({0, 0}, false), pool).segments == 0);
}

TEST_CASE("pools 4: during a capture nothing is queried or waited for; pending frees wait for its end") {
  auto& a = sim_allocator();
  const c10::MempoolId_t id{1004, 0};
  void* used_elsewhere = alloc(6 * kMiB, 0);
  gpumem_record_stream(used_elsewhere, stream(0x7000));
  const auto active_before = active();
  a.beginAllocateToPool(0, id, capture_filter(0x5000));
  // Freed during the capture with a use on another stream: its marker is deferred (no event is
  // recorded on a stream that may be capturing), and no allocation completes it meanwhile.
  release(used_elsewhere);
  void* x = alloc(6 * kMiB, 0);
  void* y = alloc(1 * kMiB, 0x5000);
  CHECK(active() == active_before + static_cast<std::int64_t>(6 * kMiB + 1 * kMiB));
  a.emptyCache({0, 0});  // releases nothing during a capture (it would wait)
  CHECK(active() == active_before + static_cast<std::int64_t>(6 * kMiB + 1 * kMiB));
  a.endAllocateToPool(0, id);
  // After the capture the marker is recorded and the next allocation completes the free.
  void* z = alloc(512, 0);
  CHECK(active() == active_before - static_cast<std::int64_t>(6 * kMiB) +
                        static_cast<std::int64_t>(6 * kMiB + 1 * kMiB + 512));
  for (void* p : {x, y, z}) release(p);
  a.releasePool(0, id);
  a.emptyCache({0, 0});
  CHECK(view(a.snapshot({0, 0}, false), id).segments == 0);
}

TEST_CASE("pools 5: cudagraph trees' checkpoint round trip") {
  auto& a = sim_allocator();
  const c10::MempoolId_t tree{0, 5001};
  a.createOrIncrefPool(0, tree, nullptr);
  a.beginAllocateToPool(0, tree, capture_filter(0x5000));
  void* p1 = alloc(3 * kMiB, 0x5000);
  void* p2 = alloc(5 * kMiB, 0x5000);
  void* p3 = alloc(700 * 1024, 0x5000);
  void* tmp = alloc(2 * kMiB, 0x5000);
  release(tmp);
  a.endAllocateToPool(0, tree);
  a.releasePool(0, tree);  // the recording was a use_mem_pool context (begin, end, release)
  auto state = a.getCheckpointState(0, tree);  // after recording node A: p1, p2, p3 live
  REQUIRE(state != nullptr);

  // Replays and a new recording change the pool: p2 dies, a new block appears.
  release(p2);
  a.beginAllocateToPool(0, tree, capture_filter(0x5000));
  void* p4 = alloc(4 * kMiB, 0x5000);
  a.endAllocateToPool(0, tree);
  a.releasePool(0, tree);
  REQUIRE(a.checkPoolLiveAllocations(0, tree, {p1, p3, p4}));
  CHECK_FALSE(a.checkPoolLiveAllocations(0, tree, {p1, p3}));

  // Back to the checkpoint: every block allocated now is freed, the recorded ones re-allocated at
  // their addresses, with gpumem's deleter.
  auto delta = a.setCheckpointPoolState(0, state);
  CHECK(std::set<void*>(delta.ptrs_freed.begin(), delta.ptrs_freed.end()) == std::set<void*>{p1, p3, p4});
  std::set<void*> allocd;
  for (const auto& dp : delta.dataptrs_allocd) {
    allocd.insert(dp.get());
    CHECK(dp.get_deleter() == a.raw_deleter());
    CHECK(dp.device() == c10::Device(c10::DeviceType::CUDA, 0));
  }
  CHECK(allocd == std::set<void*>{p1, p2, p3});
  CHECK(a.checkPoolLiveAllocations(0, tree, {p1, p2, p3}));
  // The DataPtrs own the blocks now: destroying them frees through gpumem's deleter.
  delta.dataptrs_allocd.clear();
  CHECK(a.checkPoolLiveAllocations(0, tree, {}));

  // Misuse: a state gpumem did not make, another device's, a released pool's.
  struct Foreign : cca::AllocatorState {};
  CHECK(error_of([&] { a.setCheckpointPoolState(0, std::make_shared<Foreign>()); })
            .find("allocator state gpumem did not make") != std::string::npos);
  CHECK(error_of([&] { a.getCheckpointState(0, {0, 999999}); }).find("could not find private pool") !=
        std::string::npos);
  a.releasePool(0, tree);  // the tree goes
  CHECK(error_of([&] { a.getCheckpointState(0, tree); }).find("released") != std::string::npos);
  CHECK(error_of([&] { a.setCheckpointPoolState(0, state); }).find("released") != std::string::npos);
  a.emptyCache({0, 0});
  CHECK(view(a.snapshot({0, 0}, false), tree).segments == 0);
}

TEST_CASE("pools 6: an OOM inside a pool says so and gives nothing back during the capture") {
  auto& a = sim_allocator();
  const c10::MempoolId_t id{1006, 0};
  void* cached = alloc(1200 * kMiB, 0);
  release(cached);  // 1.2 GiB cached free in the default pool of a 2 GiB device
  a.beginAllocateToPool(0, id, capture_filter(0x5000));
  std::string message;
  try {
    alloc(1000 * kMiB, 0x5000);
  } catch (const c10::OutOfMemoryError& e) {
    message = e.what_without_backtrace();
  }
  CHECK(message.find("private pool (1006, 0)") != std::string::npos);
  a.endAllocateToPool(0, id);
  void* fits = alloc(1000 * kMiB, 0);  // the default pool's cache serves it
  release(fits);
  a.releasePool(0, id);
  a.emptyCache({0, 0});
  CHECK(view(a.snapshot({0, 0}, false), id).segments == 0);
}

TEST_CASE("pools 7: misuse gets one clear error") {
  auto& a = sim_allocator();
  const c10::MempoolId_t id{1007, 0};
  CHECK(error_of([&] { a.endAllocateToPool(0, id); }).find("not currently recording") != std::string::npos);
  CHECK(error_of([&] { a.releasePool(0, id); }).find("does not exist") != std::string::npos);
  a.beginAllocateToPool(0, id, capture_filter(0x5000));
  CHECK(error_of([&] { a.beginAllocateToPool(0, id, capture_filter(0x5000)); }).find("already recording") !=
        std::string::npos);
  a.endAllocateToPool(0, id);
  a.releasePool(0, id);
  CHECK(error_of([&] { a.createOrIncrefPool(0, id, nullptr); }).find("use count 0") != std::string::npos);
  a.emptyCache({0, 0});  // dropped (it held nothing): the id may be used afresh
  a.createOrIncrefPool(0, id, nullptr);
  CHECK(a.getPoolUseCount(0, id) == 1);
  CHECK(error_of([&] { a.setUseOnOOM(0, id, true); }).find("use_on_oom") != std::string::npos);
  CHECK(error_of([&] { a.setNoSplit(0, id); }).find("no_split") != std::string::npos);
  a.releasePool(0, id);
  a.emptyCache({0, 0});
  CHECK(error_of([&] { a.createOrIncrefPool(0, {1, 1}, std::shared_ptr<cca::CUDAAllocator>(&a, [](auto*) {})); })
            .find("allocator=") != std::string::npos);
}

TEST_CASE("capture-aware events: nothing reaches the device's events while the gate is open") {
  namespace alloc = gpumem::alloc;
  namespace detail = gpumem::torch::detail;
  struct Counting final : alloc::StreamEvents {
    alloc::ManualStreamEvents inner;
    int records = 0, queries = 0, syncs = 0, stream_syncs = 0;
    alloc::EventToken record(alloc::StreamId s) override { return ++records, inner.record(s); }
    bool query(alloc::EventToken t) override { return ++queries, inner.query(t); }
    void synchronize(alloc::EventToken t) override { ++syncs, inner.synchronize(t); }
    void release(alloc::EventToken t) override { inner.release(t); }
    void synchronize_stream(alloc::StreamId s) override { ++stream_syncs, inner.synchronize_stream(s); }
  } device;
  detail::CaptureGate gate;
  int device_syncs = 0;
  detail::CaptureAwareEvents events(device, gate);
  detail::CaptureAwareEvents pool_events(device, gate, [&] { ++device_syncs; });

  const alloc::EventToken before = events.record(7);  // gate closed: recorded at once
  CHECK(device.records == 1);
  gate.captures = 1;
  const alloc::EventToken during = events.record(7);
  CHECK_FALSE(events.query(before));  // not asked: the answer is "not yet"
  CHECK_FALSE(events.query(during));
  events.synchronize(during);         // returns without waiting
  CHECK(device.records == 1);
  CHECK(device.queries == 0);
  CHECK(device.syncs == 0);
  CHECK(events.deferred_unrecorded() == 1);

  gate.captures = 0;
  CHECK_FALSE(events.query(during));  // recorded on stream 7 now, not complete yet
  CHECK(device.records == 2);
  CHECK(events.deferred_unrecorded() == 0);
  device.inner.complete_stream(7);
  CHECK(events.query(during));
  CHECK(events.query(before));
  events.release(before);
  events.release(during);
  CHECK(device.inner.outstanding() == 0);

  // A deferred marker released without ever being asked about records nothing at all.
  gate.captures = 2;
  events.release(events.record(9));
  gate.captures = 0;
  CHECK(device.records == 2);

  // A pool's events synchronize the whole device instead of one stream.
  pool_events.synchronize_stream(3);
  events.synchronize_stream(3);
  CHECK(device_syncs == 1);
  CHECK(device.stream_syncs == 1);
}
