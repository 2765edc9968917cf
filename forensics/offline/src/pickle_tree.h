// PickleTree: what the readers do to a PickleValue tree they build before handing it out. Internal
// to gpumem::forensics.
//
//   adopt      the pickle machine can build any graph (its memo lets a container hold itself, and
//              APPEND chains nest without limit). adopt walks the tree under the root without
//              recursion, refuses a cycle or nesting deeper than a bound, and takes apart every
//              container the reader created that the root does not reach (a damaged file may
//              leave cycles among them, which reference counting alone would never free).
//   DictKeys   Python's dict semantics for readers that add items one at a time: a key already
//              present (a str or an int, compared by value) keeps its place and takes the new
//              value. Small dicts are searched; large ones get a hash index, so a hostile dict of
//              millions of keys is read in linear time.
//
// Thread-safety: adopt writes marks into the containers it walks: call it on a tree no other
// thread sees yet. DictKeys is a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem/forensics/pickle_value.h"

namespace gpumem::forensics::detail {

struct PickleTree {
  enum class Shape { ok, cycle, too_deep };

  // Checks the tree under root (acyclic, at most max_depth containers deep), then releases the
  // items of every container in `created` that the root does not reach, or of all of them when
  // the shape is not ok. `created` is emptied.
  static Shape adopt(const PickleValue& root, std::vector<PickleValue>& created, int max_depth);
};

class DictKeys {
 public:
  static constexpr std::size_t kIndexFrom = 32;  // dicts of this many items want an index

  // Sets dict[key] = value with Python's semantics (see above). `index` is the dict's own
  // DictKeys, needed once the dict has kIndexFrom items (null before: a search is faster).
  static void set(PickleDictItems& dict, PickleValue key, PickleValue value, DictKeys* index);

 private:
  static bool comparable(const PickleValue& key) noexcept { return key.is_string() || key.is_int(); }
  static std::string index_key(const PickleValue& key);
  std::unordered_map<std::string, std::size_t> positions_;  // index_key -> position in the dict
  std::size_t indexed_ = 0;                                 // items of the dict already indexed
};

}  // namespace gpumem::forensics::detail

namespace gpumem::forensics {

// A container's items. Destroying a deep tree recursively (each container's destructor running
// its items' destructors) would use stack in proportion to the depth; instead the destructor moves
// the child containers it holds the last reference to onto a work list and empties them one at a
// time, so no destructor runs inside another one's items (except, when two threads drop the last two
// references to one container at once, that container's own destructor: iterative too).
struct PickleValue::Container {
  PickleItems items;       // list, tuple, set
  PickleDictItems dict;    // dict
  std::uint32_t mark = 0;  // PickleTree::adopt's walk state

  Container() = default;
  Container(const Container&) = delete;
  Container& operator=(const Container&) = delete;
  ~Container() {
    std::vector<std::shared_ptr<Container>> work;
    take_children(work);
    while (!work.empty()) {
      std::shared_ptr<Container> c = std::move(work.back());
      work.pop_back();
      if (c.use_count() == 1) c->take_children(work);
    }  // c released here: it holds no container any more
  }

  void take_children(std::vector<std::shared_ptr<Container>>& work) noexcept {
    // Queues only the children this holds the last reference to; a reference to a child held
    // elsewhere too is dropped on the spot, which destroys nothing. So a dict that a pickle's memo
    // puts in a list ten million times is queued once (when its last reference is reached), not
    // ten million times, and a child held twice by this very container is queued at its second
    // reference instead of being destroyed, recursively, with the items.
    auto take = [&](PickleValue& v) {
      auto* p = std::get_if<std::shared_ptr<Container>>(&v.data_);
      if (!p) return;
      if (p->use_count() == 1) {
        work.push_back(std::move(*p));
      } else {
        p->reset();
      }
    };
    for (auto& v : items) take(v);
    for (auto& [k, v] : dict) {
      take(k);
      take(v);
    }
  }
};

}  // namespace gpumem::forensics
