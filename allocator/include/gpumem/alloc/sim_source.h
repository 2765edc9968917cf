// SimSource: a MemorySource that only accounts. Addresses are fake (never dereference them),
// capacity is a limit on created physical bytes, and tests can make the Nth call of a kind fail.
// Replay and most engine tests run on it. Behaves like a virtual-memory source by default; with
// virtual_memory = false it behaves like cudaMalloc (reserve backs the range, map is unsupported).
//
// Thread-safety: all members are safe to call concurrently (one internal mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpumem/alloc/memory_source.h"

namespace gpumem::alloc {

struct SimSourceOptions {
  std::size_t capacity_bytes = std::size_t{80} << 30;  // physical bytes that may exist at once
  std::size_t granularity_bytes = std::size_t{2} << 20;
  bool virtual_memory = true;
  std::uintptr_t base_address = std::uintptr_t{0x7f0000000000};  // first fake address
};

// Counts of calls that succeeded.
struct SimSourceCounters {
  std::uint64_t reserves = 0, releases = 0, creates = 0, destroys = 0, maps = 0, unmaps = 0;
};

class SimSource final : public MemorySource {
 public:
  enum class Op : std::uint8_t { reserve, create, map, unmap, release, destroy };

  explicit SimSource(SimSourceOptions options = {});

  SourceCaps caps() const noexcept override;
  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override;
  SourceStatus release(VaRange range) override;
  SourceResult<PhysHandle> create(std::size_t size_bytes) override;
  SourceStatus destroy(PhysHandle handle) override;
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override;
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override;
  ProviderMemInfo mem_info() const override;
  std::string last_error() const override;
  // Simulated time that never moves: SimSource's calls take no time, so decisions that depend on
  // time (the recycle budget) never change what a test on SimSource sees. A test that needs time
  // wraps a SimSource with a clock of its own.
  std::int64_t now_ns() const override { return 0; }

  // The nth call of op from now on (1 = the next one) fails with fault_injected; 0 cancels.
  void fail_nth(Op op, std::uint64_t nth);
  void set_capacity(std::size_t capacity_bytes);

  SimSourceCounters counters() const;
  std::size_t physical_bytes() const;  // bytes of live physical pieces (or backed ranges)
  std::size_t peak_physical_bytes() const;  // the most physical_bytes() has been
  std::size_t mapped_bytes() const;

 private:
  bool inject_locked(Op op);
  SourceStatus fail_locked(SourceStatus status, std::string message);

  mutable std::mutex mutex_;
  SimSourceOptions options_;
  std::uintptr_t next_va_;
  std::uint64_t next_handle_ = 1;
  std::size_t physical_bytes_ = 0;
  std::size_t peak_physical_bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
  // A physical piece. Handles are 1, 2, 3, ... in order of creation, so pieces_ is indexed by
  // handle (entry 0 unused; a destroyed piece's entry stays, not live): 16 bytes per piece ever
  // created, and no hashing on the calls every growth makes.
  struct Piece {
    std::size_t size_bytes = 0;
    std::uint32_t mappings = 0;  // a piece may be mapped at several addresses (aliases)
    bool live = false;
  };
  struct Mapping {
    PhysHandle handle = 0;
    std::size_t size_bytes = 0;
  };
  Piece* live_piece_locked(PhysHandle handle) noexcept {
    return handle < pieces_.size() && pieces_[handle].live ? &pieces_[handle] : nullptr;
  }

  std::map<std::uintptr_t, std::size_t> reserved_;  // base -> size
  std::vector<Piece> pieces_;
  std::map<std::uintptr_t, Mapping> mappings_;  // va -> piece
  std::uint64_t fail_countdown_[6] = {};
  SimSourceCounters counters_;
  std::string last_error_;
};

}  // namespace gpumem::alloc
