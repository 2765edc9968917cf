// FreeIndex: the free (cached, mapped) blocks of one pool, for best fit per stream: the smallest
// block of the request's stream at least as large as the request, the lowest address among equal
// sizes. Blocks never serve another stream's requests.
//
// Structure: a segregated fit in the manner of TLSF (Masmano et al., "TLSF: a new dynamic memory
// allocator for real-time systems", 2004), per stream. Sizes fall into classes: one class per
// 512 bytes up to kLinearBytes (16 KiB), then kSubClasses (32) classes per power of two (each
// 1/32 of its octave wide, ~3%), the last class holding everything above kTopBytes (1 TiB). A
// two-level bitmap (one bit per power of two, one per class within it) says which classes hold
// blocks. Unlike TLSF, which takes the first block of a class that is sure to fit and so gives
// a "good fit", each class keeps its blocks ordered by (size, address) (a small intrusive
// red-black tree), so the answer is the same block a single ordered index would give:
//   best_fit(stream, n): in the class of n, the first block >= (n, 0); if none, the first block of
//   the next non-empty class (bitmap scans: two count-trailing-zeros), whose every block is larger.
// The class of a size is a few shifts; the bitmap scans are constant time; the in-class trees
// hold blocks within ~3% of each other's size, so they are small (one or two blocks in the common
// case), and a split or merge that keeps a block in its class swaps it in place.
//
// Iteration (begin()/end(), blocks()) visits every block in (stream, size, address) order, the
// order of the single red-black tree this replaced: growth and release gather candidates in that
// order, so their choices and the events they emit are unchanged. blocks_from(n) visits, in the
// same order, only the blocks of at least n bytes: per stream it starts at the class of n (a
// lower bound in that class's tree), so the smaller blocks are never visited (growth looks for
// wholly free pieces only in blocks of a slot or more).
//
// Invariants (check_order()): each block sits in the class of its size on its stream's bins, the
// class trees are ordered, a bit is set iff its class (or level) is non-empty, bytes() and
// size() are the sums. Not thread-safe: used under the engine's lock (or by the one thread that
// owns it).
#pragma once

#include <boost/intrusive/set.hpp>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <iterator>
#include <memory>
#include <tuple>
#include <vector>

#include "block.h"

namespace gpumem::alloc::detail {

// Order within a class: (size, address). The stream is the bins'.
struct ClassOrder {
  bool operator()(const Block& a, const Block& b) const noexcept {
    return a.size_bytes < b.size_bytes || (a.size_bytes == b.size_bytes && a.addr < b.addr);
  }
};

struct SizeAddrKey {
  std::size_t size_bytes;
  std::uintptr_t addr;
};

struct ClassKeyOrder {
  bool operator()(const SizeAddrKey& k, const Block& b) const noexcept {
    return k.size_bytes < b.size_bytes || (k.size_bytes == b.size_bytes && k.addr < b.addr);
  }
  bool operator()(const Block& b, const SizeAddrKey& k) const noexcept {
    return b.size_bytes < k.size_bytes || (b.size_bytes == k.size_bytes && b.addr < k.addr);
  }
};

// The size classes (pure functions; exposed for tests).
struct SizeClasses {
  static constexpr unsigned kSubBits = 5;
  static constexpr unsigned kSubClasses = 1u << kSubBits;           // classes per level
  static constexpr unsigned kGranuleShift = 9;                       // 512 B
  static constexpr unsigned kLinearShift = kGranuleShift + kSubBits;  // 16 KiB
  static constexpr std::size_t kLinearBytes = std::size_t{1} << kLinearShift;
  static constexpr unsigned kTopShift = 40;                          // 1 TiB
  static constexpr std::size_t kTopBytes = std::size_t{1} << kTopShift;
  // Level 0: the linear classes (size / 512); level L >= 1: sizes in [2^(13+L), 2^(14+L)).
  static constexpr unsigned kLevels = kTopShift - kLinearShift + 2;  // + the top level
  static constexpr unsigned kClasses = kLevels * kSubClasses;

  struct Class {
    unsigned level;
    unsigned sub;
    unsigned index() const noexcept { return level * kSubClasses + sub; }
  };
  static_assert(kClasses <= 65536, "a class index fits Block::free_class");
  static Class at_index(unsigned index) noexcept { return {index / kSubClasses, index % kSubClasses}; }

  // Monotonic: a <= b implies of(a).index() <= of(b).index(). Classes are closed above, (lo, hi]:
  // a block of a power of two (a 2 MiB piece, 16 KiB) shares its class with the blocks a little
  // smaller than it, so splitting a small request off a fresh piece, and merging it back, keeps
  // the remainder in its class (and its node in place).
  static Class of(std::size_t size_bytes) noexcept {
    const std::size_t s = size_bytes - (size_bytes != 0);
    if (s < kLinearBytes) return {0, static_cast<unsigned>(s >> kGranuleShift)};
    if (s >= kTopBytes) return {kLevels - 1, 0};
    const unsigned log2 = static_cast<unsigned>(std::bit_width(s)) - 1;  // >= kLinearShift
    return {log2 - kLinearShift + 1, static_cast<unsigned>(s >> (log2 - kSubBits)) & (kSubClasses - 1)};
  }
};

class FreeIndex {
 public:
  // A multiset, though no two blocks share (size, address): its insert descends once and links,
  // where a set's also compares the new block with its neighbour to refuse a duplicate. The tree
  // it builds is the same (docs/notes/fast-path.md, "The class trees as multisets").
  using ClassSet = bi::multiset<Block, bi::member_hook<Block, SetHook, &Block::set_hook>, bi::compare<ClassOrder>,
                                bi::constant_time_size<false>>;

 private:
  // One stream's classes.
  struct Bins {
    explicit Bins(StreamId s) noexcept : stream(s) {}
    StreamId stream;
    std::size_t blocks = 0;
    std::uint64_t level_bits = 0;                           // bit L: some class of level L non-empty
    std::array<std::uint32_t, SizeClasses::kLevels> class_bits{};  // bit s of [L]: class (L, s) non-empty
    std::array<ClassSet, SizeClasses::kClasses> classes;

    ClassSet& set_of(SizeClasses::Class c) noexcept { return classes[c.index()]; }
    void add(Block& b) noexcept { add(b, SizeClasses::of(b.size_bytes)); }
    // c: the class of b's size (remembered in b.free_class, so that taking b out or resizing it
    // does not compute it again).
    [[gnu::always_inline]] void add(Block& b, SizeClasses::Class c) noexcept {
      b.free_class = static_cast<std::uint16_t>(c.index());
      ClassSet& set = classes[c.index()];
      // Most classes hold one block or none: into an empty tree b goes as its only node, linked
      // directly, with no search and no rebalancing.
      if (set.empty()) link_sole(set, b);
      else set.insert(b);
      note_filled(c);
      ++blocks;
    }
    void note_filled(SizeClasses::Class c) noexcept {
      class_bits[c.level] |= 1u << c.sub;
      level_bits |= std::uint64_t{1} << c.level;
    }
    void remove(Block& b) noexcept { remove(b, SizeClasses::at_index(b.free_class)); }
    // c: the class b is indexed in.
    [[gnu::always_inline]] void remove(Block& b, SizeClasses::Class c) noexcept {
      ClassSet& set = classes[c.index()];
      if (alone_in_tree(b)) {
        set.clear();  // the only block: constant time with normal_link hooks, no rebalancing
        note_empty(c);
      } else {
        set.erase(set.iterator_to(b));
      }
      --blocks;
    }
    void note_empty(SizeClasses::Class c) noexcept {
      class_bits[c.level] &= ~(1u << c.sub);
      if (class_bits[c.level] == 0) level_bits &= ~(std::uint64_t{1} << c.level);
    }
    // The first non-empty class after c, or null.
    ClassSet* next_class(SizeClasses::Class c) noexcept {
      const std::uint32_t above = c.sub + 1 < SizeClasses::kSubClasses ? class_bits[c.level] & (~0u << (c.sub + 1)) : 0;
      if (above) return &classes[c.level * SizeClasses::kSubClasses + static_cast<unsigned>(std::countr_zero(above))];
      const std::uint64_t levels =
          c.level + 1 < 64 ? level_bits & (~std::uint64_t{0} << (c.level + 1)) : std::uint64_t{0};
      if (!levels) return nullptr;
      const unsigned l = static_cast<unsigned>(std::countr_zero(levels));
      return &classes[l * SizeClasses::kSubClasses + static_cast<unsigned>(std::countr_zero(class_bits[l]))];
    }
    // The index of the first non-empty class at or after `from`, or kClasses.
    unsigned first_class_from(unsigned from) const noexcept {
      if (from >= SizeClasses::kClasses) return SizeClasses::kClasses;
      unsigned level = from / SizeClasses::kSubClasses, sub = from % SizeClasses::kSubClasses;
      const std::uint32_t here = class_bits[level] & (~0u << sub);
      if (here) return level * SizeClasses::kSubClasses + static_cast<unsigned>(std::countr_zero(here));
      const std::uint64_t levels =
          level + 1 < 64 ? level_bits & (~std::uint64_t{0} << (level + 1)) : std::uint64_t{0};
      if (!levels) return SizeClasses::kClasses;
      level = static_cast<unsigned>(std::countr_zero(levels));
      return level * SizeClasses::kSubClasses + static_cast<unsigned>(std::countr_zero(class_bits[level]));
    }
  };
  static_assert(SizeClasses::kLevels <= 64, "one bit per level");

 public:
  FreeIndex() = default;
  FreeIndex(const FreeIndex&) = delete;
  FreeIndex& operator=(const FreeIndex&) = delete;
  ~FreeIndex() { clear(); }

  // ---- changes (b's size_bytes and stream are its key; a block's key changes only through
  // replace/resized, which are told the size it was indexed under)

  void insert(Block& b) {
    bins_for(b.stream).add(b);
    ++size_;
    add_bytes(b.size_bytes, 0);
  }
  // `fresh` takes the place of `old` (in the index, indexed with old_size bytes; same stream).
  // When fresh falls in old's class between old's neighbours the node is swapped in place: the
  // common case of a split or a merge, where the block keeps its rank.
  void replace(Block& old, std::size_t old_size, Block& fresh) {
    Bins& bins = bins_for(old.stream);
    const SizeClasses::Class c = SizeClasses::at_index(old.free_class);
    ClassSet& set = bins.set_of(c);
    auto it = set.iterator_to(old);
    if (SizeClasses::of(fresh.size_bytes).index() == c.index() && (alone_in_tree(old) || fits_at(set, it, fresh))) {
      set.replace_node(it, fresh);
      fresh.free_class = old.free_class;
    } else {
      bins.remove(old, c);
      bins.add(fresh);
    }
    add_bytes(fresh.size_bytes, old_size);
  }
  // b (in the index, indexed with old_size bytes) changed its key (size, address): moves it if its
  // rank changed. The common case (the block stays alone in its class: a split off a free block or
  // a merge into it, once per engine call) is inline and touches neither the bins nor the tree.
  void resized(Block& b, std::size_t old_size) {
    add_bytes(b.size_bytes, old_size);
    const SizeClasses::Class was = SizeClasses::at_index(b.free_class), now = SizeClasses::of(b.size_bytes);
    if (alone_in_tree(b)) {
      if (was.index() == now.index()) return;
      move_alone(b, was, now);
      return;
    }
    move_resized(b, was, now);
  }
  void erase(Block& b) noexcept {
    bins_of(b.stream)->remove(b);
    --size_;
    add_bytes(0, b.size_bytes);
  }

  // ---- queries

  // The smallest block on stream with size >= size_bytes (lowest address among equal sizes), or
  // null.
  Block* best_fit(StreamId stream, std::size_t size_bytes) noexcept {
    Bins* bins = bins_of(stream);
    if (bins == nullptr || bins->blocks == 0) return nullptr;
    const SizeClasses::Class c = SizeClasses::of(size_bytes);
    if (bins->class_bits[c.level] & (1u << c.sub)) {
      ClassSet& set = bins->set_of(c);
      auto it = set.lower_bound(SizeAddrKey{size_bytes, 0}, ClassKeyOrder{});
      if (it != set.end()) return &*it;
    }
    ClassSet* next = bins->next_class(c);
    return next ? &*next->begin() : nullptr;
  }
  std::size_t size() const noexcept { return size_; }
  // Exact under the lock that guards this index; read without it (the thread caches' indexes are,
  // Note [Thread caches]), a value it had at some recent moment.
  std::size_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  bool contains(const Block& b) const noexcept {
    const Bins* bins = nullptr;
    for (const auto& x : streams_)
      if (x->stream == b.stream) bins = x.get();
    if (bins == nullptr) return false;
    const ClassSet& set = bins->classes[SizeClasses::of(b.size_bytes).index()];
    auto it = set.find(b);
    return it != set.end() && &*it == &b;
  }
  // Every block is in the class of its size, classes are ordered, the bitmaps and counts agree.
  bool check_order() const noexcept;

  // ---- iteration in (stream, size, address) order

  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Block;
    using difference_type = std::ptrdiff_t;
    using pointer = Block*;
    using reference = Block&;

    iterator() = default;
    Block& operator*() const noexcept { return *it_; }
    Block* operator->() const noexcept { return &*it_; }
    iterator& operator++() noexcept {
      ++it_;
      if (it_ == (*index_->streams_[stream_]).classes[class_].end()) settle(class_ + 1);
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.stream_ == b.stream_ && (a.stream_ == a.end_stream() || (a.class_ == b.class_ && a.it_ == b.it_));
    }

   private:
    friend class FreeIndex;
    // min_bytes: only blocks of at least that many bytes (0: all).
    iterator(const FreeIndex* index, std::size_t stream, std::size_t min_bytes = 0) noexcept
        : index_(index), stream_(stream), min_bytes_(min_bytes), min_class_(SizeClasses::of(min_bytes).index()) {
      if (stream_ < end_stream()) settle(min_class_);
    }
    std::size_t end_stream() const noexcept { return index_->streams_.size(); }
    // Moves to the first block of at least min_bytes_ in class `from` or later of the current
    // stream, or of a later one. Classes below min_class_ hold only smaller blocks (SizeClasses::of
    // is monotonic); in min_class_ itself the smaller ones come first (the trees are ordered by
    // size), so a lower bound there skips exactly them.
    void settle(unsigned from) noexcept {
      for (; stream_ < end_stream(); ++stream_, from = min_class_) {
        Bins& bins = *index_->streams_[stream_];
        for (class_ = bins.first_class_from(from); class_ < SizeClasses::kClasses;
             class_ = bins.first_class_from(class_ + 1)) {
          ClassSet& set = bins.classes[class_];
          it_ = class_ == min_class_ && min_bytes_ > 0 ? set.lower_bound(SizeAddrKey{min_bytes_, 0}, ClassKeyOrder{})
                                                       : set.begin();
          if (it_ != set.end()) return;
        }
      }
    }
    const FreeIndex* index_ = nullptr;
    std::size_t stream_ = 0;
    std::size_t min_bytes_ = 0;
    unsigned min_class_ = 0;
    unsigned class_ = 0;
    ClassSet::iterator it_{};
  };

  iterator begin() const noexcept { return iterator(this, 0); }
  iterator end() const noexcept { return iterator(this, streams_.size()); }
  // The blocks as a range (for range-for).
  const FreeIndex& blocks() const noexcept { return *this; }
  FreeIndex& blocks() noexcept { return *this; }
  // The blocks of at least min_bytes, in the order of blocks() (the others are not visited).
  class SizeRange {
   public:
    iterator begin() const noexcept { return iterator(index_, 0, min_bytes_); }
    iterator end() const noexcept { return index_->end(); }

   private:
    friend class FreeIndex;
    SizeRange(const FreeIndex* index, std::size_t min_bytes) noexcept : index_(index), min_bytes_(min_bytes) {}
    const FreeIndex* index_;
    std::size_t min_bytes_;
  };
  SizeRange blocks_from(std::size_t min_bytes) const noexcept { return SizeRange(this, min_bytes); }

  // Forgets every block (they are not touched: teardown).
  void clear() noexcept {
    for (auto& bins : streams_)
      for (ClassSet& set : bins->classes) set.clear();
    streams_.clear();
    last_ = nullptr;
    size_ = 0;
    bytes_.store(0, std::memory_order_relaxed);
  }

 private:
  // resized() when b, alone in its class tree, changed class. The common case after "stays in its
  // class": its new class is empty too (a split or a merge across a class boundary, such as
  // 2 MiB <-> 1 MiB in the small pool). The old tree's header is reset, the new tree takes b by
  // link_sole, and only the bits change (the block count does not). Out of line but small, so
  // that neither its caller (inlined in the engine's split and merge) nor this path pays for the
  // registers that move_resized's tree calls need; a non-empty new class (or a stream other than
  // the last one looked up) goes on to move_resized.
  [[gnu::noinline]] void move_alone(Block& b, SizeClasses::Class was, SizeClasses::Class now) {
    // Every other path leaves by a tail call, so this one saves one register, not six.
    if (last_ == nullptr || last_->stream != b.stream) return move_resized(b, was, now);
    Bins& bins = *last_;
    ClassSet& to = bins.set_of(now);
    if (!to.empty()) return move_resized(b, was, now);
    bins.set_of(was).clear();
    bins.note_empty(was);
    link_sole(to, b);
    bins.note_filled(now);
    b.free_class = static_cast<std::uint16_t>(now.index());
  }
  // resized() when b may have to move: within its class if its rank among its neighbours changed,
  // or to its new class.
  [[gnu::noinline]] void move_resized(Block& b, SizeClasses::Class was, SizeClasses::Class now) {
    Bins& bins = bins_for(b.stream);
    if (was.index() == now.index()) {
      ClassSet& set = bins.set_of(was);
      if (fits_at(set, set.iterator_to(b), b)) return;
    }
    bins.remove(b, was);
    bins.add(b, now);
  }
  // Whether b (in some class tree) is its tree's only node, from b's own links: no children, and
  // the parent is the header (whose parent is the root). A non-root node's parent is a node whose
  // parent is never b. Three loads, no lookup of b's class.
  static bool alone_in_tree(Block& b) noexcept {
    using Traits = ClassSet::value_traits;
    using Node = Traits::node_traits;
    const auto n = Traits::to_node_ptr(b);
    return !Node::get_left(n) && !Node::get_right(n) && Node::get_parent(Node::get_parent(n)) == n;
  }
  // Links b as the only node of the empty tree set: what set.push_back(b) leaves (the header's
  // parent, leftmost and rightmost are b; b is black, its parent the header, no children), without
  // push_back's search for the place and its rebalancing (about 40 instructions; a split or a
  // merge that changes a block's class does this once). check_order() checks the shape (tree_sound).
  static void link_sole(ClassSet& set, Block& b) noexcept {
    using Traits = ClassSet::value_traits;
    using Node = Traits::node_traits;
    const auto header = set.end().pointed_node();
    const auto n = Traits::to_node_ptr(b);
    Node::set_parent(header, n);
    Node::set_left(header, n);
    Node::set_right(header, n);
    Node::set_parent(n, header);
    Node::set_left(n, nullptr);
    Node::set_right(n, nullptr);
    Node::set_color(n, Node::black());
  }
  // The red-black shape of one class tree, which link_sole writes by hand: the header's parent is
  // the root and its left and right the first and last nodes; every child points back at its
  // parent; the root is black, no red node has a red child, and every path down has the same
  // number of black nodes. Linear; for check_order().
  static bool tree_sound(const ClassSet& set) noexcept {
    using Node = ClassSet::node_traits;
    using Ptr = Node::node_ptr;
    const Ptr header = set.end().pointed_node();
    const Ptr root = Node::get_parent(header);
    if (!root) return Node::get_left(header) == header && Node::get_right(header) == header;
    if (Node::get_parent(root) != header || Node::get_color(root) != Node::black()) return false;
    if (Node::get_left(header) != set.begin().pointed_node() ||
        Node::get_right(header) != std::prev(set.end()).pointed_node())
      return false;
    // The black height of the subtree at n, or -1 where it is unsound.
    auto black_height = [](auto& self, Ptr n) -> int {
      if (!n) return 1;
      const Ptr l = Node::get_left(n), r = Node::get_right(n);
      if ((l && Node::get_parent(l) != n) || (r && Node::get_parent(r) != n)) return -1;
      if (Node::get_color(n) == Node::red() &&
          ((l && Node::get_color(l) == Node::red()) || (r && Node::get_color(r) == Node::red())))
        return -1;
      const int hl = self(self, l), hr = self(self, r);
      if (hl < 0 || hl != hr) return -1;
      return hl + (Node::get_color(n) == Node::black() ? 1 : 0);
    };
    return black_height(black_height, root) > 0;
  }
  // Whether key may sit at it's position of set: strictly between its neighbours.
  static bool fits_at(ClassSet& set, ClassSet::iterator it, const Block& key) noexcept {
    if (it != set.begin() && !ClassOrder{}(*std::prev(it), key)) return false;
    auto next = std::next(it);
    return next == set.end() || ClassOrder{}(key, *next);
  }

  Bins* bins_of(StreamId stream) noexcept {
    if (last_ != nullptr && last_->stream == stream) return last_;
    return bins_of_slow(stream);
  }
  [[gnu::noinline]] Bins* bins_of_slow(StreamId stream) noexcept {
    for (auto& bins : streams_)
      if (bins->stream == stream) return last_ = bins.get();
    return nullptr;
  }
  Bins& bins_for(StreamId stream) {
    if (last_ != nullptr && last_->stream == stream) return *last_;
    return bins_for_slow(stream);
  }
  [[gnu::noinline]] Bins& bins_for_slow(StreamId stream) {
    if (Bins* b = bins_of(stream)) return *b;
    // Streams stay sorted, so iteration is in stream order.
    auto at = streams_.begin();
    while (at != streams_.end() && (*at)->stream < stream) ++at;
    at = streams_.insert(at, std::make_unique<Bins>(stream));
    return *(last_ = at->get());
  }

  std::vector<std::unique_ptr<Bins>> streams_;  // by stream, ascending
  Bins* last_ = nullptr;                        // the stream used last (most programs use one)
  std::size_t size_ = 0;
  // Changed only by the one writer that holds the index's lock; atomic so that bytes() may be
  // read without that lock. A relaxed load and store, not a read-modify-write: plain moves.
  std::atomic<std::size_t> bytes_{0};
  void add_bytes(std::size_t plus, std::size_t minus) noexcept {
    bytes_.store(bytes_.load(std::memory_order_relaxed) + plus - minus, std::memory_order_relaxed);
  }
};

inline bool FreeIndex::check_order() const noexcept {
  std::size_t count = 0, bytes = 0;
  const Bins* prev_bins = nullptr;
  for (const auto& bins : streams_) {
    if (prev_bins && !(prev_bins->stream < bins->stream)) return false;
    prev_bins = bins.get();
    std::size_t in_stream = 0;
    for (unsigned c = 0; c < SizeClasses::kClasses; ++c) {
      const ClassSet& set = bins->classes[c];
      const unsigned level = c / SizeClasses::kSubClasses, sub = c % SizeClasses::kSubClasses;
      const bool bit = (bins->class_bits[level] >> sub) & 1u;
      if (bit != !set.empty()) return false;
      if (!tree_sound(set)) return false;
      const Block* prev = nullptr;
      for (const Block& b : set) {
        if (b.stream != bins->stream || SizeClasses::of(b.size_bytes).index() != c || b.free_class != c) return false;
        if (prev && !ClassOrder{}(*prev, b)) return false;
        prev = &b;
        bytes += b.size_bytes;
        ++in_stream;
      }
    }
    for (unsigned l = 0; l < SizeClasses::kLevels; ++l)
      if (((bins->level_bits >> l) & 1u) != (bins->class_bits[l] != 0)) return false;
    if (in_stream != bins->blocks) return false;
    count += in_stream;
  }
  return count == size_ && bytes == this->bytes();
}

}  // namespace gpumem::alloc::detail
