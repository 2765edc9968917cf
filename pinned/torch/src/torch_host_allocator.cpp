// gpumem's pinned allocator as libtorch's CUDA host allocator (at::HostAllocator), its install
// functions and the torch.ops.gpumem_pinned operators. The one translation unit of
// libgpumem_pinned_torch.so, and the only one of gpumem::pinned that includes torch headers.
#include "gpumem/pinned/torch_host_allocator.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>

#include "gpumem/alloc/stats.h"
#include "gpumem/pinned/cuda_device_events.h"
#include "gpumem/pinned/cuda_host_source.h"

namespace gpumem::torch {
namespace {

// Above the priority of PyTorch's own registration (REGISTER_HOST_ALLOCATOR, 0).
constexpr std::uint8_t kPinnedPriority = 1;

at::Stat to_stat(const alloc::Stat& s) {
  at::Stat out;
  out.current = s.current;
  out.peak = s.peak;
  out.allocated = s.allocated;
  out.freed = s.freed;
  return out;
}

class GpumemHostAllocator final : public at::HostAllocator {
 public:
  GpumemHostAllocator(const pinned::PinnedOptions& options, const pinned::CudaHostSourceOptions& source_options,
                      at::HostAllocator* previous)
      : source_(source_options),
        stats_(std::make_shared<alloc::StatsObserver>()),
        pinned_(source_, events_, options),
        previous_(previous) {
    pinned_.attach_observer(stats_);
  }

  at::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &raw_delete, at::Device(at::DeviceType::CPU)};
    auto r = pinned_.allocate(n);
    TORCH_CHECK_WITH(OutOfMemoryError, r.ok(), r.error);
    return {r.ptr, r.ptr, &raw_delete, at::Device(at::DeviceType::CPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    void* block = ctx != nullptr ? ctx : ptr;
    if (!pinned_.owns(block)) return previous_ != nullptr && previous_->record_event(ptr, ctx, stream);
    const c10::cuda::CUDAStream cuda_stream(stream);
    const auto id = pinned::CudaDeviceEvents::stream_id(stream.device_index(), cuda_stream.stream());
    return pinned_.record_stream(block, id) == alloc::FreeStatus::ok;
  }
  void empty_cache() override {
    pinned_.empty_cache();
    if (previous_ != nullptr) previous_->empty_cache();
  }
  at::HostStats get_stats() override {
    const auto s = stats_->stats();
    const auto all = static_cast<std::size_t>(alloc::StatType::all);
    at::HostStats h;
    h.active_requests = to_stat(s.active[all]);
    h.active_bytes = to_stat(s.active_bytes[all]);
    h.allocations = to_stat(s.segment[all]);          // regions: PyTorch's cudaHostAlloc'd blocks
    h.allocated_bytes = to_stat(s.reserved_bytes[all]);  // page-locked bytes held, free or not
    h.num_host_alloc = s.num_device_alloc;
    h.num_host_free = s.num_device_free;
    const auto c = source_.counters();
    // PyTorch reports these in microseconds, per call; gpumem keeps totals.
    if (c.registers) {
      h.host_alloc_time.total = static_cast<int64_t>(c.register_ns / 1000);
      h.host_alloc_time.count = static_cast<int64_t>(c.registers);
    }
    if (c.unregisters) {
      h.host_free_time.total = static_cast<int64_t>(c.unregister_ns / 1000);
      h.host_free_time.count = static_cast<int64_t>(c.unregisters);
    }
    return h;
  }
  void reset_accumulated_stats() override { stats_->reset_accumulated(); }
  void reset_peak_stats() override {
    stats_->reset_peak();
    pinned_.reset_peaks();
  }

  pinned::PinnedAllocator& pinned() noexcept { return pinned_; }

 private:
  static void raw_delete(void* ptr);

  pinned::CudaHostSource source_;
  pinned::CudaDeviceEvents events_;
  std::shared_ptr<alloc::StatsObserver> stats_;
  pinned::PinnedAllocator pinned_;
  at::HostAllocator* previous_;
};

std::atomic<GpumemHostAllocator*> g_pinned{nullptr};
std::mutex& install_mutex() {
  static std::mutex m;
  return m;
}

void GpumemHostAllocator::raw_delete(void* ptr) {
  if (ptr == nullptr) return;
  GpumemHostAllocator* self = g_pinned.load(std::memory_order_acquire);
  const auto status = self ? self->pinned_.free(ptr) : alloc::FreeStatus::foreign_pointer;
  TORCH_CHECK(status == alloc::FreeStatus::ok, "gpumem pinned: freeing ", ptr, ": ", alloc::describe(status));
}

}  // namespace

pinned::PinnedAllocator& install_pinned(const pinned::PinnedOptions& options,
                                        const pinned::CudaHostSourceOptions& source_options) {
  std::lock_guard lock(install_mutex());
  if (GpumemHostAllocator* existing = g_pinned.load()) return existing->pinned();
  const std::string bad = pinned::validate(options);
  TORCH_CHECK(bad.empty(), bad);
  pinned::CudaHostSource probe(source_options);
  TORCH_CHECK(probe.init_status() != alloc::SourceStatus::invalid_argument, "gpumem pinned: ", probe.last_error());
  TORCH_CHECK(probe.init_status() == alloc::SourceStatus::ok, "gpumem pinned: ", probe.last_error(),
              "; the pinned allocator needs a CUDA device (PyTorch's stays in use)");
  at::HostAllocator* previous = at::getHostAllocator(at::kCUDA);
  auto* created = new GpumemHostAllocator(options, source_options, previous);  // lives until the process ends
  g_pinned.store(created, std::memory_order_release);
  at::setHostAllocator(at::kCUDA, created, kPinnedPriority);
  TORCH_CHECK(at::getHostAllocator(at::kCUDA) == created,
              "gpumem pinned: libtorch kept another host allocator (registered with a higher priority)");
  return created->pinned();
}

pinned::PinnedAllocator* installed_pinned() noexcept {
  GpumemHostAllocator* a = g_pinned.load(std::memory_order_acquire);
  return a ? &a->pinned() : nullptr;
}

namespace {

std::string& load_error_text() {
  static auto* text = new std::string();
  return *text;
}

void op_install() { install_pinned(); }
bool op_installed() { return installed_pinned() != nullptr; }
std::string op_load_error() { return load_error_text(); }

// GPUMEM_ALLOC_CONF names the pinned allocator: install when the library is loaded, as
// libgpumem_torch.so does for the device allocator. A failure must not abort the program that loads
// the library, so it is printed and kept for load_error().
const bool g_installed_on_load = [] {
  const char* conf = std::getenv("GPUMEM_ALLOC_CONF");
  if (conf == nullptr || std::string(conf).find("pinned_allocator:gpumem") == std::string::npos) return false;
  try {
    install_pinned();
    return true;
  } catch (const c10::Error& e) {
    load_error_text() = e.what_without_backtrace();
  } catch (const std::exception& e) {
    load_error_text() = e.what();
  }
  std::fprintf(stderr, "gpumem: pinned_allocator:gpumem is set but the pinned allocator was not installed: %s\n",
               load_error_text().c_str());
  return false;
}();

}  // namespace

}  // namespace gpumem::torch

TORCH_LIBRARY(gpumem_pinned, m) {
  m.def("install() -> ()", &gpumem::torch::op_install);
  m.def("installed() -> bool", &gpumem::torch::op_installed);
  m.def("load_error() -> str", &gpumem::torch::op_load_error);
}

extern "C" __attribute__((visibility("default"))) int gpumem_install_pinned(char* error, unsigned long error_len) {
  return gpumem_install_pinned_with(0, 1, error, error_len);
}

extern "C" __attribute__((visibility("default"))) int gpumem_install_pinned_with(unsigned background_period_us,
                                                                                 unsigned touch_threads, char* error,
                                                                                 unsigned long error_len) {
  try {
    gpumem::pinned::PinnedOptions options;
    options.background_period_us = background_period_us;
    gpumem::torch::install_pinned(options, gpumem::pinned::CudaHostSourceOptions{touch_threads});
    return 0;
  } catch (const std::exception& e) {
    if (error != nullptr && error_len > 0) {
      std::strncpy(error, e.what(), error_len - 1);
      error[error_len - 1] = '\0';
    }
    return 1;
  }
}
