// FreeIndex: the free (cached, mapped) blocks of one pool, ordered by (stream, size, address), so
// that best fit on a stream is one lower_bound: the smallest block of that stream at least as large
// as the request, the lowest address among equals. Blocks never serve another stream's requests.
// Not thread-safe: used under the engine's lock.
#pragma once

#include <boost/intrusive/set.hpp>
#include <iterator>
#include <tuple>

#include "block.h"

namespace gpumem::alloc::detail {

struct FreeOrder {
  bool operator()(const Block& a, const Block& b) const noexcept {
    return std::tie(a.stream, a.size_bytes, a.addr) < std::tie(b.stream, b.size_bytes, b.addr);
  }
};

struct FreeKey {
  StreamId stream;
  std::size_t size_bytes;
  std::uintptr_t addr;
};

struct FreeKeyOrder {
  bool operator()(const FreeKey& k, const Block& b) const noexcept {
    return std::tie(k.stream, k.size_bytes, k.addr) < std::tie(b.stream, b.size_bytes, b.addr);
  }
  bool operator()(const Block& b, const FreeKey& k) const noexcept {
    return std::tie(b.stream, b.size_bytes, b.addr) < std::tie(k.stream, k.size_bytes, k.addr);
  }
};

class FreeIndex {
 public:
  using Set = bi::set<Block, bi::member_hook<Block, SetHook, &Block::set_hook>, bi::compare<FreeOrder>,
                      bi::constant_time_size<true>>;
  using iterator = Set::iterator;

  void insert(Block& b) noexcept { set_.insert(b); bytes_ += b.size_bytes; }
  // `fresh` takes the place of `old` (in the index; it had old_size bytes when inserted). When
  // fresh's key falls between old's neighbours the node is swapped in place, without rebalancing:
  // the common case of a split or a merge, where the block keeps its rank.
  void replace(Block& old, std::size_t old_size, Block& fresh) noexcept {
    auto it = set_.iterator_to(old);
    if (fits_at(it, fresh)) {
      set_.replace_node(it, fresh);
    } else {
      set_.erase(it);
      set_.insert(fresh);
    }
    bytes_ = bytes_ - old_size + fresh.size_bytes;
  }
  // b (in the index) changed size from old_size: moves it if its rank changed.
  void resized(Block& b, std::size_t old_size) noexcept {
    auto it = set_.iterator_to(b);
    if (!fits_at(it, b)) {
      set_.erase(it);
      set_.insert(b);
    }
    bytes_ = bytes_ - old_size + b.size_bytes;
  }
  void erase(Block& b) noexcept {
    set_.erase(set_.iterator_to(b));
    bytes_ -= b.size_bytes;
  }
  // The smallest block on stream with size >= size_bytes (lowest address among equal sizes), or
  // end() if none.
  iterator best_fit(StreamId stream, std::size_t size_bytes) noexcept {
    auto it = set_.lower_bound(FreeKey{stream, size_bytes, 0}, FreeKeyOrder{});
    if (it == set_.end() || it->stream != stream) return set_.end();
    return it;
  }
  iterator begin() noexcept { return set_.begin(); }
  iterator end() noexcept { return set_.end(); }
  Set& blocks() noexcept { return set_; }
  const Set& blocks() const noexcept { return set_; }
  std::size_t size() const noexcept { return set_.size(); }
  std::size_t bytes() const noexcept { return bytes_; }
  bool check_order() const noexcept {
    const Block* prev = nullptr;
    std::size_t bytes = 0;
    for (const Block& b : set_) {
      if (prev && !FreeOrder{}(*prev, b)) return false;
      bytes += b.size_bytes;
      prev = &b;
    }
    return bytes == bytes_;
  }
  bool contains(const Block& b) const noexcept {
    auto it = set_.find(b);
    return it != set_.end() && &*it == &b;
  }

 private:
  // Whether key may sit at it's position: strictly between its neighbours.
  bool fits_at(iterator it, const Block& key) const noexcept {
    if (it != set_.begin() && !FreeOrder{}(*std::prev(it), key)) return false;
    auto next = std::next(it);
    return next == set_.end() || FreeOrder{}(key, *next);
  }

  Set set_;
  std::size_t bytes_ = 0;
};

}  // namespace gpumem::alloc::detail
