// LiveTable: allocated and pending_free blocks by address, for free() and lookup(). An intrusive
// hash set over Block::hash_hook with a power-of-two bucket array that doubles when the load factor
// passes 1. Not thread-safe: used under the engine's lock.
#pragma once

#include <boost/intrusive/unordered_set.hpp>
#include <functional>
#include <memory>

#include "block.h"

namespace gpumem::alloc::detail {

struct BlockAddrHash {
  std::size_t operator()(const Block& b) const noexcept { return mix(b.addr); }
  std::size_t operator()(std::uintptr_t addr) const noexcept { return mix(addr); }
  static std::size_t mix(std::uintptr_t a) noexcept {
    // Addresses are 512-aligned: drop the zero bits, then a multiplicative mix.
    std::uint64_t x = static_cast<std::uint64_t>(a) >> 9;
    x *= 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(x ^ (x >> 29));
  }
};

struct BlockAddrEq {
  bool operator()(const Block& a, const Block& b) const noexcept { return a.addr == b.addr; }
  bool operator()(std::uintptr_t a, const Block& b) const noexcept { return a == b.addr; }
  bool operator()(const Block& a, std::uintptr_t b) const noexcept { return a.addr == b; }
};

class LiveTable {
 public:
  using Set = bi::unordered_set<Block, bi::member_hook<Block, HashHook, &Block::hash_hook>,
                                bi::hash<BlockAddrHash>, bi::equal<BlockAddrEq>, bi::power_2_buckets<true>,
                                bi::constant_time_size<true>>;

  LiveTable() : buckets_(new Set::bucket_type[kInitialBuckets]), set_(Set::bucket_traits(buckets_.get(), kInitialBuckets)) {}
  ~LiveTable() { set_.clear(); }
  LiveTable(const LiveTable&) = delete;
  LiveTable& operator=(const LiveTable&) = delete;

  void insert(Block& b) {
    if (set_.size() + 1 > set_.bucket_count()) grow();
    set_.insert(b);
  }
  void erase(Block& b) noexcept { set_.erase(set_.iterator_to(b)); }
  Block* find(std::uintptr_t addr) noexcept {
    auto it = set_.find(addr, BlockAddrHash{}, BlockAddrEq{});
    return it == set_.end() ? nullptr : &*it;
  }
  const Block* find(std::uintptr_t addr) const noexcept {
    auto it = set_.find(addr, BlockAddrHash{}, BlockAddrEq{});
    return it == set_.end() ? nullptr : &*it;
  }
  std::size_t size() const noexcept { return set_.size(); }
  Set& blocks() noexcept { return set_; }
  const Set& blocks() const noexcept { return set_; }

 private:
  static constexpr std::size_t kInitialBuckets = 1024;
  void grow() {
    const std::size_t n = set_.bucket_count() * 2;
    std::unique_ptr<Set::bucket_type[]> next(new Set::bucket_type[n]);
    set_.rehash(Set::bucket_traits(next.get(), n));
    buckets_ = std::move(next);
  }

  std::unique_ptr<Set::bucket_type[]> buckets_;
  Set set_;
};

}  // namespace gpumem::alloc::detail
