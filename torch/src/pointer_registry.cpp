#include "pointer_registry.h"

#include <mutex>
#include <utility>

namespace gpumem::torch::detail {

void PointerRegistry::add(alloc::VaRange range, int owner) {
  std::unique_lock lock(mutex_);
  ranges_[range.base] = Entry{range.size_bytes, owner};
}

void PointerRegistry::remove(alloc::VaRange range) {
  std::unique_lock lock(mutex_);
  ranges_.erase(range.base);
}

int PointerRegistry::owner_of(const void* addr) const {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  std::shared_lock lock(mutex_);
  auto it = ranges_.upper_bound(a);
  if (it == ranges_.begin()) return -1;
  --it;
  return a - it->first < it->second.size_bytes ? it->second.owner : -1;
}

std::size_t PointerRegistry::ranges() const {
  std::shared_lock lock(mutex_);
  return ranges_.size();
}

RegisteringSource::RegisteringSource(std::unique_ptr<alloc::MemorySource> inner, PointerRegistry& registry,
                                     int owner)
    : inner_(std::move(inner)), registry_(registry), owner_(owner) {}

alloc::SourceCaps RegisteringSource::caps() const noexcept { return inner_->caps(); }

alloc::SourceResult<alloc::VaRange> RegisteringSource::reserve(std::size_t size_bytes, std::size_t alignment_bytes) {
  auto result = inner_->reserve(size_bytes, alignment_bytes);
  if (result.ok()) registry_.add(result.value, owner_);
  return result;
}

alloc::SourceStatus RegisteringSource::release(alloc::VaRange range) {
  const auto status = inner_->release(range);
  if (status == alloc::SourceStatus::ok) registry_.remove(range);
  return status;
}

alloc::SourceResult<alloc::PhysHandle> RegisteringSource::create(std::size_t size_bytes) {
  return inner_->create(size_bytes);
}

alloc::SourceStatus RegisteringSource::destroy(alloc::PhysHandle handle) { return inner_->destroy(handle); }

alloc::SourceStatus RegisteringSource::map(std::uintptr_t va, std::size_t size_bytes, alloc::PhysHandle handle) {
  return inner_->map(va, size_bytes, handle);
}

alloc::SourceStatus RegisteringSource::unmap(std::uintptr_t va, std::size_t size_bytes) {
  return inner_->unmap(va, size_bytes);
}

alloc::ProviderMemInfo RegisteringSource::mem_info() const { return inner_->mem_info(); }

std::string RegisteringSource::last_error() const { return inner_->last_error(); }

}  // namespace gpumem::torch::detail
