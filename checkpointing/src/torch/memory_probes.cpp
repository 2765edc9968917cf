#include "gpumem/ckpt/memory_probes.h"

#include <ATen/Context.h>
#include <c10/util/StringUtil.h>
#if GPUMEM_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <stdexcept>

#include "gpumem/ckpt/counting_cpu_allocator.h"
#include "gpumem/ckpt/event_stats_probe.h"

namespace gpumem::ckpt {
namespace {

// An EventStatsProbe fed by the counting CPU allocator for as long as this probe lives.
class CpuEventsProbe final : public MemoryProbe {
 public:
  CpuEventsProbe() : stats_(std::make_shared<EventStatsProbe>("cpu-events", 0)) {
    CountingCpuAllocator::install().set_observer(stats_);
  }
  ~CpuEventsProbe() override { CountingCpuAllocator::install().set_observer(nullptr); }
  std::string name() const override { return stats_->name(); }
  MemoryReading read() override { return stats_->read(); }
  void reset_peak() override { stats_->reset_peak(); }

 private:
  std::shared_ptr<EventStatsProbe> stats_;
};

#if GPUMEM_TORCH_HAS_CUDA
class CudaAllocatorStatsProbe final : public MemoryProbe {
 public:
  explicit CudaAllocatorStatsProbe(int device) : device_(static_cast<c10::DeviceIndex>(device)) {}
  std::string name() const override { return "cuda-native"; }
  MemoryReading read() override {
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_);
    const auto& a = stats.allocated_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
    const auto& r = stats.reserved_bytes[static_cast<std::size_t>(StatType::AGGREGATE)];
    return {a.current, a.peak, r.current, r.peak};
  }
  void reset_peak() override { c10::cuda::CUDACachingAllocator::resetPeakStats(device_); }
  void synchronize() override { c10::cuda::device_synchronize(); }
  void release_cached() override {
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
  }

 private:
  c10::DeviceIndex device_;
};
#endif

}  // namespace

bool cuda_available() {
#if GPUMEM_TORCH_HAS_CUDA
  return at::globalContext().hasCUDA() && c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

std::vector<std::string> memory_probe_names() { return {"cpu-events", "cuda-native"}; }

std::unique_ptr<MemoryProbe> make_memory_probe(const std::string& name, int device) {
  if (name == "cpu-events") return std::make_unique<CpuEventsProbe>();
  if (name == "cuda-native") {
#if GPUMEM_TORCH_HAS_CUDA
    if (!cuda_available()) {
      throw std::runtime_error(
          "memory probe 'cuda-native' needs a CUDA device and none is visible; run on the GPU "
          "machine or use --probe cpu-events with --device cpu");
    }
    if (device < 0 || device >= c10::cuda::device_count()) {
      throw std::invalid_argument(c10::str(
          "memory probe 'cuda-native': device ", device, " does not exist (",
          int(c10::cuda::device_count()), " visible); pick 0..",
          int(c10::cuda::device_count()) - 1));
    }
    return std::make_unique<CudaAllocatorStatsProbe>(device);
#else
    throw std::runtime_error(
        "memory probe 'cuda-native' needs libtorch with CUDA; this build's torch has none");
#endif
  }
  throw std::invalid_argument(
      c10::str("unknown memory probe '", name, "'; choose one of: cpu-events, cuda-native"));
}

}  // namespace gpumem::ckpt
