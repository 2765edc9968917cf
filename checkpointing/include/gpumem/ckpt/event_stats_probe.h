// EventStatsProbe: a MemoryProbe that counts allocated and reserved bytes from the gpumem
// AllocEvent stream, the way every gpumem number is produced (the engine emits, observers
// count). Attach it to a gpumem engine (CachingAllocator::attach_observer) or to the counting
// CPU allocator (counting_cpu_allocator.h).
//
// Accounting: alloc adds size_bytes to allocated, free_requested subtracts it (the user gave
// the block back; PyTorch's "allocated" drops there too); segment_alloc / segment_map add to
// reserved, segment_free / segment_unmap subtract. Events of devices other than `device` are
// ignored. Invariant: allocated_bytes <= peak_allocated_bytes, reserved likewise.
//
// Thread-safety: on_events, read and reset_peak may run concurrently (one mutex).
#pragma once

#include <mutex>
#include <span>
#include <string>

#include "gpumem/alloc/events.h"
#include "gpumem/ckpt/memory_probe.h"

namespace gpumem::ckpt {

class EventStatsProbe final : public MemoryProbe, public alloc::AllocObserver {
 public:
  explicit EventStatsProbe(std::string name, int device = 0);

  void on_events(std::span<const alloc::AllocEvent> events) override;

  std::string name() const override { return name_; }
  MemoryReading read() override;
  void reset_peak() override;

 private:
  std::string name_;
  int device_;
  std::mutex mutex_;
  MemoryReading reading_;
};

}  // namespace gpumem::ckpt
