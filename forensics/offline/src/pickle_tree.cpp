#include "pickle_tree.h"

#include <algorithm>
#include <cstring>

namespace gpumem::forensics::detail {
namespace {

// Container marks during adopt: 0 = not reached, kOpen = on the walk's current path, else the
// height of its tree (1 = holds no container).
constexpr std::uint32_t kOpen = 0xffffffffu;

}  // namespace

PickleTree::Shape PickleTree::adopt(const PickleValue& root, std::vector<PickleValue>& created, int max_depth) {
  using Container = PickleValue::Container;
  auto container_of = [](const PickleValue& v) -> Container* {
    const auto* p = std::get_if<std::shared_ptr<Container>>(&v.data_);
    return p ? p->get() : nullptr;
  };
  // One step of the walk: a container, the next of its slots to look at (items, then dict keys
  // and values alternately), and the tallest child seen so far.
  struct Step {
    Container* c;
    std::size_t next = 0;
    std::uint32_t child_height = 0;
  };
  auto slot = [](Container* c, std::size_t i) -> const PickleValue* {
    if (i < c->items.size()) return &c->items[i];
    i -= c->items.size();
    if (i / 2 < c->dict.size()) return i % 2 == 0 ? &c->dict[i / 2].first : &c->dict[i / 2].second;
    return nullptr;
  };

  Shape shape = Shape::ok;
  std::vector<Step> path;
  if (Container* r = container_of(root)) {
    r->mark = kOpen;
    path.push_back({r});
  }
  while (!path.empty() && shape == Shape::ok) {
    Step& top = path.back();
    const PickleValue* v = slot(top.c, top.next);
    if (!v) {  // every slot seen: the container's height is known
      const std::uint32_t height = top.child_height + 1;
      top.c->mark = height;
      path.pop_back();
      if (!path.empty()) path.back().child_height = std::max(path.back().child_height, height);
      continue;
    }
    ++top.next;
    Container* child = container_of(*v);
    if (!child) continue;
    if (child->mark == kOpen) {
      shape = Shape::cycle;
    } else if (child->mark != 0) {  // shared, already walked
      top.child_height = std::max(top.child_height, child->mark);
      if (path.size() + child->mark > static_cast<std::size_t>(max_depth)) shape = Shape::too_deep;
    } else if (path.size() >= static_cast<std::size_t>(max_depth)) {
      shape = Shape::too_deep;
    } else {
      child->mark = kOpen;
      path.push_back({child});
    }
  }

  for (auto& v : created) {
    Container* c = container_of(v);
    if (!c) continue;
    if (shape != Shape::ok || c->mark == 0) v.clear_items();
  }
  created.clear();
  return shape;
}

std::string DictKeys::index_key(const PickleValue& key) {
  if (key.is_int()) {
    const std::int64_t v = key.as_int();
    std::string k(1 + sizeof v, 'i');
    std::memcpy(k.data() + 1, &v, sizeof v);
    return k;
  }
  return "s" + key.as_string();
}

void DictKeys::set(PickleDictItems& dict, PickleValue key, PickleValue value, DictKeys* index) {
  if (comparable(key)) {
    if (!index) {
      for (auto& [k, v] : dict) {
        if (k.kind() == key.kind() && (key.is_int() ? k.as_int() == key.as_int() : k.as_string() == key.as_string())) {
          v = std::move(value);
          return;
        }
      }
    } else {
      for (; index->indexed_ < dict.size(); ++index->indexed_) {
        const PickleValue& k = dict[index->indexed_].first;
        if (comparable(k)) index->positions_.emplace(index_key(k), index->indexed_);
      }
      const auto [it, inserted] = index->positions_.emplace(index_key(key), dict.size());
      if (!inserted) {
        dict[it->second].second = std::move(value);
        return;
      }
      ++index->indexed_;
    }
  }
  dict.emplace_back(std::move(key), std::move(value));
}

}  // namespace gpumem::forensics::detail
