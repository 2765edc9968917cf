#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <system_error>

#include "gpumem/pinned/host_memory_source.h"
#include "host_mapping.h"

namespace gpumem::pinned {

struct LockedHostSource::Live {
  std::map<std::uintptr_t, HostRegion> regions;
};

namespace {

std::string memlock_limit_words() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "RLIMIT_MEMLOCK unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "RLIMIT_MEMLOCK unlimited";
  return fmt::format("RLIMIT_MEMLOCK {} KiB", limit.rlim_cur / 1024);
}

}  // namespace

LockedHostSource::LockedHostSource(LockedHostSourceOptions options)
    : options_(options), page_bytes_(detail::system_page_bytes()), live_(std::make_unique<Live>()) {}

LockedHostSource::~LockedHostSource() {
  std::lock_guard lock(mutex_);
  for (const auto& [base, region] : live_->regions) {
    if (region.locked) ::munlock(reinterpret_cast<void*>(base), region.size_bytes);
    ::munmap(reinterpret_cast<void*>(base), region.size_bytes);
  }
}

HostSourceCaps LockedHostSource::caps() const noexcept { return {"locked_host", page_bytes_, false}; }

alloc::SourceResult<HostRegion> LockedHostSource::map_locked(std::size_t size_bytes, std::size_t alignment_bytes) {
  std::lock_guard lock(mutex_);
  if (auto bad = detail::check_region_request(size_bytes, alignment_bytes, page_bytes_); !bad.empty()) {
    last_error_ = "LockedHostSource::map_locked: " + bad;
    return {alloc::SourceStatus::invalid_argument, {}};
  }
  if (options_.capacity_bytes != 0 && counters_.mapped_bytes + size_bytes > options_.capacity_bytes) {
    last_error_ = fmt::format("LockedHostSource: mapping {} bytes would pass the capacity of {} bytes ({} mapped)",
                              size_bytes, options_.capacity_bytes, counters_.mapped_bytes);
    return {alloc::SourceStatus::out_of_memory, {}};
  }
  if (fail_map_in_ != 0 && --fail_map_in_ == 0) {
    last_error_ = "LockedHostSource: map failed by fault injection";
    return {alloc::SourceStatus::fault_injected, {}};
  }
  auto mapped = detail::map_aligned(size_bytes, alignment_bytes, page_bytes_);
  if (!mapped.ok()) {
    last_error_ = "LockedHostSource: " + mapped.error;
    return {alloc::SourceStatus::out_of_memory, {}};
  }
  HostRegion region{mapped.base, size_bytes, false};
  if (options_.lock != LockMode::none) {
    int err = 0;
    if (fail_lock_in_ != 0 && --fail_lock_in_ == 0) {
      err = ENOMEM;
    } else if (::mlock(reinterpret_cast<void*>(region.base), size_bytes) != 0) {
      err = errno;
    }
    if (err == 0) {
      region.locked = true;
    } else {
      const std::string why = fmt::format("mlock of {} bytes refused: {} (errno {}; {}, {} bytes locked already)",
                                          size_bytes, std::generic_category().message(err), err,
                                          memlock_limit_words(), counters_.locked_bytes);
      ++counters_.lock_refusals;
      if (options_.lock == LockMode::require) {
        ::munmap(reinterpret_cast<void*>(region.base), size_bytes);
        last_error_ = "LockedHostSource: " + why;
        return {alloc::SourceStatus::out_of_memory, {}};
      }
      if (lock_refusal_.empty()) {
        std::fprintf(stderr,
                     "gpumem pinned: %s; host memory of this stand-in source stays pageable (locked_bytes counts "
                     "only what was locked). Raise the limit (ulimit -l) to lock it.\n",
                     why.c_str());
      }
      lock_refusal_ = why;
    }
  }
  live_->regions.emplace(region.base, region);
  ++counters_.maps;
  counters_.mapped_bytes += size_bytes;
  if (region.locked) counters_.locked_bytes += size_bytes;
  return {alloc::SourceStatus::ok, region};
}

alloc::SourceStatus LockedHostSource::unmap(const HostRegion& region) {
  std::lock_guard lock(mutex_);
  auto it = live_->regions.find(region.base);
  if (it == live_->regions.end() || it->second.size_bytes != region.size_bytes) {
    last_error_ = fmt::format("LockedHostSource::unmap: [{:#x}, +{}) is not a region this source mapped", region.base,
                              region.size_bytes);
    return alloc::SourceStatus::invalid_argument;
  }
  const HostRegion live = it->second;
  if (live.locked) ::munlock(reinterpret_cast<void*>(live.base), live.size_bytes);
  if (::munmap(reinterpret_cast<void*>(live.base), live.size_bytes) != 0) {
    const int err = errno;
    last_error_ = fmt::format("LockedHostSource: munmap failed: {} (errno {})", std::generic_category().message(err), err);
    return alloc::SourceStatus::driver_error;
  }
  live_->regions.erase(it);
  ++counters_.unmaps;
  counters_.mapped_bytes -= live.size_bytes;
  if (live.locked) counters_.locked_bytes -= live.size_bytes;
  return alloc::SourceStatus::ok;
}

std::string LockedHostSource::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

void LockedHostSource::fail_nth(Op op, std::uint64_t nth) {
  std::lock_guard lock(mutex_);
  (op == Op::map ? fail_map_in_ : fail_lock_in_) = nth;
}

std::string LockedHostSource::lock_refusal() const {
  std::lock_guard lock(mutex_);
  return lock_refusal_;
}

LockedHostSourceCounters LockedHostSource::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

}  // namespace gpumem::pinned
