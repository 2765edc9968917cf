// gpumem installed as libtorch's CUDA allocator, on a real GPU. Every case is tagged [gpu] and
// skips without a CUDA device. gpumem is installed before the first CUDA tensor (the first case
// to run does it), so every CUDA tensor in this program comes from gpumem.
//
//   - torch's allocator entry points report gpumem (name, c10::GetAllocator, stats);
//   - record_stream under stress: blocks freed while other streams still read them are not
//     reused early (the data read on those streams is checked);
//   - OOM under a memory fraction raises torch.OutOfMemoryError in PyTorch's shape, calls the OOM
//     observers, counts num_ooms, and the program recovers;
//   - empty_cache returns memory to the driver (cudaMemGetInfo's free rises);
//   - snapshots (C++ struct and PyTorch's pickle) with history and contexts;
//   - unsupported features raise one clear error.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "catch.h"
#include "gpumem/torch/cuda_allocator.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"

namespace cca = c10::cuda::CUDACachingAllocator;

namespace {

bool have_gpu() {
  static const bool yes = torch::cuda::is_available();
  return yes;
}

// Installs gpumem once, before anything touches CUDA memory.
void ensure_installed() {
  static const bool done = [] {
    gpumem::torch::install();
    return true;
  }();
  (void)done;
}

#define GPUMEM_REQUIRE_GPU()                                        \
  do {                                                              \
    if (!have_gpu()) GPUMEM_SKIP("no CUDA device: [gpu] test skipped"); \
    ensure_installed();                                             \
  } while (false)

std::pair<std::size_t, std::size_t> mem_get_info() {
  std::size_t free_bytes = 0, total_bytes = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

constexpr std::int64_t kMiB = 1 << 20;

}  // namespace

TEST_CASE("gpu 1: libtorch's CUDA allocator is gpumem and reports it", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  CHECK(cca::get()->name() == "gpumem");
  CHECK(c10::GetAllocator(c10::DeviceType::CUDA) == cca::get());
  CHECK(gpumem::torch::installed());

  const auto before = cca::getDeviceStats(0);
  auto t = torch::empty({3 * kMiB + 5}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
  CHECK(gpumem::torch::engine(c10::Device(c10::DeviceType::CUDA, 0))->lookup(t.data_ptr()).has_value());
  const auto during = cca::getDeviceStats(0);
  CHECK(during.allocation[0].current == before.allocation[0].current + 1);
  CHECK(during.requested_bytes[0].current == before.requested_bytes[0].current + 3 * kMiB + 5);
  CHECK(during.allocated_bytes[0].current - before.allocated_bytes[0].current >= 3 * kMiB + 5);
  CHECK(during.reserved_bytes[0].current >= during.allocated_bytes[0].current);
  t.reset();
  torch::cuda::synchronize();
  const auto after = cca::getDeviceStats(0);
  CHECK(after.allocation[0].current == before.allocation[0].current);
  CHECK(after.allocated_bytes[0].current == before.allocated_bytes[0].current);

  // reset_peak_memory_stats: peaks drop to current.
  cca::resetPeakStats(0);
  const auto reset = cca::getDeviceStats(0);
  CHECK(reset.allocated_bytes[0].peak == reset.allocated_bytes[0].current);
}

TEST_CASE("gpu 2: record_stream keeps blocks from early reuse under stress", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  auto main_stream = c10::cuda::getCurrentCUDAStream();
  std::vector<c10::cuda::CUDAStream> side;
  for (int i = 0; i < 4; ++i) side.push_back(c10::cuda::getStreamFromPool());
  std::mt19937_64 rng(1234);
  constexpr int kIters = 300;
  std::vector<torch::Tensor> results;
  std::vector<float> expected;
  const auto opts = torch::dtype(torch::kFloat).device(torch::kCUDA);
  for (int iter = 0; iter < kIters; ++iter) {
    const int64_t n = 256 + static_cast<int64_t>(rng() % (2 * kMiB));
    auto x = torch::full({n}, static_cast<float>(iter), opts);
    auto& s = side[iter % side.size()];
    at::cuda::CUDAEvent ready;
    ready.record(main_stream);
    {
      c10::cuda::CUDAStreamGuard guard(s);
      ready.block(s);
      at::cuda::sleep(static_cast<int64_t>(20000 + rng() % 200000));  // the side stream lags
      results.push_back((x * 2.0f).sum());
      expected.push_back(2.0f * static_cast<float>(iter) * static_cast<float>(n));
    }
    x.record_stream(s);
    x.reset();  // freed on the main stream while the side stream may still read it
    // Allocations on the main stream that would land on x's block if it were reused early.
    for (int k = 0; k < 3; ++k) torch::full({n}, -1.0f, opts).mul_(3.0f);
  }
  torch::cuda::synchronize();
  int bad = 0;
  for (int iter = 0; iter < kIters; ++iter) {
    const float got = results[iter].item<float>();
    if (std::abs(got - expected[iter]) > 1e-3f * std::abs(expected[iter]) + 1e-3f) ++bad;
  }
  CHECK(bad == 0);
  results.clear();
  // Nothing stays pending once the streams are idle: empty_cache completes pending frees.
  cca::emptyCache();
  const auto stats = cca::getDeviceStats(0);
  CHECK(stats.active[0].current == stats.allocation[0].current);
}

TEST_CASE("gpu 3: OOM under a memory fraction raises PyTorch's error, then the program recovers", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  cca::emptyCache();
  const auto [free0, total] = mem_get_info();
  (void)free0;
  const auto base = cca::getDeviceStats(0);
  std::atomic<int> observed{0};
  cca::attachOutOfMemoryObserver([&](int64_t device, size_t, size_t, size_t) {
    if (device == 0) observed.fetch_add(1);
  });
  // Room for about 1 GiB above what is reserved now.
  const double fraction =
      static_cast<double>(base.reserved_bytes[0].current + 1024 * kMiB) / static_cast<double>(total);
  cca::setMemoryFraction(fraction, 0);
  CHECK(std::abs(cca::getMemoryFraction(0) - fraction) < 1e-12);

  std::vector<torch::Tensor> held;
  std::string message;
  bool oom = false;
  try {
    for (int i = 0; i < 64; ++i) held.push_back(torch::empty({128 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA)));
  } catch (const c10::OutOfMemoryError& e) {
    oom = true;
    message = e.what_without_backtrace();
  }
  REQUIRE(oom);
  CHECK(held.size() >= 6);
  CHECK(held.size() <= 8);
  CHECK(message.rfind("CUDA out of memory. Tried to allocate", 0) == 0);
  CHECK(message.find("allowed;") != std::string::npos);
  CHECK(message.find("is reserved by PyTorch but unallocated") != std::string::npos);
  CHECK(message.find("gpumem:") != std::string::npos);
  CHECK(observed.load() == 1);
  CHECK(cca::getDeviceStats(0).num_ooms == base.num_ooms + 1);

  // Recovery: free, allocate again under the same cap, then lift the cap.
  held.pop_back();
  held.pop_back();
  auto again = torch::empty({200 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
  again.fill_(7);
  // (min and max, not a sum: a 64-bit sum would need a 1.6 GiB temporary over the cap)
  CHECK(again.min().item<int64_t>() == 7);
  CHECK(again.max().item<int64_t>() == 7);
  held.clear();
  again.reset();
  cca::setMemoryFraction(1.0, 0);
  auto big = torch::empty({2048 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
  CHECK(big.defined());
}

TEST_CASE("gpu 4: empty_cache returns memory to the driver", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  cca::emptyCache();
  {
    auto t = torch::empty({4096 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
    t.fill_(1);
    torch::cuda::synchronize();
  }
  const auto cached = cca::getDeviceStats(0);
  const auto [free_cached, total] = mem_get_info();
  (void)total;
  CHECK(cached.reserved_bytes[0].current - cached.allocated_bytes[0].current >= 4096 * kMiB);
  cca::emptyCache();
  const auto [free_after, total2] = mem_get_info();
  (void)total2;
  const auto emptied = cca::getDeviceStats(0);
  CHECK(free_after >= free_cached + static_cast<std::size_t>(4000 * kMiB));
  CHECK(cached.reserved_bytes[0].current - emptied.reserved_bytes[0].current >= 4096 * kMiB);
  CHECK(emptied.num_sync_all_streams >= cached.num_sync_all_streams);
}

TEST_CASE("gpu 5: snapshots with history: segments tile, traces pair up, the pickle is made", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  torch::cuda::_record_memory_history(std::string("all"), std::string("all"), "all", 100000);
  std::vector<torch::Tensor> live;
  for (int i = 0; i < 20; ++i)
    live.push_back(torch::empty({(i + 1) * 100000}, torch::dtype(torch::kFloat).device(torch::kCUDA)));
  for (int i = 0; i < 20; i += 2) live[i].reset();
  const cca::SnapshotInfo snap = cca::snapshot();
  std::unordered_set<std::uintptr_t> ours;
  for (int i = 1; i < 20; i += 2) ours.insert(reinterpret_cast<std::uintptr_t>(live[i].data_ptr()));
  std::unordered_set<std::uintptr_t> allocated;
  std::uintptr_t previous_end = 0;
  for (const auto& segment : snap.segments) {
    CHECK(segment.address >= previous_end);
    previous_end = segment.address + segment.total_size;
    std::size_t sum = 0;
    std::uintptr_t addr = segment.address;
    for (const auto& block : segment.blocks) {
      if (block.allocated) {
        allocated.insert(addr);
        // Blocks allocated while history records contexts carry their stack.
        if (ours.count(addr)) CHECK(block.context_when_allocated != nullptr);
      }
      addr += block.size;
      sum += block.size;
    }
    CHECK(sum == segment.total_size);
  }
  for (int i = 1; i < 20; i += 2) CHECK(allocated.count(reinterpret_cast<std::uintptr_t>(live[i].data_ptr())) == 1);
  REQUIRE(snap.device_traces.size() >= 1);
  int allocs = 0, frees = 0;
  for (const auto& entry : snap.device_traces[0]) {
    allocs += entry.action_ == c10::CachingDeviceAllocator::TraceEntry::ALLOC;
    frees += entry.action_ == c10::CachingDeviceAllocator::TraceEntry::FREE_COMPLETED;
  }
  CHECK(allocs >= 20);
  CHECK(frees >= 10);
  CHECK(snap.config_metadata.expandable_segments);
  const std::string pickled = torch::cuda::_memory_snapshot_pickled();
  CHECK(pickled.size() > 1000);
  torch::cuda::_record_memory_history(std::nullopt);
  CHECK_FALSE(cca::isHistoryEnabled());
}

TEST_CASE("gpu 6: a malformed CUDA IPC handle raises one clear error", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  const auto ipc = message_of([] { cca::getIpcDevPtr("x"); });
  CHECK(ipc.find("cannot open a CUDA IPC handle") != std::string::npos);  // malformed (IPC: scripts/gpu/package.sh)
  // Private pools and checkpoint state are supported (tests/torch/test_graph_pools.cpp,
  // scripts/gpu/graphs.sh); a pool begun here would take the later cases' allocations.
}

TEST_CASE("gpu 7: with caching disabled, allocations go straight to cudaMalloc and back", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  auto* engine = gpumem::torch::engine(c10::Device(c10::DeviceType::CUDA, 0));
  REQUIRE(engine != nullptr);
  auto cached = torch::full({1000}, 2.0f, torch::kCUDA);  // made while caching is on
  cca::get()->enable(false);
  CHECK_FALSE(cca::isEnabled());
  {
    auto direct = torch::full({1 << 20}, 5.0f, torch::kCUDA);
    CHECK_FALSE(engine->lookup(direct.data_ptr()).has_value());
    CHECK(direct.sum().item<float>() == 5.0f * (1 << 20));
    void* raw = cca::raw_alloc(4096);
    CHECK_FALSE(engine->lookup(raw).has_value());
    cca::raw_delete(raw);
  }
  cached.reset();  // freed into gpumem even while caching is off
  cca::get()->enable(true);
  auto again = torch::empty({1000}, torch::kCUDA);
  CHECK(engine->lookup(again.data_ptr()).has_value());
}

TEST_CASE("gpu 8: a growth and an empty_cache move the driver and wait keys of memory_stats", "[gpu]") {
  GPUMEM_REQUIRE_GPU();
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  cca::emptyCache();
  const auto before = gpumem::torch::memory_stats(dev);
  CHECK(before.at("gpumem.driver.timed") == 1);  // the default source is the CUDA VMM one
  CHECK(before.at("gpumem.wait.timed") == 1);
  {
    auto t = torch::empty({1024 * kMiB}, torch::dtype(torch::kUInt8).device(torch::kCUDA));  // a growth
    t.fill_(3);
  }
  const auto grown = gpumem::torch::memory_stats(dev);
  for (const char* call : {"create", "map", "set_access"}) {
    const std::string k = std::string("gpumem.driver.") + call;
    CHECK(grown.at(k + ".calls") > before.at(k + ".calls"));
    CHECK(grown.at(k + ".ns") > before.at(k + ".ns"));
    CHECK(grown.at(k + ".max_ns") <= grown.at(k + ".ns"));
  }
  cca::emptyCache();  // gives the gigabyte back: waits for its stream, then unmaps and releases
  const auto emptied = gpumem::torch::memory_stats(dev);
  CHECK(emptied.at("gpumem.driver.unmap.calls") > grown.at("gpumem.driver.unmap.calls"));
  CHECK(emptied.at("gpumem.driver.release.calls") > grown.at("gpumem.driver.release.calls"));
  CHECK(emptied.at("gpumem.wait.sync_stream.calls") > grown.at("gpumem.wait.sync_stream.calls"));
  CHECK(emptied.at("gpumem.wait.sync_stream.ns") > grown.at("gpumem.wait.sync_stream.ns"));
}
