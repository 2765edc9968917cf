// CountingCpuAllocator: a c10 CPU allocator that forwards every request to the CPU allocator it
// replaced and reports each allocation and free to an AllocObserver as gpumem AllocEvents
// (alloc, then free_requested + free_completed; device 0, stream 0, requested = size). With an
// EventStatsProbe as the observer it measures CPU tensor memory the way gpumem measures
// everything: from the event stream. It stands in for gpumem::torch::install_cpu (issue 4) until
// that lands, and for tests that need exact CPU byte counts.
//
// Its data pointers are "simple" (context == data), as c10's raw_allocate requires (CPU kernels
// use it for scratch): sizes are kept in a table keyed by address, and the memory comes from the
// replaced allocator's raw interface, so that allocator must have a raw deleter (c10's default
// CPU allocator has).
//
// install() puts one process-wide instance in front of c10's CPU allocator (c10::SetAllocator
// with the given priority) and returns it; uninstall() puts the previous allocator back. The
// instance is never destroyed: tensors allocated through it may outlive uninstall() and still
// come back through its deleter. Memory not allocated through c10 (BLAS or oneDNN scratch) is
// not seen.
//
// Thread-safety: allocate and the deleter may run on any thread; the observer is called outside
// any lock held here and must synchronize itself. set_observer may be called at any time.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "gpumem/alloc/events.h"

namespace gpumem::ckpt {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Priority 10: the level gpumem::torch::install_cpu uses, so either can replace the other.
  static CountingCpuAllocator& install(std::uint8_t priority = 10);
  static void uninstall();

  // The observer that receives events from now on (nullptr: none).
  void set_observer(std::shared_ptr<alloc::AllocObserver> observer);

  c10::DataPtr allocate(std::size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  std::uint64_t allocations() const noexcept { return allocations_.load(); }

 private:
  CountingCpuAllocator() = default;
  static void release(void* data);
  void publish(alloc::EventKind kind, const void* ptr, std::size_t size_bytes);
  std::shared_ptr<alloc::AllocObserver> observer() const;

  c10::Allocator* inner_ = nullptr;
  std::uint8_t priority_ = 10;
  mutable std::mutex mutex_;  // guards observer_ and sizes_
  std::shared_ptr<alloc::AllocObserver> observer_;
  std::unordered_map<const void*, std::size_t> sizes_;  // live allocations
  std::atomic<std::uint64_t> seq_{0};
  std::atomic<std::uint64_t> allocations_{0};
};

}  // namespace gpumem::ckpt
