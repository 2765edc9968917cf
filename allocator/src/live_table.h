// LiveTable: allocated, pending_free and cached blocks by address, for free() and lookup(). An
// intrusive chained hash set over Block::live_hook: a power-of-two bucket array of singly linked
// chains, each block also pointing at the link that points at it (`pprev`, as Linux's hlist), so
// that unlinking a block needs no search. The array doubles when the load factor passes 1.
// ShardedLiveTable splits it in 64 shards, each behind a SpinLock, so that thread-cache fast paths
// can find blocks without the engine's lock.
//
// Why not boost::intrusive::unordered_set (what it replaced): its insert searches the chain for an
// equal key first and its erase finds the predecessor in the chain; a block's address is unique by
// construction (blocks tile regions), so here insert only links and erase only unlinks. The gain is
// small: callgrind counts 735 instructions per 4 KiB pair of `bench_alloc_pairs --threads 0` against
// 743 before, 1,261 against 1,270 per pair of window 64.
//
// Invariants: a block is in the table iff its hook's pprev is non-null; it then sits in the chain
// of bucket (hash(addr) & (buckets - 1)), *pprev == the block, and no two blocks share an address.
// Not thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpumem/alloc/spin_lock.h"

#include "block.h"

namespace gpumem::alloc::detail {

struct BlockAddrHash {
  static std::size_t mix(std::uintptr_t a) noexcept {
    // Addresses are 512-aligned: drop the zero bits, then a multiplicative mix.
    std::uint64_t x = static_cast<std::uint64_t>(a) >> 9;
    x *= 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(x ^ (x >> 29));
  }
};

class LiveTable {
 public:
  LiveTable() : buckets_(new Block*[kInitialBuckets]()), mask_(kInitialBuckets - 1) {}
  ~LiveTable() { clear(); }
  LiveTable(const LiveTable&) = delete;
  LiveTable& operator=(const LiveTable&) = delete;

  // b (not in the table; no block of its address is) goes in.
  void insert(Block& b) { insert_hashed(b, BlockAddrHash::mix(b.addr)); }
  // The same with hash == BlockAddrHash::mix(b.addr), computed by the caller (ShardedLiveTable
  // picks the shard from it too).
  void insert_hashed(Block& b, std::size_t hash) {
    // The growth is a tail call, so the common path saves no registers (it is inlined into the
    // engine's allocate).
    if (size_ + 1 > mask_ + 1) return grow_and_insert(b, hash);
    link(b, buckets_[hash & mask_]);
    ++size_;
  }
  // b (in the table) goes out.
  void erase(Block& b) noexcept {
    LiveHook& h = b.live_hook;
    *h.pprev = h.next;
    if (h.next) h.next->live_hook.pprev = h.pprev;
    h.next = nullptr;
    h.pprev = nullptr;
    --size_;
  }
  Block* find(std::uintptr_t addr) const noexcept { return find_hashed(addr, BlockAddrHash::mix(addr)); }
  Block* find_hashed(std::uintptr_t addr, std::size_t hash) const noexcept {
    for (Block* b = buckets_[hash & mask_]; b != nullptr; b = b->live_hook.next)
      if (b->addr == addr) return b;
    return nullptr;
  }
  std::size_t size() const noexcept { return size_; }
  // Forgets every block (they are unlinked: teardown).
  void clear() noexcept {
    for (std::size_t i = 0; i <= mask_; ++i) {
      for (Block* b = buckets_[i]; b != nullptr;) {
        Block* next = b->live_hook.next;
        b->live_hook = LiveHook{};
        b = next;
      }
      buckets_[i] = nullptr;
    }
    size_ = 0;
  }

 private:
  static constexpr std::size_t kInitialBuckets = 64;

  static void link(Block& b, Block*& head) noexcept {
    LiveHook& h = b.live_hook;
    h.next = head;
    h.pprev = &head;
    if (head) head->live_hook.pprev = &h.next;
    head = &b;
  }
  [[gnu::noinline]] void grow_and_insert(Block& b, std::size_t hash) {
    grow();
    link(b, buckets_[hash & mask_]);
    ++size_;
  }
  void grow() {
    const std::size_t n = (mask_ + 1) * 2;
    std::unique_ptr<Block*[]> next(new Block*[n]());
    for (std::size_t i = 0; i <= mask_; ++i)
      for (Block* b = buckets_[i]; b != nullptr;) {
        Block* after = b->live_hook.next;
        link(*b, next[BlockAddrHash::mix(b->addr) & (n - 1)]);
        b = after;
      }
    buckets_ = std::move(next);
    mask_ = n - 1;
  }

  std::unique_ptr<Block*[]> buckets_;
  std::size_t mask_;  // buckets - 1
  std::size_t size_ = 0;
};

// Every member locks the shard it touches; with_shard runs fn(table) with the shard of addr locked.
// Lock order: engine mutex -> thread cache -> shard.
class ShardedLiveTable {
 public:
  static constexpr std::size_t kShards = 64;

  // `locked`: take the shard's lock (needed once thread caches are active; before that every
  // access happens under the engine's lock).
  // The paths without the shard's lock (every call of a single-threaded program) are small and
  // inlined; the locked ones, whose spin loop calls sched_yield, are out of line, so that the
  // unlocked path does not pay for the registers that call needs.
  void insert(Block& b, bool locked) {
    const std::size_t hash = BlockAddrHash::mix(b.addr);
    Shard& s = shard_of_hash(hash);
    if (locked) return insert_locked(s, b, hash);
    s.table.insert_hashed(b, hash);
  }
  void erase(Block& b, bool locked) noexcept {
    Shard& s = shard(b.addr);
    if (locked) return erase_locked(s, b);
    s.table.erase(b);
  }
  Block* find(std::uintptr_t addr, bool locked) noexcept {
    const std::size_t hash = BlockAddrHash::mix(addr);
    Shard& s = shard_of_hash(hash);
    if (locked) return find_locked(s, addr, hash);
    return s.table.find_hashed(addr, hash);
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
    for (Shard& s : shards_) s.table.clear();
  }

 private:
  struct alignas(64) Shard {
    SpinLock lock;
    LiveTable table;
  };
  [[gnu::noinline]] static void insert_locked(Shard& s, Block& b, std::size_t hash) {
    std::lock_guard lock(s.lock);
    s.table.insert_hashed(b, hash);
  }
  [[gnu::noinline]] static void erase_locked(Shard& s, Block& b) noexcept {
    std::lock_guard lock(s.lock);
    s.table.erase(b);
  }
  [[gnu::noinline]] static Block* find_locked(Shard& s, std::uintptr_t addr, std::size_t hash) noexcept {
    std::lock_guard lock(s.lock);
    return s.table.find_hashed(addr, hash);
  }
  Shard& shard(std::uintptr_t addr) noexcept { return shard_of_hash(BlockAddrHash::mix(addr)); }
  Shard& shard_of_hash(std::size_t hash) noexcept { return shards_[(hash >> 7) % kShards]; }
  const Shard& shard_c(std::uintptr_t addr) const noexcept { return shards_[(BlockAddrHash::mix(addr) >> 7) % kShards]; }
  std::array<Shard, kShards> shards_;
};

}  // namespace gpumem::alloc::detail
