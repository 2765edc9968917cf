// LiveTable and ShardedLiveTable (live_table.h) on their own: every block stays findable by its
// address while the bucket arrays double under it, erase unlinks exactly one block, and the paths
// with and without the shard's lock see the same table.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "block.h"
#include "catch.h"
#include "live_table.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::detail;

namespace {

constexpr std::uintptr_t kBase = std::uintptr_t{1} << 40;
constexpr std::uintptr_t kGranule = 512;  // block addresses are 512-aligned (the hash drops those bits)

// Blocks that outlive the table (the table never owns them).
struct Blocks {
  std::deque<Block> storage;
  Block& make(std::uintptr_t addr) {
    Block& b = storage.emplace_back();
    b.addr = addr;
    b.size_bytes = kGranule;
    b.state = BlockState::allocated;
    return b;
  }
};

}  // namespace

TEST_CASE("live table: the block that makes the bucket array double is linked after it doubles", "[live_table]") {
  // 64 buckets at first; the array doubles when the 65th, 129th, 257th, ... block goes in, in
  // the call that inserts it. Every block inserted so far is checked after each insert that
  // doubled the array, and a sample after the others.
  LiveTable t;
  Blocks blocks;
  std::vector<Block*> in;
  constexpr int kBlocks = 10'000;
  int checked_doublings = 0;
  for (int i = 0; i < kBlocks; ++i) {
    Block& b = blocks.make(kBase + static_cast<std::uintptr_t>(i) * kGranule);
    t.insert(b);
    in.push_back(&b);
    REQUIRE(t.size() == in.size());
    REQUIRE(t.find(b.addr) == &b);
    REQUIRE(b.live_hook.pprev != nullptr);
    REQUIRE(*b.live_hook.pprev == &b);
    const bool doubled = in.size() > 64 && ((in.size() - 1) & (in.size() - 2)) == 0;
    if (doubled) {
      ++checked_doublings;
      for (Block* x : in) REQUIRE(t.find(x->addr) == x);
    } else if (i % 997 == 0) {
      for (Block* x : in) REQUIRE(t.find(x->addr) == x);
    }
  }
  CHECK(checked_doublings == 8);  // at 65, 129, ..., 8193 blocks
  // Addresses of no block: below, between (not 512-aligned to a block's start) and above.
  CHECK(t.find(kBase - kGranule) == nullptr);
  CHECK(t.find(kBase + 7 * kGranule + 256) == nullptr);
  CHECK(t.find(kBase + static_cast<std::uintptr_t>(kBlocks) * kGranule) == nullptr);

  // Erase in random order: each erase unlinks its block alone.
  std::mt19937_64 rng(7);
  std::shuffle(in.begin(), in.end(), rng);
  for (std::size_t k = 0; k < in.size(); ++k) {
    Block& b = *in[k];
    t.erase(b);
    REQUIRE(t.size() == in.size() - k - 1);
    REQUIRE(b.live_hook.pprev == nullptr);
    REQUIRE(b.live_hook.next == nullptr);
    REQUIRE(t.find(b.addr) == nullptr);
    if (k % 613 == 0)
      for (std::size_t j = k + 1; j < in.size(); ++j) REQUIRE(t.find(in[j]->addr) == in[j]);
  }
}

TEST_CASE("sharded live table: locked and unlocked paths share one table per shard", "[live_table]") {
  ShardedLiveTable t;
  Blocks blocks;
  std::vector<Block*> in;
  // 40,000 blocks over 64 shards: each shard's array doubles several times (64 buckets at first),
  // half of the inserts through the locked path.
  constexpr int kBlocks = 40'000;
  for (int i = 0; i < kBlocks; ++i) {
    Block& b = blocks.make(kBase + static_cast<std::uintptr_t>(i) * kGranule);
    t.insert(b, i % 2 == 0);
    in.push_back(&b);
  }
  REQUIRE(t.size_unlocked() == in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uintptr_t a = in[i]->addr;
    REQUIRE(t.find(a, false) == in[i]);
    REQUIRE(t.find(a, true) == in[i]);
    REQUIRE(t.find_unlocked(a) == in[i]);
    REQUIRE(t.with_shard(a, [&](LiveTable& s) { return s.find(a); }) == in[i]);
  }
  CHECK(t.find(kBase - kGranule, true) == nullptr);
  CHECK(t.find(kBase - kGranule, false) == nullptr);

  // Erase a random half, alternating the paths; the rest stays findable, the erased are gone.
  std::mt19937_64 rng(11);
  std::shuffle(in.begin(), in.end(), rng);
  const std::size_t half = in.size() / 2;
  for (std::size_t k = 0; k < half; ++k) t.erase(*in[k], k % 3 != 0);
  REQUIRE(t.size_unlocked() == in.size() - half);
  for (std::size_t k = 0; k < in.size(); ++k) {
    const std::uintptr_t a = in[k]->addr;
    if (k < half) {
      REQUIRE(t.find(a, k % 2 == 0) == nullptr);
      REQUIRE(in[k]->live_hook.pprev == nullptr);
    } else {
      REQUIRE(t.find(a, k % 2 == 0) == in[k]);
    }
  }

  // They go back in (no doubling now: the arrays keep their size) and are found again.
  for (std::size_t k = 0; k < half; ++k) t.insert(*in[k], k % 2 != 0);
  REQUIRE(t.size_unlocked() == in.size());
  for (Block* b : in) REQUIRE(t.find(b->addr, false) == b);

  t.clear_unlocked();
  CHECK(t.size_unlocked() == 0);
  for (Block* b : in) REQUIRE(b->live_hook.pprev == nullptr);
}
