#include "device_engine.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "gpumem/forensics/op_attribution_torch.h"
#include "gpumem/forensics/python_stacks.h"

#include "gpumem/alloc/host_vmm_source.h"
#include "gpumem/alloc/sim_source.h"
#if defined(GPUMEM_HAVE_CUDA)
#include "gpumem/alloc/cuda_sources.h"
#endif

namespace gpumem::torch::detail {
namespace {

std::unique_ptr<DeviceEngine> finish(std::unique_ptr<DeviceEngine> de, std::unique_ptr<alloc::MemorySource> source,
                                     std::unique_ptr<alloc::StreamEvents> events, PointerRegistry& registry) {
  de->source = std::make_unique<RegisteringSource>(std::move(source), registry, de->host ? -2 : de->device);
  de->device_events = std::move(events);
  de->events = std::make_unique<CaptureAwareEvents>(*de->device_events, de->capture);
  de->engine = std::make_unique<alloc::CachingAllocator>(*de->source, *de->events, de->config.engine, de->device);
  de->stats = std::make_shared<alloc::StatsObserver>(de->config.engine);
  de->trace = std::make_shared<forensics::TraceRing>();
  de->trace->configure(trace_settings_from(de->config), /*clear=*/true);
  de->trace->leave_oom_to_caller(true);  // the allocators record OOMs with the provider's free bytes
  de->engine->attach_observer(de->stats);
  const forensics::Config& wanted = de->config.forensics;
  const bool stacks = wanted.python_stacks_on();
  if (!wanted.oom_report_dir.empty() || wanted.record_ops || stacks) {
    de->forensics = std::make_unique<forensics::EngineForensics>(
        *de->engine, wanted, de->trace, to_string(de->config),
        stacks ? forensics::python_stack_symbolizer() : forensics::StackSymbolizer());
    if (wanted.record_ops) forensics::install_record_function_attribution();
    de->python_stacks_min_bytes = stacks ? std::max<std::size_t>(wanted.python_stacks_min_bytes, 1) : DeviceEngine::kNoStacks;
  }
  de->sync_trace_observer();
  return de;
}

}  // namespace

void DeviceEngine::sync_trace_observer() {
  std::lock_guard lock(trace_attach_mutex_);
  const bool wanted = trace->active();
  if (wanted == trace_attached_) return;
  if (wanted) {
    engine->attach_observer(trace);
  } else {
    engine->detach_observer(trace.get());
  }
  trace_attached_ = wanted;
}

PointerRegistry& pointer_registry() {
  static auto* registry = new PointerRegistry();  // never destroyed: deleters may run during exit
  return *registry;
}

forensics::TraceSettings trace_settings_from(const Config& config) {
  forensics::TraceSettings settings;
  settings.capacity = config.forensics.trace_entries;
  return settings;
}

bool sim_allowed() {
  const char* allow = std::getenv("GPUMEM_ALLOW_SIM");
  return allow != nullptr && std::string(allow) == "1";
}

std::unique_ptr<DeviceEngine> make_cuda_engine(const Config& config, int device, PointerRegistry& registry,
                                               std::string* error) {
  const SourceKind kind = config.adapter.source;
  if (kind == SourceKind::sim) {
    // A simulated device: accounting only, fake addresses. Lets the adapter's bookkeeping
    // (statistics, snapshots, traces, OOM) be tested on machines without a GPU.
    if (!sim_allowed()) {
      *error = "gpumem: source:sim gives CUDA tensors fake addresses that no kernel can use; it exists to test "
               "gpumem without a GPU. Use source:cuda_vmm (the default) or source:cuda_malloc, or set "
               "GPUMEM_ALLOW_SIM=1 if you only need the bookkeeping";
      return nullptr;
    }
    alloc::SimSourceOptions options;
    if (config.engine.memory_limit_bytes != 0) options.capacity_bytes = config.engine.memory_limit_bytes;
    // Distinct fake address space per device, far from real mappings.
    options.base_address = std::uintptr_t{0x7e0000000000} - static_cast<std::uintptr_t>(device) * (std::uintptr_t{1} << 40);
    auto de = std::make_unique<DeviceEngine>();
    de->device = device;
    de->simulated = true;
    de->config = config;
    return finish(std::move(de), std::make_unique<alloc::SimSource>(options), alloc::make_immediate_events(),
                  registry);
  }
#if defined(GPUMEM_HAVE_CUDA)
  if (kind != SourceKind::cuda_vmm && kind != SourceKind::cuda_malloc) {
    *error = std::string("gpumem: source:") + to_string(kind) +
             " cannot serve CUDA tensors; use source:cuda_vmm (the default) or source:cuda_malloc";
    return nullptr;
  }
  const bool vmm = kind == SourceKind::cuda_vmm;
  alloc::CudaVmmOptions vmm_options;
  vmm_options.exportable = config.adapter.ipc_handles;
  auto source = alloc::make_cuda_source(vmm, device, vmm_options);
  alloc::SourceStatus status = alloc::SourceStatus::ok;
  if (auto* s = dynamic_cast<alloc::CudaVmmSource*>(source.get())) status = s->init_status();
  if (auto* s = dynamic_cast<alloc::CudaMallocSource*>(source.get())) status = s->init_status();
  if (status != alloc::SourceStatus::ok) {
    *error = "gpumem: cannot use CUDA device " + std::to_string(device) + " through " +
             (vmm ? "the driver's virtual memory API (source:cuda_vmm)" : "cudaMalloc (source:cuda_malloc)") + ": " +
             source->last_error() +
             (vmm ? ". If the driver lacks virtual memory support, set source:cuda_malloc in GPUMEM_ALLOC_CONF" : "");
    return nullptr;
  }
  auto de = std::make_unique<DeviceEngine>();
  de->device = device;
  de->config = config;
  return finish(std::move(de), std::move(source), std::make_unique<alloc::CudaStreamEvents>(device), registry);
#else
  (void)config;
  (void)registry;
  *error = "gpumem: CUDA device " + std::to_string(device) +
           " requested, but gpumem was built without the CUDA toolkit";
  return nullptr;
#endif
}

std::unique_ptr<DeviceEngine> make_host_engine(const Config& config, PointerRegistry& registry, std::string* error) {
  auto source = std::make_unique<alloc::HostVmmSource>();
  if (source->init_status() != alloc::SourceStatus::ok) {
    *error = "gpumem: host memory source unavailable: " + source->last_error();
    return nullptr;
  }
  auto de = std::make_unique<DeviceEngine>();
  de->device = 0;
  de->host = true;
  de->config = config;
  de->config.adapter.source = SourceKind::host_vmm;
  return finish(std::move(de), std::move(source), alloc::make_immediate_events(), registry);
}

}  // namespace gpumem::torch::detail
