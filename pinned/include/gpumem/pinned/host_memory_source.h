// HostMemorySource: where the pinned allocator's memory comes from. The only code of gpumem::pinned
// that maps, page-locks, unlocks and unmaps host memory.
//
// A source hands out regions: page-aligned ranges of zero-filled host memory, mapped read/write
// and page-locked as one unit, and takes them back whole. On CUDA a region is one mmap registered
// with cudaHostRegister (CudaHostSource, cuda_host_source.h); the CPU stand-in (LockedHostSource)
// is one mmap locked with mlock(2).
//
// Contract:
//   * map_locked(size_bytes, alignment_bytes): size_bytes is a positive multiple of
//     caps().page_bytes; alignment_bytes is 0 (= page) or a power of two. The memory reads as
//     zero. HostRegion::locked says whether the pages really are locked: a source that may fall
//     back to pageable memory says so per region, so locked bytes are counted exactly.
//   * unmap(region) takes exactly a region map_locked returned (base and size), unlocks it and
//     returns the memory to the system. Parts of a region cannot be unmapped: a CUDA registration
//     is undone whole (cudaHostUnregister takes the pointer the registration started at).
//   * Failure is a value (alloc::SourceStatus), nothing throws; last_error() says what failed.
//
// Thread-safety: every implementation is safe to call from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "gpumem/alloc/memory_source.h"

namespace gpumem::pinned {

struct HostRegion {
  std::uintptr_t base = 0;
  std::size_t size_bytes = 0;
  bool locked = false;  // page-locked (mlocked / registered with CUDA); false = pageable fallback
  std::uintptr_t end() const noexcept { return base + size_bytes; }
};

struct HostSourceCaps {
  const char* name = "";        // "locked_host" (mlock stand-in), "cuda_host_register"
  std::size_t page_bytes = 0;   // sizes are multiples of this
  bool device_visible = false;  // a GPU can copy to/from the memory directly (CUDA registration)
};

class HostMemorySource {
 public:
  virtual ~HostMemorySource() = default;
  virtual HostSourceCaps caps() const noexcept = 0;
  virtual alloc::SourceResult<HostRegion> map_locked(std::size_t size_bytes, std::size_t alignment_bytes) = 0;
  virtual alloc::SourceStatus unmap(const HostRegion& region) = 0;
  // Words for the most recent failure (empty if none).
  virtual std::string last_error() const = 0;
};

// How LockedHostSource treats mlock(2).
enum class LockMode : std::uint8_t {
  try_lock,  // lock; where the system refuses (RLIMIT_MEMLOCK, no CAP_IPC_LOCK), keep the region
             // pageable, say so once on stderr and in lock_refusal(), and count it as unlocked
  require,   // lock or fail the map with out_of_memory
  none,      // never lock (a pure stand-in for tests that only need the arena's logic)
};

struct LockedHostSourceOptions {
  LockMode lock = LockMode::try_lock;
  // Limit on the bytes of live regions; map_locked past it answers out_of_memory. 0 = no limit.
  std::size_t capacity_bytes = 0;
};

struct LockedHostSourceCounters {
  std::uint64_t maps = 0, unmaps = 0, lock_refusals = 0;
  std::size_t mapped_bytes = 0;  // live regions
  std::size_t locked_bytes = 0;  // live regions that are locked
};

// The CPU stand-in: mmap(MAP_PRIVATE|MAP_ANONYMOUS) + mlock. Also the host source on machines
// without CUDA, so the allocator's logic runs and is tested everywhere.
class LockedHostSource final : public HostMemorySource {
 public:
  enum class Op : std::uint8_t { map, lock };

  explicit LockedHostSource(LockedHostSourceOptions options = {});
  ~LockedHostSource() override;  // live regions are a caller's leak; they are unmapped anyway
  LockedHostSource(const LockedHostSource&) = delete;
  LockedHostSource& operator=(const LockedHostSource&) = delete;

  HostSourceCaps caps() const noexcept override;
  alloc::SourceResult<HostRegion> map_locked(std::size_t size_bytes, std::size_t alignment_bytes) override;
  alloc::SourceStatus unmap(const HostRegion& region) override;
  std::string last_error() const override;

  // The nth call of op from now on (1 = the next one) fails: map answers fault_injected; lock acts
  // as if mlock were refused (ENOMEM). 0 cancels.
  void fail_nth(Op op, std::uint64_t nth);
  // Why the system refused to lock (empty while it never did).
  std::string lock_refusal() const;
  LockedHostSourceCounters counters() const;

 private:
  struct Live;
  mutable std::mutex mutex_;
  LockedHostSourceOptions options_;
  std::size_t page_bytes_ = 0;
  std::unique_ptr<Live> live_;  // base -> region, for unmap's checks and the destructor
  LockedHostSourceCounters counters_;
  std::uint64_t fail_map_in_ = 0, fail_lock_in_ = 0;
  std::string last_error_;
  std::string lock_refusal_;
};

}  // namespace gpumem::pinned
