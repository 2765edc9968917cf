// ThreadCache: one thread's private free memory for one engine, so that threads allocating and
// freeing at once (of any mix of sizes) do not all take the engine's lock. Note [Thread caches]
// (docs/notes/thread-caches.md) has the design; in short:
//
//   * A cache holds leases. A lease is one range of a region, held by one block of the region's
//     chain in state `cached` (Lease::block), which the engine never changes, merges with or hands
//     out while it is leased. Leases are taken from the engine's free memory: small-pool ones of
//     kLeaseSmallBytes, and at most one large-pool one (large_lease) of kLeaseLargeBytes,
//     replaced on the thread's next large request it cannot serve. Returning
//     leases (below) come on top.
//   * Inside the range the cache keeps its own chain of sub-blocks (Lease::first, linked through
//     prev/next, null at the lease's ends, so nothing merges across it) and its own FreeIndex of the
//     free ones: requests are served by best fit with splitting, frees merge with free neighbours,
//     by the same code as the engine's regions (block_surgery.h). Allocated sub-blocks are in the
//     engine's live-block table like every allocated block; free sub-blocks are in no engine
//     structure.
//   * A block of no lease that the thread frees becomes a *returning* lease (Lease::returning):
//     the free takes no engine lock, and the lease goes back to the engine the next time this
//     thread takes the engine's lock (at most kMaxReturning of them at once). Its memory serves
//     this thread meanwhile, by best fit like any lease.
//   * Block objects come from the engine's arena through a stash refilled under the engine's lock.
//
// Invariants (checked by the engine's check_invariants): each lease's sub-blocks tile its block's
// range in address order, have its region and stream, no two free ones are neighbours, free ones
// are in this cache's index and allocated ones in the live table; every block in the index is a
// free sub-block of one of this cache's leases; Lease::cache never changes; returning_count
// counts the leases with `returning` (at most kMaxReturning), and large_lease is not one of them.
//
// Thread-safety: `lock` guards everything here. The owning thread takes it for its fast paths; a
// thread freeing a sub-block of this cache's leases takes it (and only it) to give the block back;
// the engine takes it, with its own lock held, to hand out leases, refill the stash and drain the
// cache (lock order: engine lock -> ThreadCache::lock -> live-table shard). Lease objects belong
// to their cache for its whole life, and caches to their engine's, so a pointer read without the
// lock is safe to follow and check again under it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "block.h"
#include "block_surgery.h"
#include "free_index.h"
#include "gpumem/alloc/spin_lock.h"

namespace gpumem::alloc::detail {

struct ThreadCache;

struct Lease {
  explicit Lease(ThreadCache* c) noexcept : cache(c) {}
  ThreadCache* const cache;  // never changes: a Lease object serves one cache
  Block* block = nullptr;    // in the region's chain, state cached; null while unused
  bool returning = false;    // a freed block, back to the engine at the thread's next engine lock
  Block* first = nullptr;    // the lowest sub-block
  Lease* prev = nullptr;     // the cache's leases (or its unused Lease objects, through next)
  Lease* next = nullptr;
};

struct ThreadCache {
  // Block objects kept at hand: at least kStashLow after each visit to the engine (a fast-path
  // split needs one), at most kStashHigh (the rest go back to the engine's arena then).
  static constexpr std::size_t kStashLow = 8;
  static constexpr std::size_t kStashHigh = 64;
  // How much free memory a new lease takes from the engine (a request larger than this takes
  // what it needs).
  static constexpr std::size_t kLeaseSmallBytes = std::size_t{2} << 20;
  // How much free memory a thread's large lease takes from the engine's free index (a larger
  // request takes what it needs); no large lease is taken where no free range this large is at
  // hand. Large requests are served inside it by best fit, so a thread allocating large blocks of
  // changing sizes takes the engine lock about once per lease instead of once per request. A
  // large lease is only ever cut out of free memory the engine already holds: it never makes the
  // engine grow (Note [Thread caches], "Large leases of free memory").
  static constexpr std::size_t kLeaseLargeBytes = std::size_t{64} << 20;
  // A growth takes back the free memory of the threads' leases of its pool first only when all
  // the caches together hold at least grow_past_leased_allowance() of it (or the request's size,
  // if larger); else the engine grows and the leases stay, taken back only if the growth fails.
  // The allowance is kGrowPastLeasedBytes per cache, but never more than 1/kGrowPastLeasedDivisor
  // of what the engine reserves (0.5%) unless that is below kGrowPastLeasedBytes. So growth can
  // reserve up to max(64 MiB, 0.5% of reserved) more than a drain first would, however many
  // threads there are (Note [Thread caches], "Growth and other threads' leases").
  static constexpr std::size_t kGrowPastLeasedBytes = std::size_t{64} << 20;
  static constexpr std::size_t kGrowPastLeasedDivisor = 200;
  static constexpr std::size_t grow_past_leased_allowance(std::size_t caches, std::size_t reserved_bytes) noexcept {
    const std::size_t per_cache = kGrowPastLeasedBytes * caches;
    return std::max(kGrowPastLeasedBytes, std::min(per_cache, reserved_bytes / kGrowPastLeasedDivisor));
  }
  // Returning leases a cache holds at most; a free beyond them takes the engine's lock (and
  // returns them). Each takes a Block object from the stash: kept below kStashLow, so the stash
  // refilled at the thread's last engine lock covers them and the large lease.
  static constexpr std::size_t kMaxReturning = 4;
  static_assert(kMaxReturning + 1 < kStashLow);

  ThreadCache() = default;
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;

  SpinLock lock;
  FreeIndex index[2];  // free sub-blocks, by PoolKind
  Lease* leases = nullptr;        // in use, a doubly linked list
  Lease* large_lease = nullptr;   // the one large-pool lease that is not returning, or null
  std::size_t lease_count = 0;
  std::size_t returning_count = 0;  // leases with `returning` set
  std::size_t leased_bytes = 0;   // sum of the leases' sizes
  Block* stash = nullptr;         // spare Block objects, through next
  std::size_t stash_count = 0;
  // Changes to the engine's allocated/requested byte counts made by fast paths, folded into the
  // engine's counters when the cache is drained.
  std::int64_t allocated_delta = 0;
  std::int64_t requested_delta = 0;

  std::size_t free_bytes() const noexcept { return index[0].bytes() + index[1].bytes(); }
  bool empty() const noexcept { return leases == nullptr; }

  // ---- the Space of block_surgery.h (sub-blocks)
  FreeIndex& index_for(const Block& b) noexcept { return index[static_cast<int>(b.region->pool)]; }
  Block* make_block() noexcept {
    Block* b = stash;
    stash = b->next;
    --stash_count;
    b->~Block();
    return new (b) Block();
  }
  void dispose_block(Block* b) noexcept {
    b->next = stash;
    stash = b;
    ++stash_count;
  }
  std::uint64_t free_stamp() const noexcept { return 0; }
  Block*& head_of(const Block& b) noexcept { return static_cast<Lease*>(b.lease)->first; }

  // ---- fast paths (lock held)

  // Best fit among the free sub-blocks for a request of `rounded` on `stream`: the sub-block
  // (free, out of the index, the rest split off as the policy says), or null (nothing fits, or no
  // Block object is at hand for the split).
  Block* take(PoolKind pool, StreamId stream, std::size_t rounded, const policy::SplitLimits& limits) {
    if (stash_count == 0) return nullptr;
    return surgery::take_best_fit(*this, index[static_cast<int>(pool)], pool, stream, rounded, limits);
  }
  // x, an allocated sub-block of one of this cache's leases (out of the live table), is free:
  // merged with its free neighbours in the lease.
  void give_back(Block* x) {
    x->state = BlockState::free;
    x->requested_bytes = 0;
    surgery::insert_free_merged(*this, x);
  }
  // b (a block of a region's chain, out of every container: taken from the engine's free index,
  // or an allocated block just taken out of the live table) becomes a lease: state cached, one
  // free sub-block over it. Needs one Block object in the stash.
  Lease* adopt(Block* b) {
    Lease* l = new_lease();
    b->state = BlockState::cached;
    b->requested_bytes = 0;
    b->lease = l;
    Block* sub = make_block();
    sub->addr = b->addr;
    sub->size_bytes = b->size_bytes;
    sub->stream = b->stream;
    sub->region = b->region;
    sub->lease = l;
    sub->state = BlockState::free;
    l->block = b;
    l->first = sub;
    link(l);
    leased_bytes += b->size_bytes;
    index_for(*sub).insert(*sub);
    return l;
  }
  // Unlinks l (its block and sub-blocks are the caller's to put back) and keeps the object.
  void retire(Lease* l) noexcept {
    if (l == large_lease) large_lease = nullptr;
    if (l->returning) {
      l->returning = false;
      --returning_count;
    }
    if (l->prev) l->prev->next = l->next;
    else leases = l->next;
    if (l->next) l->next->prev = l->prev;
    --lease_count;
    leased_bytes -= l->block->size_bytes;
    l->block = nullptr;
    l->first = nullptr;
    l->prev = nullptr;
    l->next = spare_;
    spare_ = l;
  }

 private:
  Lease* new_lease() {
    if (spare_ == nullptr) {
      storage_.push_back(std::make_unique<Lease>(this));
      return storage_.back().get();
    }
    Lease* l = spare_;
    spare_ = l->next;
    l->next = nullptr;
    return l;
  }
  void link(Lease* l) noexcept {
    l->prev = nullptr;
    l->next = leases;
    if (leases) leases->prev = l;
    leases = l;
    ++lease_count;
  }

  Lease* spare_ = nullptr;                     // unused Lease objects, through next
  std::vector<std::unique_ptr<Lease>> storage_;  // every Lease object of this cache
};

}  // namespace gpumem::alloc::detail
