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

// The base binds *inner before inner_ takes it over: the source itself stays where it is.
RegisteringSource::RegisteringSource(std::unique_ptr<alloc::MemorySource> inner, PointerRegistry& registry,
                                     int owner)
    : ForwardingSource(*inner), inner_(std::move(inner)), registry_(registry), owner_(owner) {}

alloc::SourceResult<alloc::VaRange> RegisteringSource::reserve(std::size_t size_bytes, std::size_t alignment_bytes) {
  auto result = ForwardingSource::reserve(size_bytes, alignment_bytes);
  if (result.ok()) registry_.add(result.value, owner_);
  return result;
}

alloc::SourceStatus RegisteringSource::release(alloc::VaRange range) {
  const auto status = ForwardingSource::release(range);
  if (status == alloc::SourceStatus::ok) registry_.remove(range);
  return status;
}

}  // namespace gpumem::torch::detail
