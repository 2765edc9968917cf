// DeviceEngine: everything gpumem runs for one device (a CUDA device, or the host for CPU
// tensors): the memory source (wrapped so the pointer registry knows its ranges), the stream
// events, the caching engine, and the observers the torch adapter reads (statistics with
// PyTorch's meaning, and the engine's one trace ring, which forensics shares).
//
// Engines are created once per device and never destroyed while the process runs: libtorch keeps
// deleters that point at them in every tensor, including tensors destroyed during exit.
//
// Thread-safety: the members are the engine's and observers' own (all thread-safe); the struct
// itself is immutable once shared (make_*, then pool_engines set by the adapter before publishing),
// but for whether the trace ring is attached (sync_trace_observer, under its own mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/memory_source.h"
#include "gpumem/alloc/stats.h"
#include "gpumem/alloc/stream_events.h"
#include "gpumem/forensics/engine_forensics.h"
#include "gpumem/forensics/trace_ring.h"
#include "capture_events.h"
#include "gpumem/torch/config.h"
#include "pointer_registry.h"

namespace gpumem::torch::detail {

struct DeviceEngine {
  int device = 0;  // CUDA device index; 0 for the host engine
  bool host = false;
  bool simulated = false;  // SimSource: fake addresses, no device calls (tests without a GPU)
  Config config;
  std::unique_ptr<RegisteringSource> source;
  // Open while a CUDA graph capture may be underway on the device (graph_pools.h).
  CaptureGate capture;
  std::unique_ptr<alloc::StreamEvents> device_events;  // the device's own (CUDA events, or immediate)
  // What the engines of the device use: device_events behind the capture gate (capture_events.h).
  std::unique_ptr<alloc::StreamEvents> events;
  std::unique_ptr<alloc::CachingAllocator> engine;
  std::shared_ptr<alloc::StatsObserver> stats;
  // The engine's trace: PyTorch's history (_record_memory_history, trace_entries) and the
  // forensics' records, one ring. OOM records come from the adapter (record_oom, with the
  // provider's free bytes). Attached to `engine` only while it records (sync_trace_observer).
  std::shared_ptr<forensics::TraceRing> trace;
  // gpumem's forensics (OOM postmortem, per-op table), when the config asks for them
  // (oom_report_dir, record_ops); null otherwise. Uses `trace`.
  std::unique_ptr<forensics::EngineForensics> forensics;
  // The engines of the device's private pools (graph_pools.h), for snapshots: set with the device's
  // GraphPools, before the engine is shared; empty for the host engine.
  forensics::EngineForensics::PoolEngines pool_engines;
  // Allocations of at least this many bytes gather their Python stack (python_stacks,
  // python_stacks_min_kb; forensics/python_stacks.h); kNoStacks when python_stacks is off.
  static constexpr std::size_t kNoStacks = SIZE_MAX;
  std::size_t python_stacks_min_bytes = kNoStacks;

  bool wants_python_stack(std::size_t bytes) const noexcept { return bytes >= python_stacks_min_bytes; }

  // Attaches `trace` to `engine` while the ring records anything (TraceRing::active: a capacity,
  // a tracker hook, the forensics' floor) and detaches it otherwise, so that an idle ring costs an
  // engine call nothing (no needs() and no on_events per call). Call after anything that may
  // change trace->active(): configure, add_hook, making `forensics`. Events of calls that run
  // while it is called may reach the ring or not; every call that starts after it returns does.
  // The private pools' engines keep the ring attached (graph_pools.cpp). Thread-safe; takes
  // trace_attach_mutex, then the engine's lock.
  void sync_trace_observer();

 private:
  std::mutex trace_attach_mutex_;
  bool trace_attached_ = false;  // under trace_attach_mutex_
};

// The engine for CUDA device `device` on CudaVmmSource (config.adapter.source == cuda_vmm) or
// CudaMallocSource (cuda_malloc). On failure returns null and sets *error to one sentence naming
// the problem and the fix (no driver, no device, no virtual memory support, wrong source kind).
// source:sim gives a simulated device (SimSource, fake addresses; capacity = memory_limit_mb),
// only when the environment has GPUMEM_ALLOW_SIM=1: it tests the adapter without a GPU.
std::unique_ptr<DeviceEngine> make_cuda_engine(const Config& config, int device, PointerRegistry& registry,
                                               std::string* error);

// The engine for CPU tensors on HostVmmSource (config.adapter.source is ignored).
std::unique_ptr<DeviceEngine> make_host_engine(const Config& config, PointerRegistry& registry, std::string* error);

// The process-wide registry of ranges reserved by every engine made here.
PointerRegistry& pointer_registry();

// Trace settings a config asks for (trace_entries).
forensics::TraceSettings trace_settings_from(const Config& config);

}  // namespace gpumem::torch::detail
