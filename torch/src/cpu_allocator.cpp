// gpumem as c10's CPU allocator (install_cpu): CPU tensors come from an engine on HostVmmSource,
// so statistics, snapshots and traces work for CPU training exactly as for CUDA.
//
// Everything on the host is synchronous: one stream (0) and markers that are complete at once.
// Addresses are 512-byte aligned (the engine's rounding on a granule-aligned region), above the
// 64 bytes c10 requires. The profiler hooks get the requested size, as c10's default CPU
// allocator reports it.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "device_engine.h"
#include "engines.h"
#include "gpumem/forensics/alloc_context.h"
#include "gpumem/forensics/python_stacks.h"
#include "gpumem/torch/install.h"

namespace gpumem::torch {
namespace {

// Above the default CPU allocator's registration (0) and the usual overrides.
constexpr std::uint8_t kCpuAllocatorPriority = 10;
constexpr std::size_t kCpuAlignment = 64;  // c10::gAlignment

void cpu_delete_fn(void* ptr);

class GpumemCpuAllocator final : public c10::Allocator {
 public:
  explicit GpumemCpuAllocator(std::unique_ptr<detail::DeviceEngine> de) : de_(std::move(de)) {}

  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &cpu_delete_fn, cpu};
    // python_stacks: the stack goes to gpumem's forensics through the thread (alloc_context.h),
    // for the allocation's records and its OOM record.
    std::optional<forensics::AllocContext::Scope> stack;
    if (C10_UNLIKELY(de_->wants_python_stack(n))) stack.emplace(forensics::gather_python_stack());
    alloc::AllocResult result = de_->engine->allocate(n, 0);
    if (C10_UNLIKELY(!result.ok())) raise_oom(n, *result.oom);
    TORCH_INTERNAL_ASSERT(reinterpret_cast<std::uintptr_t>(result.ptr) % kCpuAlignment == 0,
                          "gpumem CPU allocator returned a misaligned pointer");
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
      const alloc::EngineTotals totals = de_->engine->totals();
      c10::reportMemoryUsageToProfiler(result.ptr, static_cast<int64_t>(n), totals.allocated_bytes,
                                       totals.reserved_bytes, cpu);
    }
    return {result.ptr, result.ptr, &cpu_delete_fn, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &cpu_delete_fn; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    const bool profiling = c10::memoryProfilingEnabled();
    std::size_t requested = 0;
    if (C10_UNLIKELY(profiling)) {
      if (auto found = de_->engine->lookup(ptr)) requested = found->requested_bytes;
    }
    const alloc::FreeStatus status = de_->engine->free(ptr);
    TORCH_CHECK(status == alloc::FreeStatus::ok, "gpumem CPU allocator: cannot free ", ptr, ": ",
                alloc::describe(status));
    if (C10_UNLIKELY(profiling)) {
      const alloc::EngineTotals totals = de_->engine->totals();
      c10::reportMemoryUsageToProfiler(ptr, -static_cast<int64_t>(requested), totals.allocated_bytes,
                                       totals.reserved_bytes, c10::Device(c10::DeviceType::CPU));
    }
  }

  detail::DeviceEngine& engine() noexcept { return *de_; }

 private:
  [[noreturn]] void raise_oom(size_t n, const alloc::OomInfo& oom) {
    // The OOM trace record, as the CUDA allocator makes it (the postmortem's trace ends with it).
    alloc::AllocEvent event;
    event.kind = alloc::EventKind::oom;
    event.pool = oom.pool;
    event.size_bytes = oom.rounded_bytes;
    event.requested_bytes = n;
    de_->trace->record_oom(event, oom.provider.free_bytes);
    c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(n), oom.allocated_bytes, oom.reserved_bytes,
                                     c10::Device(c10::DeviceType::CPU));
    std::string postmortem;
    if (de_->forensics)
      if (auto files = de_->forensics->on_oom(oom)) postmortem = " " + files->message;
    // describe() says the request once, in the engine's one number format (the CUDA allocator's
    // message keeps PyTorch's wording and format_size, which tools parse).
    TORCH_CHECK_WITH(OutOfMemoryError, false, "gpumem CPU allocator: ", alloc::describe(oom), postmortem);
    __builtin_unreachable();
  }

  std::unique_ptr<detail::DeviceEngine> de_;
};

std::atomic<GpumemCpuAllocator*> g_cpu{nullptr};
std::atomic<bool> g_cpu_installed{false};
c10::Allocator* g_previous_cpu = nullptr;

std::mutex& cpu_install_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

void cpu_delete_fn(void* ptr) { g_cpu.load(std::memory_order_acquire)->free(ptr); }

// Host memory from HostVmmSource is a shared mapping of memfds, so a forked child (a DataLoader
// worker, say) that allocated from its copy of the engine would write into pages the parent uses.
// The child therefore goes back to the allocator install_cpu replaced; tensors it inherited still
// free into its copy of the engine, which only drops the child's own mappings. (Inherited tensors
// themselves stay shared with the parent, unlike copy-on-write heap memory.)
void restore_previous_in_child() {
  if (g_cpu_installed.load() && g_previous_cpu != nullptr) {
    c10::SetCPUAllocator(g_previous_cpu, kCpuAllocatorPriority);  // the child has one thread
    g_cpu_installed.store(false);
  }
}

}  // namespace

namespace detail {
DeviceEngine* cpu_engine() noexcept {
  GpumemCpuAllocator* a = g_cpu.load(std::memory_order_acquire);
  return a ? &a->engine() : nullptr;
}
}  // namespace detail

void install_cpu(const Config& config) {
  std::lock_guard lock(cpu_install_mutex());
  Config wanted = config;
  wanted.adapter.source = SourceKind::host_vmm;
  GpumemCpuAllocator* ours = g_cpu.load();
  if (ours != nullptr) {
    TORCH_CHECK(ours->engine().config == wanted, "gpumem::torch::install_cpu: the CPU engine already exists with "
                "configuration '", to_string(ours->engine().config), "'; it cannot be re-created with '",
                to_string(wanted), "'. Call install_cpu once, with one configuration.");
  } else {
    std::string error;
    auto de = detail::make_host_engine(wanted, detail::pointer_registry(), &error);
    TORCH_CHECK(de != nullptr, error);
    ours = new GpumemCpuAllocator(std::move(de));  // lives until the process ends
    g_cpu.store(ours, std::memory_order_release);
    pthread_atfork(nullptr, nullptr, &restore_previous_in_child);
  }
  if (g_cpu_installed.load()) return;
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current != ours) g_previous_cpu = current;
  c10::SetCPUAllocator(ours, kCpuAllocatorPriority);
  TORCH_CHECK(c10::GetCPUAllocator() == ours, "gpumem::torch::install_cpu: c10 kept its CPU allocator (another "
              "allocator was registered at a priority above ", static_cast<int>(kCpuAllocatorPriority), ")");
  g_cpu_installed.store(true);
}

void uninstall_cpu() {
  std::lock_guard lock(cpu_install_mutex());
  if (!g_cpu_installed.load()) return;
  if (g_previous_cpu != nullptr) c10::SetCPUAllocator(g_previous_cpu, kCpuAllocatorPriority);
  g_cpu_installed.store(false);
}

bool cpu_installed() noexcept { return g_cpu_installed.load(); }

}  // namespace gpumem::torch
