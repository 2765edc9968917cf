// LiveTable: allocated, pending_free and cached blocks by address, for free() and lookup(). An
// intrusive hash set over Block::hash_hook with a power-of-two bucket array that doubles when the
// load factor passes 1. Not thread-safe. ShardedLiveTable splits it in 64 shards, each behind a
// SpinLock, so that thread-cache fast paths can find blocks without the engine's lock.
#pragma once

#include <boost/intrusive/unordered_set.hpp>
#include <functional>
#include <array>
#include <memory>

#include "gpumem/alloc/spin_lock.h"

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
  static constexpr std::size_t kInitialBuckets = 64;
  void grow() {
    const std::size_t n = set_.bucket_count() * 2;
    std::unique_ptr<Set::bucket_type[]> next(new Set::bucket_type[n]);
    set_.rehash(Set::bucket_traits(next.get(), n));
    buckets_ = std::move(next);
  }

  std::unique_ptr<Set::bucket_type[]> buckets_;
  Set set_;
};

// Every member locks the shard it touches; with_shard runs fn(table) with the shard of addr locked.
// Lock order: engine mutex -> thread cache -> shard.
class ShardedLiveTable {
 public:
  static constexpr std::size_t kShards = 64;

  // `locked`: take the shard's lock (needed once thread caches are active; before that every
  // access happens under the engine's lock).
  void insert(Block& b, bool locked) {
    Shard& s = shard(b.addr);
    if (!locked) return s.table.insert(b);
    std::lock_guard lock(s.lock);
    s.table.insert(b);
  }
  void erase(Block& b, bool locked) noexcept {
    Shard& s = shard(b.addr);
    if (!locked) return s.table.erase(b);
    std::lock_guard lock(s.lock);
    s.table.erase(b);
  }
  Block* find(std::uintptr_t addr, bool locked) noexcept {
    Shard& s = shard(addr);
    if (!locked) return s.table.find(addr);
    std::lock_guard lock(s.lock);
    return s.table.find(addr);
  }
  template <class Fn>
  decltype(auto) with_shard(std::uintptr_t addr, Fn&& fn) {
    Shard& s = shard(addr);
    std::lock_guard lock(s.lock);
    return fn(s.table);
  }
  // Callers must have stopped every other user (engine lock held and thread caches locked).
  std::size_t size_unlocked() const noexcept {
    std::size_t n = 0;
    for (const Shard& s : shards_) n += s.table.size();
    return n;
  }
  const Block* find_unlocked(std::uintptr_t addr) const noexcept { return shard_c(addr).table.find(addr); }
  void clear_unlocked() noexcept {
    for (Shard& s : shards_) s.table.blocks().clear();
  }

 private:
  struct alignas(64) Shard {
    SpinLock lock;
    LiveTable table;
  };
  Shard& shard(std::uintptr_t addr) noexcept { return shards_[(BlockAddrHash::mix(addr) >> 7) % kShards]; }
  const Shard& shard_c(std::uintptr_t addr) const noexcept { return shards_[(BlockAddrHash::mix(addr) >> 7) % kShards]; }
  std::array<Shard, kShards> shards_;
};

}  // namespace gpumem::alloc::detail
