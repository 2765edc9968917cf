// Reading gpumem's engines from C++: statistics with PyTorch's DeviceStats meaning (the numbers
// torch.cuda.memory_stats() shows), the flat key/value form, snapshots and the engines themselves.
// These work for the CPU engine (install_cpu) as well as for CUDA devices, which is how CPU
// training code (activation checkpointing, ZeRO) reads its peak and current memory:
//
//   gpumem::torch::install_cpu();
//   gpumem::torch::reset_peak_stats(c10::kCPU);
//   ... train a step ...
//   auto s = gpumem::torch::stats(c10::kCPU);
//   int64_t peak = s.allocated_bytes[0].peak;   // [0] = all pools, [1] small, [2] large
//
// Meaning of the fields: PyTorch 2.11's (DeviceStats in c10/core/CachingDeviceAllocator.h).
// For CPU there is one engine; a c10::Device of type CPU with any index names it.
//
// A device whose engine does not exist yet (nothing was allocated there, or gpumem is not
// installed for it) reads as all zeros; reset_* on it does nothing. The snapshot and engine
// accessors throw c10::Error for such a device, naming the device.
//
// Thread-safety: every function may be called from any thread at any time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/events.h"
#include "gpumem/alloc/introspection.h"

namespace gpumem::torch {

using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;

// Statistics of the engine serving device (kCPU or kCUDA:i).
DeviceStats stats(c10::Device device);
void reset_peak_stats(c10::Device device);         // every peak := its current value
void reset_accumulated_stats(c10::Device device);  // every allocated/freed counter := 0

// The same statistics under torch.cuda.memory_stats()'s flat keys ("allocated_bytes.all.peak",
// "num_ooms", ...), sorted.
std::map<std::string, std::int64_t> memory_stats(c10::Device device);

// The engine's blocks and segments now (plain data; also records a snapshot trace event).
alloc::EngineSnapshot engine_snapshot(c10::Device device);

// The allocation trace kept for device: the last trace_entries events (config key trace_entries,
// or torch.cuda.memory._record_memory_history on CUDA), oldest first. Empty when tracing is off.
std::vector<alloc::AllocEvent> trace_events(c10::Device device);

// Writes the snapshot of device's engine to path: PyTorch's snapshot layout (what
// torch.cuda.memory._dump_snapshot writes, with the trace kept for the device) plus gpumem's
// additions (ops, settings), as a pickle, or JSON when the name ends in ".json". `gpumem report`
// and PyTorch's memory_viz read it. Throws c10::Error naming the device or the path.
void write_snapshot(c10::Device device, const std::string& path);

// The engine itself (for attaching observers and introspection); null if it does not exist yet.
alloc::CachingAllocator* engine(c10::Device device);

// Shorthands for the CPU engine.
inline DeviceStats cpu_stats() { return stats(c10::Device(c10::DeviceType::CPU)); }
inline void reset_cpu_peak_stats() { reset_peak_stats(c10::Device(c10::DeviceType::CPU)); }
inline alloc::EngineSnapshot cpu_snapshot() { return engine_snapshot(c10::Device(c10::DeviceType::CPU)); }

}  // namespace gpumem::torch
