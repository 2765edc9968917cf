#include "gpumem/alloc/sim_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

namespace gpumem::alloc {

const char* to_string(SourceStatus status) noexcept {
  switch (status) {
    case SourceStatus::ok: return "ok";
    case SourceStatus::out_of_memory: return "out of memory";
    case SourceStatus::fault_injected: return "fault injected";
    case SourceStatus::unsupported: return "unsupported";
    case SourceStatus::invalid_argument: return "invalid argument";
    case SourceStatus::driver_error: return "driver error";
  }
  return "unknown";
}

SimSource::SimSource(SimSourceOptions options) : options_(options), next_va_(options.base_address) {}

SourceCaps SimSource::caps() const noexcept {
  SourceCaps c;
  c.name = "sim";
  c.granularity_bytes = options_.granularity_bytes;
  c.virtual_memory = options_.virtual_memory;
  c.host_accessible = false;
  c.device_memory = false;
  return c;
}

bool SimSource::inject_locked(Op op) {
  auto& countdown = fail_countdown_[static_cast<int>(op)];
  if (countdown == 0) return false;
  return --countdown == 0;
}

SourceStatus SimSource::fail_locked(SourceStatus status, std::string message) {
  last_error_ = std::move(message);
  return status;
}

SourceResult<VaRange> SimSource::reserve(std::size_t size_bytes, std::size_t alignment_bytes) {
  std::lock_guard lock(mutex_);
  const std::size_t g = options_.granularity_bytes;
  if (size_bytes == 0 || size_bytes % g != 0)
    return {fail_locked(SourceStatus::invalid_argument,
                        fmt::format("reserve: size {} is not a positive multiple of {}", size_bytes, g)),
            {}};
  if (inject_locked(Op::reserve))
    return {fail_locked(SourceStatus::fault_injected, "reserve: injected fault"), {}};
  if (!options_.virtual_memory && physical_bytes_ + size_bytes > options_.capacity_bytes)
    return {fail_locked(SourceStatus::out_of_memory,
                        fmt::format("reserve: {} bytes would exceed the capacity of {} bytes "
                                    "({} in use)", size_bytes, options_.capacity_bytes, physical_bytes_)),
            {}};
  if (alignment_bytes && !std::has_single_bit(alignment_bytes))
    return {fail_locked(SourceStatus::invalid_argument,
                        fmt::format("reserve: alignment {} is not a power of two; pass 0 for the granularity "
                                    "or a power of two", alignment_bytes)),
            {}};
  const std::size_t align = alignment_bytes ? alignment_bytes : g;
  std::uintptr_t base = (next_va_ + align - 1) / align * align;
  next_va_ = base + size_bytes + g;  // a guard gap between ranges
  reserved_.emplace(base, size_bytes);
  if (!options_.virtual_memory) {
    physical_bytes_ += size_bytes;
    peak_physical_bytes_ = std::max(peak_physical_bytes_, physical_bytes_);
  }
  ++counters_.reserves;
  return {SourceStatus::ok, VaRange{base, size_bytes}};
}

SourceStatus SimSource::release(VaRange range) {
  std::lock_guard lock(mutex_);
  auto it = reserved_.find(range.base);
  if (it == reserved_.end() || it->second != range.size_bytes)
    return fail_locked(SourceStatus::invalid_argument,
                       fmt::format("release: [{:#x}, +{}) was not reserved here", range.base, range.size_bytes));
  auto m = mappings_.lower_bound(range.base);
  if (m != mappings_.end() && m->first < range.end())
    return fail_locked(SourceStatus::invalid_argument,
                       fmt::format("release: a piece is still mapped at {:#x}", m->first));
  if (inject_locked(Op::release)) return fail_locked(SourceStatus::fault_injected, "release: injected fault");
  reserved_.erase(it);
  if (!options_.virtual_memory) physical_bytes_ -= range.size_bytes;
  ++counters_.releases;
  return SourceStatus::ok;
}

SourceResult<PhysHandle> SimSource::create(std::size_t size_bytes) {
  std::lock_guard lock(mutex_);
  if (!options_.virtual_memory)
    return {fail_locked(SourceStatus::unsupported, "create: this source has no virtual memory"), 0};
  const std::size_t g = options_.granularity_bytes;
  if (size_bytes == 0 || size_bytes % g != 0)
    return {fail_locked(SourceStatus::invalid_argument,
                        fmt::format("create: size {} is not a positive multiple of {}", size_bytes, g)),
            0};
  if (inject_locked(Op::create)) return {fail_locked(SourceStatus::fault_injected, "create: injected fault"), 0};
  if (physical_bytes_ + size_bytes > options_.capacity_bytes)
    return {fail_locked(SourceStatus::out_of_memory,
                        fmt::format("create: {} bytes would exceed the capacity of {} bytes ({} in use)",
                                    size_bytes, options_.capacity_bytes, physical_bytes_)),
            0};
  PhysHandle h = next_handle_++;
  if (pieces_.size() <= h) pieces_.resize(h + 1);
  pieces_[h] = {size_bytes, 0, true};
  physical_bytes_ += size_bytes;
  peak_physical_bytes_ = std::max(peak_physical_bytes_, physical_bytes_);
  ++counters_.creates;
  return {SourceStatus::ok, h};
}

SourceStatus SimSource::destroy(PhysHandle handle) {
  std::lock_guard lock(mutex_);
  Piece* piece = live_piece_locked(handle);
  if (piece == nullptr)
    return fail_locked(SourceStatus::invalid_argument, fmt::format("destroy: unknown handle {}", handle));
  if (piece->mappings != 0)
    return fail_locked(SourceStatus::invalid_argument, fmt::format("destroy: handle {} is still mapped", handle));
  if (inject_locked(Op::destroy)) return fail_locked(SourceStatus::fault_injected, "destroy: injected fault");
  physical_bytes_ -= piece->size_bytes;
  *piece = Piece{};
  ++counters_.destroys;
  return SourceStatus::ok;
}

SourceStatus SimSource::map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) {
  std::lock_guard lock(mutex_);
  if (!options_.virtual_memory) return fail_locked(SourceStatus::unsupported, "map: this source has no virtual memory");
  Piece* piece = live_piece_locked(handle);
  if (piece == nullptr)
    return fail_locked(SourceStatus::invalid_argument, fmt::format("map: unknown handle {}", handle));
  if (piece->size_bytes != size_bytes)
    return fail_locked(SourceStatus::invalid_argument,
                       fmt::format("map: size {} differs from the piece's {}", size_bytes, piece->size_bytes));
  auto r = reserved_.upper_bound(va);
  if (r == reserved_.begin() || (--r, va + size_bytes > r->first + r->second) || va % options_.granularity_bytes)
    return fail_locked(SourceStatus::invalid_argument,
                       fmt::format("map: [{:#x}, +{}) is not aligned inside a reserved range", va, size_bytes));
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + size_bytes)
    return fail_locked(SourceStatus::invalid_argument, fmt::format("map: {:#x} overlaps a mapping", va));
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size_bytes > va)
      return fail_locked(SourceStatus::invalid_argument, fmt::format("map: {:#x} overlaps a mapping", va));
  }
  if (inject_locked(Op::map)) return fail_locked(SourceStatus::fault_injected, "map: injected fault");
  mappings_.emplace_hint(next, va, Mapping{handle, size_bytes});
  ++piece->mappings;
  mapped_bytes_ += size_bytes;
  ++counters_.maps;
  return SourceStatus::ok;
}

SourceStatus SimSource::unmap(std::uintptr_t va, std::size_t size_bytes) {
  std::lock_guard lock(mutex_);
  auto it = mappings_.find(va);
  if (it == mappings_.end())
    return fail_locked(SourceStatus::invalid_argument, fmt::format("unmap: nothing is mapped at {:#x}", va));
  if (it->second.size_bytes != size_bytes)
    return fail_locked(SourceStatus::invalid_argument,
                       fmt::format("unmap: size {} differs from the mapping's {}", size_bytes, it->second.size_bytes));
  if (inject_locked(Op::unmap)) return fail_locked(SourceStatus::fault_injected, "unmap: injected fault");
  --pieces_[it->second.handle].mappings;
  mappings_.erase(it);
  mapped_bytes_ -= size_bytes;
  ++counters_.unmaps;
  return SourceStatus::ok;
}

ProviderMemInfo SimSource::mem_info() const {
  std::lock_guard lock(mutex_);
  return {options_.capacity_bytes - std::min(physical_bytes_, options_.capacity_bytes), options_.capacity_bytes};
}

std::string SimSource::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

void SimSource::fail_nth(Op op, std::uint64_t nth) {
  std::lock_guard lock(mutex_);
  fail_countdown_[static_cast<int>(op)] = nth;
}

void SimSource::set_capacity(std::size_t capacity_bytes) {
  std::lock_guard lock(mutex_);
  options_.capacity_bytes = capacity_bytes;
}

SimSourceCounters SimSource::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

std::size_t SimSource::physical_bytes() const {
  std::lock_guard lock(mutex_);
  return physical_bytes_;
}

std::size_t SimSource::peak_physical_bytes() const {
  std::lock_guard lock(mutex_);
  return peak_physical_bytes_;
}

std::size_t SimSource::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return mapped_bytes_;
}

}  // namespace gpumem::alloc
