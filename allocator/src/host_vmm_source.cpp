#include "gpumem/alloc/host_vmm_source.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <numeric>
#include <system_error>

#include "source_ledger.h"

namespace gpumem::alloc {
namespace {

// "Cannot allocate memory (errno 12)", thread-safe (std::strerror is not).
std::string errno_words(int err) { return fmt::format("{} (errno {})", std::generic_category().message(err), err); }

void* const kMapFailed = MAP_FAILED;

// Puts a PROT_NONE, never-committed anonymous mapping over [va, va + size): what a reservation
// looks like where nothing is mapped.
bool cover_with_reservation(std::uintptr_t va, std::size_t size_bytes) {
  void* p = ::mmap(reinterpret_cast<void*>(va), size_bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return p != kMapFailed;
}

}  // namespace

HostVmmSource::HostVmmSource(HostVmmSourceOptions options)
    : options_(options), faults_(std::make_unique<detail::FaultPlan>()) {
  const long page = ::sysconf(_SC_PAGESIZE);
  page_bytes_ = page > 0 ? static_cast<std::size_t>(page) : 4096;
  if (options_.granularity_bytes == 0 || options_.granularity_bytes % page_bytes_ != 0) {
    init_status_ = SourceStatus::invalid_argument;
    last_error_ = fmt::format(
        "HostVmmSource: granularity_bytes = {} is not a positive multiple of the page size ({} bytes); "
        "use a multiple of {} such as 2 MiB (2097152)",
        options_.granularity_bytes, page_bytes_, page_bytes_);
  }
  if (options_.capacity_bytes == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    options_.capacity_bytes = pages > 0 ? static_cast<std::size_t>(pages) * page_bytes_
                                        : std::numeric_limits<std::size_t>::max();
  }
  ledger_ = std::make_unique<detail::SourceLedger>(init_status_ == SourceStatus::ok ? options_.granularity_bytes
                                                                                    : page_bytes_);
}

HostVmmSource::~HostVmmSource() {
  std::lock_guard lock(mutex_);
  // Releasing a range drops every mapping inside it; then the pieces' memfds can close.
  for (const auto& [base, size] : ledger_->ranges()) ::munmap(reinterpret_cast<void*>(base), size);
  for (const auto& [handle, piece] : ledger_->pieces()) ::close(static_cast<int>(piece.native));
}

SourceCaps HostVmmSource::caps() const noexcept {
  SourceCaps c;
  c.name = "host_vmm";
  c.granularity_bytes = options_.granularity_bytes;
  c.virtual_memory = true;
  c.host_accessible = true;
  c.device_memory = false;
  return c;
}

SourceStatus HostVmmSource::fail_locked(SourceStatus status, std::string message) {
  last_error_ = std::move(message);
  return status;
}

bool HostVmmSource::inject_locked(Op op) { return faults_->should_fail(static_cast<int>(op)); }

SourceResult<VaRange> HostVmmSource::reserve(std::size_t size_bytes, std::size_t alignment_bytes) {
  std::lock_guard lock(mutex_);
  if (init_status_ != SourceStatus::ok) return {init_status_, {}};
  if (auto why = ledger_->check_size("reserve", size_bytes); !why.empty())
    return {fail_locked(SourceStatus::invalid_argument, std::move(why)), {}};
  const std::size_t g = options_.granularity_bytes;
  if (alignment_bytes % page_bytes_ != 0)
    return {fail_locked(SourceStatus::invalid_argument,
                        fmt::format("reserve: alignment {} is not a multiple of the page size ({} bytes); "
                                    "pass 0 for the granularity or a multiple of the page size",
                                    alignment_bytes, page_bytes_)),
            {}};
  // The base must suit both the caller and map(), which takes granularity-aligned addresses.
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  std::size_t align = g;
  if (alignment_bytes != 0) {
    const std::size_t a = alignment_bytes / std::gcd(alignment_bytes, g);
    align = a > kMax / g ? 0 : a * g;  // lcm(alignment, g), 0 on overflow
  }
  const std::size_t padding = align > page_bytes_ ? align - page_bytes_ : 0;
  if (align == 0 || size_bytes > kMax - padding)
    return {fail_locked(SourceStatus::invalid_argument,
                        fmt::format("reserve: size {} with alignment {} overflows the address space",
                                    size_bytes, alignment_bytes)),
            {}};
  if (inject_locked(Op::reserve)) return {fail_locked(SourceStatus::fault_injected, "reserve: injected fault"), {}};

  const std::size_t total = size_bytes + padding;
  void* raw = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == kMapFailed) {
    const int err = errno;
    return {fail_locked(err == ENOMEM ? SourceStatus::out_of_memory : SourceStatus::driver_error,
                        fmt::format("reserve: mmap(PROT_NONE, {} bytes) failed: {}", total, errno_words(err))),
            {}};
  }
  // Trim the over-reservation to an aligned range of exactly size_bytes.
  const auto raw_base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t base = (raw_base + align - 1) / align * align;
  if (base > raw_base) ::munmap(raw, base - raw_base);
  if (raw_base + total > base + size_bytes)
    ::munmap(reinterpret_cast<void*>(base + size_bytes), raw_base + total - (base + size_bytes));

  const VaRange range{base, size_bytes};
  ledger_->add_range(range);
  ledger_->debug_check_invariants();
  ++counters_.reserves;
  return {SourceStatus::ok, range};
}

SourceStatus HostVmmSource::release(VaRange range) {
  std::lock_guard lock(mutex_);
  if (init_status_ != SourceStatus::ok) return init_status_;
  if (auto why = ledger_->check_release(range); !why.empty())
    return fail_locked(SourceStatus::invalid_argument, std::move(why));
  if (inject_locked(Op::release)) return fail_locked(SourceStatus::fault_injected, "release: injected fault");
  if (::munmap(reinterpret_cast<void*>(range.base), range.size_bytes) != 0)
    return fail_locked(SourceStatus::driver_error,
                       fmt::format("release: munmap([{:#x}, +{})) failed: {}", range.base, range.size_bytes,
                                   errno_words(errno)));
  ledger_->remove_range(range);
  ledger_->debug_check_invariants();
  ++counters_.releases;
  return SourceStatus::ok;
}

SourceResult<PhysHandle> HostVmmSource::create(std::size_t size_bytes) {
  std::lock_guard lock(mutex_);
  if (init_status_ != SourceStatus::ok) return {init_status_, 0};
  if (auto why = ledger_->check_size("create", size_bytes); !why.empty())
    return {fail_locked(SourceStatus::invalid_argument, std::move(why)), 0};
  if (inject_locked(Op::create)) return {fail_locked(SourceStatus::fault_injected, "create: injected fault"), 0};
  const std::size_t used = ledger_->physical_bytes();
  if (size_bytes > options_.capacity_bytes - std::min(used, options_.capacity_bytes))
    return {fail_locked(SourceStatus::out_of_memory,
                        fmt::format("create: {} bytes would exceed the capacity of {} bytes ({} in use)",
                                    size_bytes, options_.capacity_bytes, used)),
            0};

  const int fd = ::memfd_create("gpumem-host-vmm", MFD_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EMFILE || err == ENFILE)
      return {fail_locked(SourceStatus::out_of_memory,
                          fmt::format("create: memfd_create failed: {}; every live piece holds one file "
                                      "descriptor: raise the limit (ulimit -n) or use larger pieces",
                                      errno_words(err))),
              0};
    return {fail_locked(err == ENOMEM ? SourceStatus::out_of_memory : SourceStatus::driver_error,
                        fmt::format("create: memfd_create failed: {}", errno_words(err))),
            0};
  }
  if (::ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    return {fail_locked(err == ENOMEM || err == ENOSPC || err == EFBIG ? SourceStatus::out_of_memory
                                                                       : SourceStatus::driver_error,
                        fmt::format("create: ftruncate(memfd, {}) failed: {}", size_bytes, errno_words(err))),
            0};
  }
  const PhysHandle handle = next_handle_++;
  ledger_->add_piece(handle, size_bytes, static_cast<std::uint64_t>(fd));
  ledger_->debug_check_invariants();
  ++counters_.creates;
  return {SourceStatus::ok, handle};
}

SourceStatus HostVmmSource::destroy(PhysHandle handle) {
  std::lock_guard lock(mutex_);
  if (init_status_ != SourceStatus::ok) return init_status_;
  if (auto why = ledger_->check_destroy(handle); !why.empty())
    return fail_locked(SourceStatus::invalid_argument, std::move(why));
  if (inject_locked(Op::destroy)) return fail_locked(SourceStatus::fault_injected, "destroy: injected fault");
  // close() of a memfd cannot lose data we care about; on error the descriptor is gone anyway
  // (Linux releases it before reporting), so the piece is destroyed either way.
  ::close(static_cast<int>(ledger_->piece(handle).native));
  ledger_->remove_piece(handle);
  ledger_->debug_check_invariants();
  ++counters_.destroys;
  return SourceStatus::ok;
}

SourceStatus HostVmmSource::map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) {
  std::lock_guard lock(mutex_);
  if (init_status_ != SourceStatus::ok) return init_status_;
  if (auto why = ledger_->check_map(va, size_bytes, handle); !why.empty())
    return fail_locked(SourceStatus::invalid_argument, std::move(why));
  if (inject_locked(Op::map)) return fail_locked(SourceStatus::fault_injected, "map: injected fault");
  const int fd = static_cast<int>(ledger_->piece(handle).native);
  void* p = ::mmap(reinterpret_cast<void*>(va), size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == kMapFailed) {
    const int err = errno;
    // A failed MAP_FIXED may already have dropped the reservation underneath: put it back.
    const bool restored = cover_with_reservation(va, size_bytes);
    return fail_locked(
        err == ENOMEM ? SourceStatus::out_of_memory : SourceStatus::driver_error,
        fmt::format("map: mmap(MAP_FIXED|MAP_SHARED) of handle {:#x} at [{:#x}, +{}) failed: {}{}{}", handle, va,
                    size_bytes, errno_words(err),
                    err == ENOMEM ? " (address space or vm.max_map_count exhausted)" : "",
                    restored ? "" : "; the reservation under it could not be restored"));
  }
  if (reinterpret_cast<std::uintptr_t>(p) != va) {
    // Cannot happen with MAP_FIXED; refuse to keep a mapping somewhere unexpected.
    ::munmap(p, size_bytes);
    return fail_locked(SourceStatus::driver_error,
                       fmt::format("map: mmap(MAP_FIXED) placed handle {:#x} at {} instead of {:#x}", handle, p, va));
  }
  ledger_->add_mapping(va, handle);
  ledger_->debug_check_invariants();
  ++counters_.maps;
  return SourceStatus::ok;
}

SourceStatus HostVmmSource::unmap(std::uintptr_t va, std::size_t size_bytes) {
  std::lock_guard lock(mutex_);
  if (init_status_ != SourceStatus::ok) return init_status_;
  if (auto why = ledger_->check_unmap(va, size_bytes); !why.empty())
    return fail_locked(SourceStatus::invalid_argument, std::move(why));
  if (inject_locked(Op::unmap)) return fail_locked(SourceStatus::fault_injected, "unmap: injected fault");
  if (!cover_with_reservation(va, size_bytes))
    return fail_locked(SourceStatus::driver_error,
                       fmt::format("unmap: mmap(MAP_FIXED, PROT_NONE) over [{:#x}, +{}) failed: {}", va, size_bytes,
                                   errno_words(errno)));
  ledger_->remove_mapping(va);
  ledger_->debug_check_invariants();
  ++counters_.unmaps;
  return SourceStatus::ok;
}

ProviderMemInfo HostVmmSource::mem_info() const {
  std::lock_guard lock(mutex_);
  const std::size_t used = std::min(ledger_->physical_bytes(), options_.capacity_bytes);
  return {options_.capacity_bytes - used, options_.capacity_bytes};
}

std::string HostVmmSource::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

void HostVmmSource::fail_nth(Op op, std::uint64_t nth) {
  std::lock_guard lock(mutex_);
  faults_->fail_nth(static_cast<int>(op), nth);
}

void HostVmmSource::set_capacity(std::size_t capacity_bytes) {
  std::lock_guard lock(mutex_);
  options_.capacity_bytes = capacity_bytes;
}

HostVmmSourceCounters HostVmmSource::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

std::size_t HostVmmSource::physical_bytes() const {
  std::lock_guard lock(mutex_);
  return ledger_->physical_bytes();
}

std::size_t HostVmmSource::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return ledger_->mapped_bytes();
}

void HostVmmSource::check_invariants() const {
  std::lock_guard lock(mutex_);
  ledger_->check_invariants();
}

}  // namespace gpumem::alloc
