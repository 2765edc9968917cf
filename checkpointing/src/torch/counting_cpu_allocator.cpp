#include "gpumem/ckpt/counting_cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>

namespace gpumem::ckpt {

namespace {
std::mutex install_mutex;
CountingCpuAllocator* instance = nullptr;   // created once, never destroyed
CountingCpuAllocator* installed = nullptr;  // instance while it is c10's CPU allocator
}  // namespace

CountingCpuAllocator& CountingCpuAllocator::install(std::uint8_t priority) {
  std::lock_guard lock(install_mutex);
  if (instance == nullptr) instance = new CountingCpuAllocator();
  if (installed == instance) return *instance;
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  TORCH_CHECK(current != nullptr, "CountingCpuAllocator::install: c10 has no CPU allocator");
  TORCH_CHECK(current->raw_deleter() != nullptr,
              "CountingCpuAllocator::install: the current CPU allocator has no raw interface "
              "(raw_deleter is null); install the counting allocator before any other");
  // Blocks go back to the allocator they came from, so the replaced allocator stays the same
  // across uninstall() and install().
  TORCH_CHECK(instance->inner_ == nullptr || instance->inner_ == current,
              "CountingCpuAllocator::install: c10's CPU allocator changed since the counting "
              "allocator was first installed; install it once, before other allocators");
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
  void* data = inner_->raw_allocate(n);
  allocations_.fetch_add(1, std::memory_order_relaxed);
  if (data != nullptr) {
    {
      std::lock_guard lock(mutex_);
      sizes_[data] = n;
    }
    if (n > 0) publish(alloc::EventKind::alloc, data, n);
  }
  return c10::DataPtr(data, data, &CountingCpuAllocator::release, c10::Device(c10::DeviceType::CPU));
}

void CountingCpuAllocator::release(void* data) {
  if (data == nullptr) return;
  CountingCpuAllocator* self = instance;
  std::size_t n = 0;
  {
    std::lock_guard lock(self->mutex_);
    auto it = self->sizes_.find(data);
    TORCH_INTERNAL_ASSERT(it != self->sizes_.end(),
                          "CountingCpuAllocator: freeing a pointer it did not allocate");
    n = it->second;
    self->sizes_.erase(it);
  }
  self->inner_->raw_deallocate(data);
  if (n > 0) {
    self->publish(alloc::EventKind::free_requested, data, n);
    self->publish(alloc::EventKind::free_completed, data, n);
  }
}

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count > 0) std::memcpy(dest, src, count);
}

}  // namespace gpumem::ckpt
