// gpumem's pinned allocator as libtorch's CUDA host allocator (at::HostAllocator), its install
// functions and the torch.ops.gpumem_pinned operators. The one translation unit of
// libgpumem_pinned_torch.so (gpumem/torch/pinned_host_allocator.h), the only code over
// gpumem::pinned that includes torch headers.
#include "gpumem/torch/pinned_host_allocator.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "gpumem/alloc/stats.h"
#include "gpumem/forensics/engine_snapshot.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/snapshot_writer.h"
#include "gpumem/forensics/trace_ring.h"
#include "gpumem/pinned/cuda_device_events.h"
#include "gpumem/pinned/cuda_host_source.h"
#include "gpumem/torch/pinned_abi.h"

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
  GpumemHostAllocator(const PinnedInstallOptions& options, at::HostAllocator* previous)
      : source_(options.source),
        stats_(std::make_shared<alloc::StatsObserver>()),
        pinned_(source_, events_, options.allocator),
        previous_(previous) {
    pinned_.attach_observer(stats_);
    if (options.trace_entries > 0) {
      trace_ = std::make_shared<forensics::TraceRing>(options.trace_entries);
      pinned_.attach_observer(trace_);
    }
  }

  // The pinned allocator's regions and blocks (device -1) and, with trace_entries, its history.
  forensics::Snapshot snapshot() {
    const alloc::EngineSnapshot engine = pinned_.snapshot();
    std::vector<forensics::TraceRecord> history;
    if (trace_) history = trace_->history();
    return forensics::snapshot_from_engine(engine, history);
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
  std::shared_ptr<forensics::TraceRing> trace_;  // null without trace_entries
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

pinned::PinnedAllocator& install_pinned(const PinnedInstallOptions& options) {
  std::lock_guard lock(install_mutex());
  if (GpumemHostAllocator* existing = g_pinned.load()) return existing->pinned();
  const std::string bad = pinned::validate(options.allocator);
  TORCH_CHECK(bad.empty(), bad);
  pinned::CudaHostSource probe(options.source);
  TORCH_CHECK(probe.init_status() != alloc::SourceStatus::invalid_argument, "gpumem pinned: ", probe.last_error());
  TORCH_CHECK(probe.init_status() == alloc::SourceStatus::ok, "gpumem pinned: ", probe.last_error(),
              "; the pinned allocator needs a CUDA device (PyTorch's stays in use)");
  at::HostAllocator* previous = at::getHostAllocator(at::kCUDA);
  auto* created = new GpumemHostAllocator(options, previous);  // lives until the process ends
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

forensics::Snapshot pinned_snapshot() {
  GpumemHostAllocator* a = g_pinned.load(std::memory_order_acquire);
  TORCH_CHECK(a != nullptr, "gpumem pinned: no snapshot: gpumem's pinned allocator is not installed "
              "(GPUMEM_ALLOC_CONF=pinned_allocator:gpumem, or torch.ops.gpumem_pinned.install())");
  return a->snapshot();
}

namespace {

void op_install() { install_pinned(); }
bool op_installed() { return installed_pinned() != nullptr; }
void op_dump_snapshot(std::string path) {
  try {
    forensics::write_snapshot(pinned_snapshot(), path);
  } catch (const forensics::ForensicsError& e) {
    TORCH_CHECK(false, "gpumem pinned: ", e.what());
  }
}

}  // namespace

}  // namespace gpumem::torch

TORCH_LIBRARY(gpumem_pinned, m) {
  m.def("install() -> ()", &gpumem::torch::op_install);
  m.def("installed() -> bool", &gpumem::torch::op_installed);
  m.def("dump_snapshot(str path) -> ()", &gpumem::torch::op_dump_snapshot);
}

namespace {
void copy_error(const char* text, char* error, unsigned long error_len) {
  if (error == nullptr || error_len == 0) return;
  std::strncpy(error, text, error_len - 1);
  error[error_len - 1] = '\0';
}
}  // namespace

extern "C" __attribute__((visibility("default"))) int gpumem_install_pinned_with(const GpumemPinnedSettings* settings,
                                                                                 char* error,
                                                                                 unsigned long error_len) {
  try {
    gpumem::torch::PinnedInstallOptions options;
    // Fields the caller's (older) struct does not have keep their defaults.
    const unsigned long filled = settings != nullptr ? settings->size_bytes : 0;
    const auto has = [filled](std::size_t offset, std::size_t size) { return filled >= offset + size; };
    if (has(offsetof(GpumemPinnedSettings, background_period_us), sizeof(unsigned)))
      options.allocator.background_period_us = settings->background_period_us;
    if (has(offsetof(GpumemPinnedSettings, touch_threads), sizeof(unsigned)))
      options.source.touch_threads = settings->touch_threads;
    if (has(offsetof(GpumemPinnedSettings, trace_entries), sizeof(unsigned long long)))
      options.trace_entries = static_cast<std::size_t>(settings->trace_entries);
    gpumem::torch::install_pinned(options);
    return 0;
  } catch (const c10::Error& e) {
    copy_error(e.what_without_backtrace(), error, error_len);  // the sentence, not libtorch's backtrace
  } catch (const std::exception& e) {
    copy_error(e.what(), error, error_len);
  }
  return 1;
}
