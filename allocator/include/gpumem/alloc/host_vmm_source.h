// HostVmmSource: a MemorySource backed by real host memory, the CPU twin of the CUDA driver's
// virtual memory API:
//   reserve  = mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE), aligned   (cuMemAddressReserve)
//   create   = memfd_create + ftruncate: one memfd per physical piece              (cuMemCreate)
//   map      = mmap(MAP_FIXED|MAP_SHARED, PROT_READ|PROT_WRITE) of the memfd at va  (cuMemMap + cuMemSetAccess)
//   unmap    = mmap(MAP_FIXED, PROT_NONE, anonymous, MAP_NORESERVE) over the range  (cuMemUnmap; the
//              reservation stays)
//   release  = munmap                                                                (cuMemAddressFree)
//   destroy  = close(fd)                                                             (cuMemRelease)
// A piece's bytes live in its memfd, so data written through one mapping is there again when the
// same handle is mapped at another address: physical page recycling works on the host as on a GPU.
// Memory is touched lazily (ftruncate commits nothing); capacity_bytes is an accounting limit on
// created bytes, which is what mem_info() reports.
//
// Invariants: those of the internal ledger (every mapping inside a reservation, no overlap, a piece
// mapped at most once) plus: every live piece owns exactly one open memfd.
// Misuse (unknown handle, unmapped va, destroy while mapped, misaligned size) answers
// invalid_argument and changes nothing. Options are validated at construction; if they are bad,
// init_status() is invalid_argument and every call answers that with the same words.
//
// Thread-safety: all members are safe to call concurrently (one internal mutex, held across the
// system calls so that bookkeeping and address space never disagree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "gpumem/alloc/memory_source.h"

namespace gpumem::alloc {

namespace detail {
class SourceLedger;
class FaultPlan;
}  // namespace detail

struct HostVmmSourceOptions {
  // Sizes of reservations and pieces are multiples of this; must be a positive multiple of the
  // system page size (sysconf(_SC_PAGESIZE)).
  std::size_t granularity_bytes = std::size_t{2} << 20;
  // Limit on the bytes of live pieces; create() past it answers out_of_memory. 0 = the machine's
  // physical memory (sysconf(_SC_PHYS_PAGES) pages).
  std::size_t capacity_bytes = 0;
};

// Counts of calls that succeeded.
struct HostVmmSourceCounters {
  std::uint64_t reserves = 0, releases = 0, creates = 0, destroys = 0, maps = 0, unmaps = 0;
};

class HostVmmSource final : public MemorySource {
 public:
  enum class Op : std::uint8_t { reserve, create, map, unmap, release, destroy };

  explicit HostVmmSource(HostVmmSourceOptions options = {});
  // Unmaps, closes and releases whatever is still live (a leak in the caller, but not in the process).
  ~HostVmmSource() override;
  HostVmmSource(const HostVmmSource&) = delete;
  HostVmmSource& operator=(const HostVmmSource&) = delete;

  SourceCaps caps() const noexcept override;
  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override;
  SourceStatus release(VaRange range) override;
  SourceResult<PhysHandle> create(std::size_t size_bytes) override;
  SourceStatus destroy(PhysHandle handle) override;
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override;
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override;
  ProviderMemInfo mem_info() const override;
  std::string last_error() const override;

  // ok, or invalid_argument when the options were rejected (last_error() says why).
  SourceStatus init_status() const noexcept { return init_status_; }

  // The nth call of op from now on (1 = the next one) fails with fault_injected; 0 cancels.
  // A call that is invalid anyway answers invalid_argument and does not count.
  void fail_nth(Op op, std::uint64_t nth);
  void set_capacity(std::size_t capacity_bytes);

  HostVmmSourceCounters counters() const;
  std::size_t physical_bytes() const;  // bytes of live pieces
  std::size_t mapped_bytes() const;
  // Aborts with a message if the bookkeeping is inconsistent.
  void check_invariants() const;

 private:
  SourceStatus fail_locked(SourceStatus status, std::string message);
  bool inject_locked(Op op);

  mutable std::mutex mutex_;
  HostVmmSourceOptions options_;
  std::size_t page_bytes_ = 0;
  SourceStatus init_status_ = SourceStatus::ok;
  std::unique_ptr<detail::SourceLedger> ledger_;
  std::unique_ptr<detail::FaultPlan> faults_;
  PhysHandle next_handle_ = 1;
  HostVmmSourceCounters counters_;
  std::string last_error_;
};

}  // namespace gpumem::alloc
