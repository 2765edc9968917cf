// AddressTable: live blocks by address, in one flat array (the fragmentation tracker's, the step
// planner's): open addressing with linear probing over a power-of-two number of slots, allocated
// once (and doubled, rehashing, when more than half full), so an insert or an erase allocates
// nothing and touches one or two cache lines. Erase shifts the entries that follow back into the hole (no tombstones),
// so lookups never slow down with churn.
//
// Address 0 marks an empty slot: it is never a block's address (callers skip it).
// Invariants: size() == number of slots with a non-zero address; size() <= capacity() / 2; every
// entry is reachable from its home slot (hash) without crossing an empty slot.
// Thread-safety: none (its owners hold their locks around every call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpumem::alloc {

template <class Info>
class AddressTable {
 public:
  explicit AddressTable(std::size_t initial_slots = 8192) { reset(round_up(initial_slots)); }

  // Inserts or replaces the entry of addr (addr != 0).
  void assign(std::uintptr_t addr, Info info) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    std::size_t i = home(addr);
    while (slots_[i].addr != 0 && slots_[i].addr != addr) i = (i + 1) & mask_;
    if (slots_[i].addr == 0) ++size_;
    slots_[i].addr = addr;
    slots_[i].info = std::move(info);
  }

  static constexpr std::size_t npos = SIZE_MAX;
  // The slot of addr's entry, or npos. A slot stays valid until the next assign or erase.
  std::size_t find(std::uintptr_t addr) const noexcept {
    if (addr == 0) return npos;
    for (std::size_t i = home(addr);; i = (i + 1) & mask_) {
      if (slots_[i].addr == addr) return i;
      if (slots_[i].addr == 0) return npos;
    }
  }
  Info& at(std::size_t slot) noexcept { return slots_[slot].info; }
  const Info& at(std::size_t slot) const noexcept { return slots_[slot].info; }

  // Removes the entry in `slot` (a find() result).
  void erase(std::size_t slot) noexcept {
    std::size_t hole = slot;
    // Backward shift: an entry after the hole moves into it unless its home lies cyclically in
    // (hole, j], where it would become unreachable.
    for (std::size_t j = (hole + 1) & mask_; slots_[j].addr != 0; j = (j + 1) & mask_) {
      const std::size_t k = home(slots_[j].addr);
      const bool stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
      if (stays) continue;
      slots_[hole] = std::move(slots_[j]);
      hole = j;
    }
    slots_[hole].addr = 0;
    slots_[hole].info = Info{};
    --size_;
  }

  std::size_t size() const noexcept { return size_; }
  // Removes every entry (the slots are kept).
  void clear() noexcept {
    if (size_ == 0) return;
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
  }
  std::size_t capacity() const noexcept { return slots_.size(); }

  // f(addr, info) for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.addr != 0) f(s.addr, s.info);
  }

 private:
  struct Slot {
    std::uintptr_t addr = 0;
    Info info{};
  };

  static std::size_t round_up(std::size_t n) noexcept {
    std::size_t p = 16;
    while (p < n) p *= 2;
    return p;
  }
  // Blocks are at least 512-byte aligned: a multiplicative hash spreads them over the slots.
  std::size_t home(std::uintptr_t addr) const noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(addr) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void reset(std::size_t slots) {
    slots_.assign(slots, Slot{});
    mask_ = slots - 1;
    unsigned bits = 0;
    while ((std::size_t{1} << bits) < slots) ++bits;
    shift_ = 64 - bits;
    size_ = 0;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reset(old.size() * 2);
    for (Slot& s : old)
      if (s.addr != 0) {
        std::size_t i = home(s.addr);
        while (slots_[i].addr != 0) i = (i + 1) & mask_;
        slots_[i] = std::move(s);
        ++size_;
      }
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace gpumem::alloc
