// FreeIndex (free_index.h) on its own: best fit per stream, order, in-place replacement, byte count.
#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <tuple>
#include <vector>

#include "block.h"
#include "catch.h"
#include "free_index.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::detail;

namespace {

// Blocks that outlive the index (the index never owns them).
struct Blocks {
  std::deque<Block> storage;
  Block& make(StreamId stream, std::uintptr_t addr, std::size_t size) {
    Block& b = storage.emplace_back();
    b.stream = stream;
    b.addr = addr;
    b.size_bytes = size;
    b.state = BlockState::free;
    return b;
  }
};

// What best_fit must return, found by brute force: the smallest block of `in` on stream with at
// least want bytes, the lowest address among equal sizes.
const Block* brute_best_fit(const std::vector<Block*>& in, StreamId stream, std::size_t want) {
  const Block* best = nullptr;
  for (const Block* b : in)
    if (b->stream == stream && b->size_bytes >= want &&
        (!best || std::tie(b->size_bytes, b->addr) < std::tie(best->size_bytes, best->addr)))
      best = b;
  return best;
}

// Takes in[k] out of the index and out of in (order not kept).
void erase_at(FreeIndex& idx, std::vector<Block*>& in, std::size_t k) {
  idx.erase(*in[k]);
  in[k] = in.back();
  in.pop_back();
}

}  // namespace

TEST_CASE("free index: best fit is the smallest block of the stream that fits, lowest address among equals",
          "[free_index]") {
  Blocks bs;
  FreeIndex idx;
  idx.insert(bs.make(0, 0x5000, 4096));
  idx.insert(bs.make(0, 0x1000, 4096));
  idx.insert(bs.make(0, 0x9000, 1024));
  idx.insert(bs.make(0, 0x20000, 65536));
  idx.insert(bs.make(1, 0x40000, 2048));  // another stream: never served to stream 0
  CHECK(idx.size() == 5);
  CHECK(idx.bytes() == 4096 * 2 + 1024 + 65536 + 2048);
  auto it = idx.best_fit(0, 2048);
  REQUIRE(it != nullptr);
  CHECK(it->addr == 0x1000);
  CHECK(idx.best_fit(0, 1024)->addr == 0x9000);
  CHECK(idx.best_fit(0, 5000)->addr == 0x20000);
  CHECK(idx.best_fit(0, 65537) == nullptr);
  CHECK(idx.best_fit(1, 2048)->addr == 0x40000);
  CHECK(idx.best_fit(1, 2049) == nullptr);
  CHECK(idx.best_fit(2, 512) == nullptr);
  CHECK(idx.check_order());
}

TEST_CASE("free index: erase, contains and the byte count", "[free_index]") {
  Blocks bs;
  FreeIndex idx;
  Block& a = bs.make(0, 0x1000, 4096);
  Block& b = bs.make(0, 0x2000, 8192);
  Block& outside = bs.make(0, 0x1000, 4096);  // same key as a, never inserted
  idx.insert(a);
  idx.insert(b);
  CHECK(idx.contains(a));
  CHECK_FALSE(idx.contains(outside));
  idx.erase(a);
  CHECK_FALSE(idx.contains(a));
  CHECK(idx.size() == 1);
  CHECK(idx.bytes() == 8192);
  CHECK(idx.check_order());
}

TEST_CASE("free index: replace keeps the node when the rank is unchanged and moves it when not", "[free_index]") {
  Blocks bs;
  FreeIndex idx;
  Block& small = bs.make(0, 0x1000, 1024);
  Block& mid = bs.make(0, 0x8000, 8192);
  Block& big = bs.make(0, 0x40000, 65536);
  idx.insert(small);
  idx.insert(mid);
  idx.insert(big);
  // A split leaves a rest that still ranks between its neighbours: swapped in place.
  Block& rest = bs.make(0, 0x9000, 4096);
  idx.replace(mid, 8192, rest);
  CHECK(idx.contains(rest));
  CHECK_FALSE(idx.contains(mid));
  CHECK(idx.bytes() == 1024 + 4096 + 65536);
  CHECK(idx.check_order());
  // A rest that ranks below its neighbour moves.
  Block& tiny = bs.make(0, 0x50000, 512);
  idx.replace(big, 65536, tiny);
  CHECK(idx.best_fit(0, 512)->addr == 0x50000);
  CHECK(idx.bytes() == 1024 + 4096 + 512);
  CHECK(idx.check_order());
}

TEST_CASE("free index: resized moves a block whose size changed rank", "[free_index]") {
  Blocks bs;
  FreeIndex idx;
  Block& a = bs.make(0, 0x1000, 1024);
  Block& b = bs.make(0, 0x8000, 4096);
  idx.insert(a);
  idx.insert(b);
  const std::size_t old = a.size_bytes;
  a.size_bytes = 16384;  // merged with neighbours: now the largest
  idx.resized(a, old);
  CHECK(idx.check_order());
  CHECK(idx.best_fit(0, 8192)->addr == 0x1000);
  CHECK(idx.bytes() == 16384 + 4096);
}

TEST_CASE("free index: random operations keep order, bytes and best fit right", "[free_index]") {
  std::mt19937_64 rng(7);
  Blocks bs;
  FreeIndex idx;
  std::vector<Block*> in;
  std::uintptr_t next_addr = 0x100000;
  for (int step = 0; step < 4000; ++step) {
    const unsigned op = rng() % 4;
    if (op < 2 || in.empty()) {
      Block& b = bs.make(rng() % 3, next_addr, 512 * (1 + rng() % 64));
      next_addr += 1 << 20;
      idx.insert(b);
      in.push_back(&b);
    } else if (op == 2) {
      erase_at(idx, in, rng() % in.size());
    } else {
      Block* b = in[rng() % in.size()];
      const std::size_t old = b->size_bytes;
      b->size_bytes = 512 * (1 + rng() % 64);
      idx.resized(*b, old);
    }
    if (step % 97 == 0) {
      REQUIRE(idx.check_order());
      std::size_t bytes = 0;
      for (Block* b : in) bytes += b->size_bytes;
      CHECK(idx.bytes() == bytes);
      CHECK(idx.size() == in.size());
      const StreamId s = rng() % 3;
      const std::size_t want = 512 * (1 + rng() % 64);
      CHECK(idx.best_fit(s, want) == brute_best_fit(in, s, want));
    }
  }
  for (Block* b : in) idx.erase(*b);
  CHECK(idx.size() == 0);
  CHECK(idx.bytes() == 0);
}

// Few blocks over a wide range of sizes: most classes hold one block or none, so most changes move
// a block that is alone in its class tree into an empty one (FreeIndex links it there itself,
// link_sole) or out of a tree it is alone in. check_order() checks every tree's red-black shape.
TEST_CASE("free index: blocks alone in their classes move between classes and the trees stay sound", "[free_index]") {
  std::mt19937_64 rng(13);
  Blocks bs;
  FreeIndex idx;
  std::vector<Block*> in;
  std::uintptr_t next_addr = std::uintptr_t{1} << 40;
  // Log-uniform in 512 B..64 MiB, in 512 B granules.
  auto any_size = [&] {
    const double bytes = std::exp2(9.0 + 17.0 * std::uniform_real_distribution<double>(0.0, 1.0)(rng));
    return std::max<std::size_t>(512, static_cast<std::size_t>(bytes) & ~std::size_t{511});
  };
  std::size_t moves_between_classes = 0;
  for (int step = 0; step < 20000; ++step) {
    const unsigned op = rng() % 4;
    if ((op == 0 && in.size() < 8) || in.empty()) {
      Block& b = bs.make(rng() % 2, next_addr, any_size());
      next_addr += std::size_t{1} << 27;
      idx.insert(b);
      in.push_back(&b);
    } else if (op == 1) {
      erase_at(idx, in, rng() % in.size());
    } else {
      Block* b = in[rng() % in.size()];
      const std::size_t old = b->size_bytes;
      b->size_bytes = any_size();
      if (SizeClasses::of(old).index() != SizeClasses::of(b->size_bytes).index()) ++moves_between_classes;
      idx.resized(*b, old);
    }
    REQUIRE(idx.check_order());
    const StreamId s = rng() % 2;
    const std::size_t want = any_size();
    REQUIRE(idx.best_fit(s, want) == brute_best_fit(in, s, want));
  }
  CHECK(moves_between_classes > 5000);
  for (Block* b : in) idx.erase(*b);
  CHECK(idx.size() == 0);
  CHECK(idx.check_order());
}

// blocks_from(n) is blocks() filtered to the blocks of at least n bytes, in the same order, on any
// mix of streams, sizes within and across classes, and equal sizes.
TEST_CASE("free index: blocks_from visits the blocks of at least n bytes in the order of blocks()", "[free_index]") {
  std::mt19937_64 rng(11);
  Blocks bs;
  FreeIndex idx;
  auto check = [&](std::size_t n) {
    std::vector<const Block*> want, got;
    for (const Block& b : idx.blocks())
      if (b.size_bytes >= n) want.push_back(&b);
    for (const Block& b : idx.blocks_from(n)) got.push_back(&b);
    CHECK(got == want);
  };
  // Empty, then one stream's blocks straddling the class of 2 MiB (sizes just under and at it, one
  // just over, in its class and the next).
  check(0);
  check(2u << 20);
  const std::size_t mib = 1u << 20;
  for (std::size_t size : {2 * mib - 512, 2 * mib - 4096, 2 * mib, 2 * mib, 2 * mib + 512, 3 * mib, 64 * mib, std::size_t{4096}})
    idx.insert(bs.make(0, 0x1000000 * (idx.size() + 1), size));
  std::vector<const Block*> big;
  for (const Block& b : idx.blocks_from(2 * mib)) big.push_back(&b);
  REQUIRE(big.size() == 5);
  CHECK(big.front()->size_bytes == 2 * mib);
  CHECK(big.front()->addr < big[1]->addr);  // equal sizes by address
  CHECK(big.back()->size_bytes == 64 * mib);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, 2 * mib - 512, 2 * mib, 2 * mib + 1,
                        3 * mib, 64 * mib, 64 * mib + 1})
    check(n);
  // Random blocks on three streams (streams added out of order), sizes from 512 B to 8 MiB.
  std::vector<Block*> in;
  std::uintptr_t next_addr = 0x100000000;
  for (int step = 0; step < 3000; ++step) {
    if (rng() % 3 != 0 || in.empty()) {
      const std::size_t size = rng() % 4 == 0 ? 2 * mib * (1 + rng() % 4) : 512 * (1 + rng() % 16384);
      Block& b = bs.make(static_cast<StreamId>(rng() % 3 * 7), next_addr, size);
      next_addr += 16 * mib;
      idx.insert(b);
      in.push_back(&b);
    } else {
      erase_at(idx, in, rng() % in.size());
    }
    if (step % 61 == 0) {
      check(2 * mib);
      check(512 * (1 + rng() % 16384));
    }
  }
}
