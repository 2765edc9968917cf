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
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"

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

// gpumem's own statistics (the stats observer of the engine serving the device, fed by its
// AllocEvents), read through gpumem::torch::stats: the CPU engine after install_cpu, or a CUDA
// device's engine after install.
class GpumemStatsProbe final : public MemoryProbe {
 public:
  GpumemStatsProbe(std::string name, c10::Device device) : name_(std::move(name)), device_(device) {}
  std::string name() const override { return name_; }
  MemoryReading read() override {
    const auto s = gpumem::torch::stats(device_);
    const auto& a = s.allocated_bytes[0];  // all pools
    const auto& r = s.reserved_bytes[0];
    return {a.current, a.peak, r.current, r.peak};
  }
  void reset_peak() override { gpumem::torch::reset_peak_stats(device_); }
  void synchronize() override {
#if GPUMEM_TORCH_HAS_CUDA
    if (device_.is_cuda()) c10::cuda::device_synchronize();
#endif
  }
  void release_cached() override {
    synchronize();
    if (auto* engine = gpumem::torch::engine(device_)) engine->empty_cache();
  }

 private:
  std::string name_;
  c10::Device device_;
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

std::vector<std::string> memory_probe_names() {
  return {"gpumem-cpu", "gpumem-cuda", "cpu-events", "cuda-native"};
}

namespace {

void require_cuda_device(const std::string& name, int device) {
#if GPUMEM_TORCH_HAS_CUDA
  if (!cuda_available()) {
    throw std::runtime_error(c10::str(
        "memory probe '", name, "' needs a CUDA device and none is visible; run on the GPU "
        "machine, or use --device cpu with a CPU probe (gpumem-cpu, cpu-events)"));
  }
  if (device < 0 || device >= c10::cuda::device_count()) {
    throw std::invalid_argument(c10::str("memory probe '", name, "': device ", device,
                                         " does not exist (", int(c10::cuda::device_count()),
                                         " visible); pick 0..",
                                         int(c10::cuda::device_count()) - 1));
  }
#else
  (void)device;
  throw std::runtime_error(c10::str("memory probe '", name,
                                    "' needs libtorch with CUDA; this build's torch has none"));
#endif
}

}  // namespace

std::unique_ptr<MemoryProbe> make_memory_probe(const std::string& name, int device) {
  if (name == "gpumem-cpu") {
    gpumem::torch::install_cpu();
    return std::make_unique<GpumemStatsProbe>(name, c10::Device(c10::DeviceType::CPU));
  }
  if (name == "cpu-events") return std::make_unique<CpuEventsProbe>();
  if (name == "gpumem-cuda") {
    require_cuda_device(name, device);
    // Must come before the first CUDA allocation; the configuration comes from
    // GPUMEM_ALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF), as for any gpumem install.
    gpumem::torch::install_from_environment();
    return std::make_unique<GpumemStatsProbe>(
        name, c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  }
  if (name == "cuda-native") {
    require_cuda_device(name, device);
#if GPUMEM_TORCH_HAS_CUDA
    return std::make_unique<CudaAllocatorStatsProbe>(device);
#endif
  }
  throw std::invalid_argument(c10::str(
      "unknown memory probe '", name,
      "'; choose one of: gpumem-cpu, gpumem-cuda, cpu-events, cuda-native"));
}

}  // namespace gpumem::ckpt
