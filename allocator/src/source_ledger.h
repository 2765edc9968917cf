// SourceLedger: the bookkeeping a virtual-memory MemorySource keeps about what it handed out,
// so misuse answers SourceStatus::invalid_argument with words instead of reaching the provider
// (a CUDA driver given an unknown handle may crash; mmap over the wrong range corrupts memory).
//
// It knows three things:
//   ranges:   reserved address ranges, base -> size
//   pieces:   physical pieces, handle -> {size, native id (fd, CUmemGenericAllocationHandle), how many
//             mappings it has}
//   mappings: va -> handle, for every mapping
// A piece may be mapped at several addresses at once (aliases: the engine keeps a moved piece's old
// mapping, Note [Physical page recycling], "Kept mappings"); each mapping is one map() and is
// unmapped by its own unmap().
// Invariants (check_invariants): every mapping lies inside one range and does not overlap another
// mapping; a piece's mapping count is the number of mappings naming it; physical_bytes is the sum
// of piece sizes and mapped_bytes the sum of the sizes of all mappings (a piece mapped twice counts
// twice).
//
// The check_* functions validate a call against the contract in memory_source.h and return the
// words for invalid_argument, or an empty string when the call may proceed. The mutators assume the
// matching check passed.
//
// Thread-safety: none; the owning source holds its own mutex around every use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "gpumem/alloc/memory_source.h"

namespace gpumem::alloc::detail {

class SourceLedger {
 public:
  struct Piece {
    std::size_t size_bytes = 0;
    std::uint64_t native = 0;       // what the provider calls it (fd, driver handle)
    std::uint32_t mappings = 0;     // how many addresses it is mapped at (0: unmapped)
  };

  explicit SourceLedger(std::size_t granularity_bytes) : granularity_bytes_(granularity_bytes) {}

  std::size_t granularity_bytes() const noexcept { return granularity_bytes_; }

  // "" if size_bytes is a positive multiple of the granularity.
  std::string check_size(const char* op, std::size_t size_bytes) const;
  std::string check_release(VaRange range) const;
  std::string check_destroy(PhysHandle handle) const;
  std::string check_map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) const;
  std::string check_unmap(std::uintptr_t va, std::size_t size_bytes) const;

  void add_range(VaRange range);
  void remove_range(VaRange range);
  void add_piece(PhysHandle handle, std::size_t size_bytes, std::uint64_t native);
  void remove_piece(PhysHandle handle);
  void add_mapping(std::uintptr_t va, PhysHandle handle);
  PhysHandle remove_mapping(std::uintptr_t va);  // returns the handle that was mapped there

  const Piece& piece(PhysHandle handle) const { return pieces_.at(handle); }
  PhysHandle handle_at(std::uintptr_t va) const { return mappings_.at(va); }

  const std::map<std::uintptr_t, std::size_t>& ranges() const noexcept { return ranges_; }
  const std::unordered_map<PhysHandle, Piece>& pieces() const noexcept { return pieces_; }
  const std::map<std::uintptr_t, PhysHandle>& mappings() const noexcept { return mappings_; }

  std::size_t physical_bytes() const noexcept { return physical_bytes_; }
  std::size_t mapped_bytes() const noexcept { return mapped_bytes_; }

  // Aborts with a message if an invariant above does not hold (O(n log n)).
  void check_invariants() const;
  // check_invariants() in debug builds (no NDEBUG), nothing otherwise. Sources call it after each
  // mutation.
  void debug_check_invariants() const {
#ifndef NDEBUG
    check_invariants();
#endif
  }

 private:
  std::size_t granularity_bytes_;
  std::map<std::uintptr_t, std::size_t> ranges_;
  std::unordered_map<PhysHandle, Piece> pieces_;
  std::map<std::uintptr_t, PhysHandle> mappings_;
  std::size_t physical_bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
};

// Fails the Nth call of an operation, for tests (SimSource's scheme, shared by HostVmmSource).
class FaultPlan {
 public:
  static constexpr int kOps = 6;
  // nth = 1 fails the next call of op; 0 cancels.
  void fail_nth(int op, std::uint64_t nth) { countdown_[op] = nth; }
  // True if this call of op is the one to fail.
  bool should_fail(int op) {
    auto& c = countdown_[op];
    if (c == 0) return false;
    return --c == 0;
  }

 private:
  std::uint64_t countdown_[kOps] = {};
};

}  // namespace gpumem::alloc::detail
