// DeviceEngine: everything gpumem runs for one device (a CUDA device, or the host for CPU
// tensors): the memory source (wrapped so the pointer registry knows its ranges), the stream
// events, the caching engine, and the observers the torch adapter reads (statistics with
// PyTorch's meaning, and the trace ring).
//
// Engines are created once per device and never destroyed while the process runs: libtorch keeps
// deleters that point at them in every tensor, including tensors destroyed during exit.
//
// Thread-safety: the members are the engine's and observers' own (all thread-safe); the struct
// itself is immutable after make_*.
#pragma once

#include <memory>
#include <string>

#include "gpumem/forensics/engine_forensics.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/config.h"
#include "gpumem/alloc/memory_source.h"
#include "gpumem/alloc/stats.h"
#include "gpumem/alloc/stream_events.h"
#include "pointer_registry.h"
#include "trace_ring.h"

namespace gpumem::torch::detail {

struct DeviceEngine {
  int device = 0;  // CUDA device index; 0 for the host engine
  bool host = false;
  bool simulated = false;  // SimSource: fake addresses, no device calls (tests without a GPU)
  alloc::Config config;
  std::unique_ptr<RegisteringSource> source;
  std::unique_ptr<alloc::StreamEvents> events;
  std::unique_ptr<alloc::CachingAllocator> engine;
  std::shared_ptr<alloc::StatsObserver> stats;
  std::shared_ptr<TraceRing> trace;
  // gpumem's forensics (OOM postmortem, per-op table), when the config asks for them
  // (oom_report_dir, record_ops); null otherwise.
  std::unique_ptr<forensics::EngineForensics> forensics;
};

// The engine for CUDA device `device` on CudaVmmSource (config.source == cuda_vmm) or
// CudaMallocSource (cuda_malloc). On failure returns null and sets *error to one sentence naming
// the problem and the fix (no driver, no device, no virtual memory support, wrong source kind).
// source:sim gives a simulated device (SimSource, fake addresses; capacity = memory_limit_mb),
// only when the environment has GPUMEM_ALLOW_SIM=1: it tests the adapter without a GPU.
std::unique_ptr<DeviceEngine> make_cuda_engine(const alloc::Config& config, int device, PointerRegistry& registry,
                                               std::string* error);

// The engine for CPU tensors on HostVmmSource (config.source is ignored).
std::unique_ptr<DeviceEngine> make_host_engine(const alloc::Config& config, PointerRegistry& registry,
                                               std::string* error);

// The process-wide registry of ranges reserved by every engine made here.
PointerRegistry& pointer_registry();

// Trace settings a config asks for (trace_entries).
TraceSettings trace_settings_from(const alloc::Config& config);

}  // namespace gpumem::torch::detail
