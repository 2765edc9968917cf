// MemoryProbe: where the checkpoint profiler and benchmarks read allocated and reserved bytes.
//
// Implementations: EventStatsProbe (counts gpumem AllocEvents: the gpumem engine's observer
// stream, or the counting CPU allocator used in tests), CudaAllocatorStatsProbe (the device
// stats of whatever c10 CUDA allocator is installed: PyTorch's native one, or gpumem's adapter).
//
// A probe measures one device. Peaks are since the last reset_peak().
//
// Thread-safety: read() and reset_peak() may be called from any thread (autograd hooks call
// them from the backward thread).
#pragma once

#include <cstdint>
#include <string>

namespace gpumem::ckpt {

struct MemoryReading {
  std::int64_t allocated_bytes = 0;
  std::int64_t peak_allocated_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t peak_reserved_bytes = 0;
};

class MemoryProbe {
 public:
  virtual ~MemoryProbe() = default;
  virtual std::string name() const = 0;
  virtual MemoryReading read() = 0;
  // Peaks restart from the current values.
  virtual void reset_peak() = 0;
  // Waits for queued device work so that times taken around it are real (no-op on the host).
  virtual void synchronize() {}
  // Returns the allocator's cached free memory to the device (empty_cache), so that reserved
  // bytes measured next are not left over from earlier work (no-op where nothing is cached).
  virtual void release_cached() {}
};

}  // namespace gpumem::ckpt
