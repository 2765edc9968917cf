// gpumem's CUDAAllocator on a simulated device (source:sim, GPUMEM_ALLOW_SIM=1): everything the
// allocator does besides touching a GPU, checked on any machine. Allocations go through the C
// functions (the pluggable path); libtorch's allocator entry points then report them: statistics,
// snapshots (and PyTorch's own pickling of them), history with skip_actions, trace trackers,
// OOM (message, observers, num_ooms, trace entry), memory fraction, empty_cache, expandable
// segment sizes, base allocations, cacheInfo, and the unsupported features' errors.
//
// Addresses are fake: nothing here dereferences them.
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/config.h"
#include "gpumem/torch/c_api.h"
#include "gpumem/torch/cuda_allocator.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"
#include "sim_support.h"

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

cca::CUDAAllocator& sim_allocator() { return gpumem::test::sim_allocator("source:sim,memory_limit_mb:1024"); }
using gpumem::test::error_of;

struct Live {
  std::unordered_map<void*, std::size_t> sizes;
  void* alloc(std::size_t n) {
    void* p = gpumem_malloc(n, 0, nullptr);
    sizes[p] = n;
    return p;
  }
  void free(void* p) {
    gpumem_free(p, sizes.at(p), 0, nullptr);
    sizes.erase(p);
  }
  void free_all() {
    while (!sizes.empty()) free(sizes.begin()->first);
  }
  std::int64_t requested() const {
    std::int64_t sum = 0;
    for (auto& [p, n] : sizes) sum += static_cast<std::int64_t>(n);
    return sum;
  }
};

}  // namespace

TEST_CASE("sim 1: installed as libtorch's CUDA allocator; statistics follow the C functions") {
  auto& a = sim_allocator();
  CHECK(cca::get() == &a);
  CHECK(c10::GetAllocator(c10::DeviceType::CUDA) == &a);
  CHECK(a.name() == "gpumem");
  CHECK(gpumem::torch::installed());

  const auto before = cca::getDeviceStats(0);
  Live live;
  for (std::size_t n : {std::size_t{1}, std::size_t{511}, std::size_t{4096}, kMiB, kMiB + 1, 7 * kMiB, 65 * kMiB})
    live.alloc(n);
  const auto during = cca::getDeviceStats(0);
  CHECK(during.allocation[0].current - before.allocation[0].current == 7);
  CHECK(during.requested_bytes[0].current - before.requested_bytes[0].current == live.requested());
  CHECK(during.allocation[1].current - before.allocation[1].current == 4);  // <= 1 MiB: small pool
  CHECK(during.allocation[2].current - before.allocation[2].current == 3);
  CHECK(during.reserved_bytes[0].current >= during.allocated_bytes[0].current);
  CHECK(during.num_device_alloc > before.num_device_alloc);
  live.free_all();
  const auto after = cca::getDeviceStats(0);
  CHECK(after.allocation[0].current == before.allocation[0].current);
  CHECK(after.requested_bytes[0].current == before.requested_bytes[0].current);

  cca::resetPeakStats(0);
  CHECK(cca::getDeviceStats(0).allocated_bytes[0].peak == cca::getDeviceStats(0).allocated_bytes[0].current);
  cca::resetAccumulatedStats(0);
  CHECK(cca::getDeviceStats(0).allocation[0].allocated == 0);
}

TEST_CASE("sim 2: snapshots tile, traces carry PyTorch's actions and Unix times, pickling works") {
  auto& a = sim_allocator();
  a.recordHistory(true, nullptr, 100000, cda::RecordContext::STATE, /*clearHistory=*/true, {});
  CHECK(a.isHistoryEnabled());
  Live live;
  std::vector<void*> ptrs;
  for (int i = 0; i < 40; ++i) ptrs.push_back(live.alloc(static_cast<std::size_t>(i + 1) * 123457));
  for (int i = 0; i < 40; i += 3) live.free(ptrs[static_cast<std::size_t>(i)]);
  a.recordAnnotation({{"name", "step"}, {"stage", "START"}});
  const auto stats = a.getDeviceStats(0);
  const cca::SnapshotInfo snap = a.snapshot({0, 0}, true);

  std::unordered_set<std::uintptr_t> allocated;
  std::int64_t allocated_bytes = 0, requested_bytes = 0;
  std::uintptr_t previous_end = 0;
  for (const auto& seg : snap.segments) {
    CHECK(seg.device == 0);
    CHECK(seg.address >= previous_end);
    previous_end = seg.address + seg.total_size;
    std::uintptr_t addr = seg.address;
    std::size_t seg_allocated = 0;
    for (const auto& b : seg.blocks) {
      if (b.allocated) {
        allocated.insert(addr);
        allocated_bytes += static_cast<std::int64_t>(b.size);
        requested_bytes += static_cast<std::int64_t>(b.requested_size);
        seg_allocated += b.size;
        CHECK(b.active);
      }
      addr += b.size;
    }
    CHECK(addr == seg.address + seg.total_size);
    CHECK(seg.allocated_size == seg_allocated);
  }
  CHECK(allocated.size() == live.sizes.size());
  for (auto& [p, n] : live.sizes) CHECK(allocated.count(reinterpret_cast<std::uintptr_t>(p)) == 1);
  CHECK(allocated_bytes == stats.allocated_bytes[0].current);
  CHECK(requested_bytes == stats.requested_bytes[0].current);

  REQUIRE(snap.device_traces.size() >= 1);
  std::unordered_map<int, int> actions;
  const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  for (const auto& e : snap.device_traces[0]) {
    ++actions[e.action_];
    CHECK(std::llabs(static_cast<long long>(e.time_.t_) - static_cast<long long>(now_us)) < 60'000'000LL);
  }
  CHECK(actions[cda::TraceEntry::ALLOC] == 40);
  CHECK(actions[cda::TraceEntry::FREE_REQUESTED] == 14);
  CHECK(actions[cda::TraceEntry::FREE_COMPLETED] == 14);
  CHECK(actions[cda::TraceEntry::SEGMENT_MAP] >= 1);
  CHECK(actions[cda::TraceEntry::SNAPSHOT] == 1);
  REQUIRE(snap.external_annotations.size() == 1);
  CHECK(snap.external_annotations[0].metadata_.at("stage") == "START");
  CHECK(snap.config_metadata.expandable_segments);
  CHECK(snap.config_metadata.roundup_power2_divisions.size() == 16);

  // PyTorch's own C++ pickling of the snapshot (what _dump_snapshot writes) accepts it.
  const std::string pickled = torch::cuda::_memory_snapshot_pickled();
  CHECK(pickled.size() > 1000);
  CHECK(pickled.find("segment_map") != std::string::npos);
  CHECK(pickled.find("active_allocated") != std::string::npos);

  // skip_actions leave kinds out; unknown names are refused with the valid list.
  a.recordHistory(true, nullptr, 100000, cda::RecordContext::STATE, true, {"free_requested", "segment_map"});
  live.free(live.sizes.begin()->first);
  const auto skipped = a.snapshot({0, 0}, true);
  for (const auto& e : skipped.device_traces[0]) {
    CHECK(e.action_ != cda::TraceEntry::FREE_REQUESTED);
    CHECK(e.action_ != cda::TraceEntry::SEGMENT_MAP);
  }
  CHECK(error_of([&] { a.recordHistory(true, nullptr, 10, cda::RecordContext::STATE, true, {"bogus"}); })
            .find("unknown skip_actions entry 'bogus'") != std::string::npos);

  a.recordHistory(false, nullptr, 0, cda::RecordContext::NEVER, false, {});
  CHECK_FALSE(a.isHistoryEnabled());
  CHECK(a.snapshot({0, 0}, true).device_traces[0].empty());
  live.free_all();
}

TEST_CASE("sim 3: trace trackers see every entry, with user metadata") {
  auto& a = sim_allocator();
  // Trackers stay attached for the life of the allocator (PyTorch has no detach), so what this
  // one fills must outlive the test case.
  struct Seen {
    std::vector<cda::TraceEntry::Action> actions;
    std::vector<std::string> metadata;
  };
  auto shared = std::make_shared<Seen>();
  a.attachAllocatorTraceTracker([shared](const cda::TraceEntry& e) {
    shared->actions.push_back(e.action_);
    shared->metadata.push_back(e.user_metadata_);
  });
  auto& seen = shared->actions;
  auto& metadata = shared->metadata;
  a.setUserMetadata("epoch=1");
  CHECK(a.getUserMetadata() == "epoch=1");
  Live live;
  live.free(live.alloc(4096));
  REQUIRE(seen.size() >= 3);
  CHECK(seen[seen.size() - 3] == cda::TraceEntry::ALLOC);
  CHECK(seen[seen.size() - 2] == cda::TraceEntry::FREE_REQUESTED);
  CHECK(seen[seen.size() - 1] == cda::TraceEntry::FREE_COMPLETED);
  CHECK(metadata.back() == "epoch=1");
  a.setUserMetadata("");
}

TEST_CASE("sim 4: OOM raises PyTorch's error with gpumem's reason, calls observers, counts, recovers") {
  auto& a = sim_allocator();
  a.emptyCache({0, 0});
  int observed = 0;
  std::size_t observed_free = 0;
  a.attachOutOfMemoryObserver([&](int64_t device, size_t, size_t, size_t device_free) {
    if (device == 0) ++observed;
    observed_free = device_free;
  });
  a.recordHistory(true, nullptr, 1000, cda::RecordContext::STATE, true, {});
  const auto before = a.getDeviceStats(0);
  Live live;
  live.alloc(600 * kMiB);
  std::string message;
  try {
    gpumem_malloc(600 * kMiB, 0, nullptr);  // 1200 MiB > the 1024 MiB simulated device
  } catch (const c10::OutOfMemoryError& e) {
    message = e.what_without_backtrace();
  }
  REQUIRE_FALSE(message.empty());
  CHECK(message.rfind("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of", 0) == 0);
  CHECK(message.find("is reserved by PyTorch but unallocated") != std::string::npos);
  CHECK(message.find("gpumem: ") != std::string::npos);
  CHECK(observed == 1);
  CHECK(a.getDeviceStats(0).num_ooms == before.num_ooms + 1);
  bool oom_traced = false;
  const auto after_oom = a.snapshot({0, 0}, true);
  for (const auto& e : after_oom.device_traces[0])
    if (e.action_ == cda::TraceEntry::OOM) oom_traced = e.addr_ == observed_free && e.size_ == 600 * kMiB;
  CHECK(oom_traced);

  // A memory fraction caps below the device: 0.5 x 1024 MiB leaves no room for 600 + 100 MiB.
  a.setMemoryFraction(0.5, 0);
  CHECK(a.getMemoryFraction(0) == 0.5);
  message.clear();
  try {
    gpumem_malloc(100 * kMiB, 0, nullptr);
  } catch (const c10::OutOfMemoryError& e) {
    message = e.what_without_backtrace();
  }
  CHECK(message.find("512.00 MiB allowed;") != std::string::npos);
  CHECK(error_of([&] { a.setMemoryFraction(1.5, 0); }).find("invalid memory fraction 1.5") != std::string::npos);

  // Recovery.
  live.free_all();
  void* p = gpumem_malloc(300 * kMiB, 0, nullptr);
  CHECK(p != nullptr);
  gpumem_free(p, 300 * kMiB, 0, nullptr);
  a.setMemoryFraction(1.0, 0);
  p = gpumem_malloc(900 * kMiB, 0, nullptr);
  CHECK(p != nullptr);
  gpumem_free(p, 900 * kMiB, 0, nullptr);
  a.recordHistory(false, nullptr, 0, cda::RecordContext::NEVER, true, {});
}

TEST_CASE("sim 5: empty_cache, expandable sizes, base allocations, cacheInfo, record_stream") {
  auto& a = sim_allocator();
  Live live;
  void* p = live.alloc(30 * kMiB);
  live.alloc(1000);
  CHECK_FALSE(a.getExpandableSegmentSizes(0).empty());
  std::size_t base_size = 0;
  void* base = a.getBaseAllocation(p, &base_size);  // PyTorch passes a storage's data pointer
  CHECK(reinterpret_cast<std::uintptr_t>(base) <= reinterpret_cast<std::uintptr_t>(p));
  CHECK(reinterpret_cast<std::uintptr_t>(base) + base_size >= reinterpret_cast<std::uintptr_t>(p) + 30 * kMiB);
  CHECK(error_of([&] { a.getBaseAllocation(reinterpret_cast<void*>(0x10), nullptr); }).find("not the start of a live gpumem allocation") !=
        std::string::npos);
  gpumem_record_stream(p, reinterpret_cast<cudaStream_t>(0x1234));
  live.free(p);     // pending until the marker on stream 0x1234 completes (at once here)...
  live.alloc(512);  // ...which the engine notices on its next slow-path call
  std::size_t largest = 1;
  a.cacheInfo(0, &largest);
  CHECK(largest >= 30 * kMiB);

  const auto cached = a.getDeviceStats(0);
  CHECK(cached.reserved_bytes[0].current > cached.allocated_bytes[0].current);
  gpumem_empty_cache();
  const auto emptied = a.getDeviceStats(0);
  CHECK(emptied.reserved_bytes[0].current < cached.reserved_bytes[0].current);
  CHECK(emptied.num_device_free > cached.num_device_free);
  live.free_all();
  a.emptyCache({0, 0});
  CHECK(a.getDeviceStats(0).reserved_bytes[0].current == 0);
}

TEST_CASE("sim 6: unsupported features raise one error naming the feature; bad pointers are refused") {
  auto& a = sim_allocator();
  // CUDA IPC: a malformed handle and a pointer gpumem did not allocate are refused with words; a
  // simulated device's memory cannot be mapped by another process.
  CHECK(error_of([&] { a.getIpcDevPtr("handle"); }).find("cannot open a CUDA IPC handle") != std::string::npos);
  CHECK(error_of([&] { a.shareIpcHandle(nullptr); }).find("not the start of a live gpumem allocation") !=
        std::string::npos);
  {
    void* shared = gpumem_malloc(4096, 0, nullptr);
    CHECK(error_of([&] { a.shareIpcHandle(shared); }).find("simulated device") != std::string::npos);
    gpumem_free(shared, 4096, 0, nullptr);
  }
  CHECK(error_of([&] { gpumem_free(reinterpret_cast<void*>(0x42), 0, 0, nullptr); }).find("cannot free") !=
        std::string::npos);
  void* p = gpumem_malloc(4096, 0, nullptr);
  gpumem_free(p, 4096, 0, nullptr);
  CHECK(error_of([&] { gpumem_free(p, 4096, 0, nullptr); }).find("cannot free") != std::string::npos);

  // Another configuration cannot replace the one in use.
  gpumem::torch::Config other;
  CHECK(error_of([&] { gpumem::torch::install(other); }).find("already exists with configuration") != std::string::npos);
}

TEST_CASE("sim 7: the driver and wait keys are present and zero when the source is not CUDA's; the thread-cache and engine-lock keys") {
  sim_allocator();
  Live live;
  live.alloc(40 * kMiB);  // a growth on the simulated device: no driver call, no CUDA event
  const auto keys = gpumem::torch::memory_stats(c10::Device(c10::DeviceType::CUDA, 0));
  CHECK(keys.at("gpumem.driver.timed") == 0);
  CHECK(keys.at("gpumem.wait.timed") == 0);
  int seen = 0;
  for (const char* prefix : {"gpumem.driver.address_reserve", "gpumem.driver.address_free", "gpumem.driver.create",
                             "gpumem.driver.release", "gpumem.driver.map", "gpumem.driver.set_access",
                             "gpumem.driver.unmap", "gpumem.wait.sync_stream", "gpumem.wait.sync_event",
                             "gpumem.event.record", "gpumem.event.query"}) {
    for (const char* field : {".calls", ".ns", ".max_ns"}) {
      const std::string k = std::string(prefix) + field;
      INFO(k);
      REQUIRE(keys.count(k) == 1);
      CHECK(keys.at(k) == 0);
      ++seen;
    }
  }
  CHECK(seen == 33);
  // One thread: the thread caches never came on, and the engine's lock was never found taken.
  CHECK(keys.at("gpumem.thread_caches.on") == 0);
  CHECK(keys.at("gpumem.engine_lock.acquisitions") >= 1);  // live.alloc's, at least
  CHECK(keys.at("gpumem.engine_lock.contended") == 0);
  CHECK(keys.at("gpumem.arenas") == 1);
  CHECK(keys.at("gpumem.recycle_churn.openings") == 0);  // on by default; one allocation never churns
  // The step planner is on by default; one allocation is no step: it found, planned and served nothing.
  CHECK(keys.at("gpumem.step_plan.on") == 1);
  for (const char* key : {"plans", "served_allocations", "stopped", "dormant", "dormant_periods", "layouts",
                          "last_layout_us", "laying_out"}) {
    INFO(key);
    CHECK(keys.at(std::string("gpumem.step_plan.") + key) == 0);
  }
  live.free_all();
  // The free took it once more.
  const auto after = gpumem::torch::memory_stats(c10::Device(c10::DeviceType::CUDA, 0));
  CHECK(after.at("gpumem.engine_lock.acquisitions") == keys.at("gpumem.engine_lock.acquisitions") + 1);
  CHECK(after.at("gpumem.engine_lock.contended") == 0);
  // A device with no engine reads the same keys, zero.
  const auto none = gpumem::torch::memory_stats(c10::Device(c10::DeviceType::CUDA, 7));
  CHECK(none.at("gpumem.driver.timed") == 0);
  CHECK(none.at("gpumem.driver.map.calls") == 0);
  CHECK(none.at("gpumem.wait.sync_stream.ns") == 0);
  CHECK(none.at("gpumem.thread_caches.on") == 0);
  CHECK(none.at("gpumem.engine_lock.acquisitions") == 0);
  CHECK(none.at("gpumem.engine_lock.contended") == 0);
  CHECK(none.at("gpumem.arenas") == 1);
  CHECK(none.at("gpumem.recycle_churn.openings") == 0);
}
