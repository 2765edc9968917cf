#include "gpumem/ckpt/counting_cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>

namespace gpumem::ckpt {

// What a DataPtr handed out by this allocator points to as its context: the inner allocator's
// DataPtr (freed when the block is destroyed) and the size to report.
struct CountingCpuAllocator::Block {
  c10::DataPtr inner;
  std::size_t size_bytes = 0;
  CountingCpuAllocator* owner = nullptr;
};

namespace {
std::mutex install_mutex;
CountingCpuAllocator* installed = nullptr;
}  // namespace

CountingCpuAllocator& CountingCpuAllocator::install(std::uint8_t priority) {
  std::lock_guard lock(install_mutex);
  static CountingCpuAllocator* instance = new CountingCpuAllocator();  // never destroyed
  if (installed == instance) return *instance;
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  TORCH_CHECK(current != nullptr, "CountingCpuAllocator::install: c10 has no CPU allocator");
  instance->inner_ = current;
  instance->priority_ = priority;
  c10::SetAllocator(c10::DeviceType::CPU, instance, priority);
  TORCH_CHECK(c10::GetAllocator(c10::DeviceType::CPU) == instance,
              "CountingCpuAllocator::install: c10 kept its CPU allocator (it was set with a "
              "priority above ", int(priority), "); install with a higher priority");
  installed = instance;
  return *instance;
}

void CountingCpuAllocator::uninstall() {
  std::lock_guard lock(install_mutex);
  if (installed == nullptr) return;
  c10::SetAllocator(c10::DeviceType::CPU, installed->inner_, installed->priority_);
  installed = nullptr;
}

void CountingCpuAllocator::set_observer(std::shared_ptr<alloc::AllocObserver> observer) {
  std::lock_guard lock(mutex_);
  observer_ = std::move(observer);
}

std::shared_ptr<alloc::AllocObserver> CountingCpuAllocator::observer() const {
  std::lock_guard lock(mutex_);
  return observer_;
}

void CountingCpuAllocator::publish(alloc::EventKind kind, const void* ptr,
                                   std::size_t size_bytes) {
  auto obs = observer();
  if (!obs) return;
  alloc::AllocEvent e;
  e.kind = kind;
  e.device = 0;
  e.addr = reinterpret_cast<std::uintptr_t>(ptr);
  e.size_bytes = size_bytes;
  e.requested_bytes = size_bytes;
  e.seq = seq_.fetch_add(1, std::memory_order_relaxed);
  e.t_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  obs->on_events(std::span<const alloc::AllocEvent>(&e, 1));
}

c10::DataPtr CountingCpuAllocator::allocate(std::size_t n) {
  c10::DataPtr inner = inner_->allocate(n);
  void* data = inner.get();
  const c10::Device device = inner.device();
  auto* block = new Block{std::move(inner), n, this};
  allocations_.fetch_add(1, std::memory_order_relaxed);
  if (n > 0) publish(alloc::EventKind::alloc, data, n);
  return c10::DataPtr(data, block, &CountingCpuAllocator::release, device);
}

void CountingCpuAllocator::release(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  const void* data = block->inner.get();
  const std::size_t n = block->size_bytes;
  CountingCpuAllocator* owner = block->owner;
  delete block;  // frees the memory through the inner allocator's deleter
  if (n > 0) {
    owner->publish(alloc::EventKind::free_requested, data, n);
    owner->publish(alloc::EventKind::free_completed, data, n);
  }
}

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count > 0) std::memcpy(dest, src, count);
}

}  // namespace gpumem::ckpt
