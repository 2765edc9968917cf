#include "gpumem/forensics/op_attribution.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

namespace gpumem::forensics {
namespace {

// name pointer -> id, per thread: a direct-mapped cache, each hit confirmed by content.
class NameCache {
 public:
  std::uint32_t id_of(const char* name) {
    Entry& e = entries_[(reinterpret_cast<std::uintptr_t>(name) >> 3) % kEntries];
    // One pass over the name (a std::string == const char* would measure it first, then compare).
    if (e.pointer == name && std::strcmp(e.text.c_str(), name) == 0) return e.id;
    e.pointer = name;
    e.text = name;
    e.id = OpRegistry::global().intern(e.text);
    return e.id;
  }

 private:
  static constexpr std::size_t kEntries = 512;
  struct Entry {
    const char* pointer = nullptr;
    std::string text;
    std::uint32_t id = 0;
  };
  Entry entries_[kEntries];
};

thread_local NameCache t_names;

// An entry is an id, or a name not interned yet (id 0, name set).
struct Stack {
  struct Entry {
    const char* name;
    std::uint32_t id;
  };
  Entry entries[OpStack::kMaxDepth];
  std::size_t depth = 0;

  void push(const char* name, std::uint32_t id) noexcept {
    if (depth < OpStack::kMaxDepth) entries[depth] = Entry{name, id};
    ++depth;
  }
  void pop() noexcept {
    if (depth > 0) --depth;
  }
  std::uint32_t top() noexcept {
    if (depth == 0) return 0;
    Entry& e = entries[(depth < OpStack::kMaxDepth ? depth : OpStack::kMaxDepth) - 1];
    if (e.id == 0 && e.name != nullptr && e.name[0] != '\0') {
      e.id = t_names.id_of(e.name);
      e.name = nullptr;
    }
    return e.id;
  }
};

thread_local Stack t_ops;
thread_local Stack t_scopes;

}  // namespace

struct OpRegistry::Impl {
  mutable std::shared_mutex mutex;
  std::deque<std::string> names{""};  // id 0 = none
  std::unordered_map<std::string_view, std::uint32_t> index;  // views into `names` (stable in a deque)
};

OpRegistry::OpRegistry() : impl_(new Impl) {}
OpRegistry::~OpRegistry() { delete impl_; }

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = new OpRegistry;  // never destroyed: threads may intern at exit
  return *registry;
}

std::uint32_t OpRegistry::intern(std::string_view name) {
  if (name.empty()) return 0;
  {
    std::shared_lock lock(impl_->mutex);
    auto it = impl_->index.find(name);
    if (it != impl_->index.end()) return it->second;
  }
  std::unique_lock lock(impl_->mutex);
  auto it = impl_->index.find(name);
  if (it != impl_->index.end()) return it->second;
  impl_->names.emplace_back(name);
  const auto id = static_cast<std::uint32_t>(impl_->names.size() - 1);
  impl_->index.emplace(impl_->names.back(), id);
  return id;
}

std::string OpRegistry::name(std::uint32_t id) const {
  std::shared_lock lock(impl_->mutex);
  return id < impl_->names.size() ? impl_->names[id] : std::string();
}

std::size_t OpRegistry::size() const {
  std::shared_lock lock(impl_->mutex);
  return impl_->names.size() - 1;
}

void OpStack::push_op(std::uint32_t id) noexcept { t_ops.push(nullptr, id); }
void OpStack::pop_op() noexcept { t_ops.pop(); }
void OpStack::push_scope(std::uint32_t id) noexcept { t_scopes.push(nullptr, id); }
void OpStack::pop_scope() noexcept { t_scopes.pop(); }
void OpStack::push_op_name(const char* name) noexcept { t_ops.push(name, 0); }
void OpStack::push_scope_name(const char* name) noexcept { t_scopes.push(name, 0); }
std::uint32_t OpStack::current_op() noexcept { return t_ops.top(); }
std::uint32_t OpStack::current_scope() noexcept { return t_scopes.top(); }
std::size_t OpStack::op_depth() noexcept { return t_ops.depth; }

namespace {
std::atomic<bool> g_switched_on{false};
}  // namespace
bool OpStack::switched_on() noexcept { return g_switched_on.load(std::memory_order_relaxed); }
void OpStack::set_switched_on(bool on) noexcept { g_switched_on.store(on, std::memory_order_relaxed); }

ScopedOp::ScopedOp(std::string_view name, bool user_scope) : user_scope_(user_scope) {
  const std::uint32_t id = OpRegistry::global().intern(name);
  user_scope_ ? OpStack::push_scope(id) : OpStack::push_op(id);
}

ScopedOp::~ScopedOp() { user_scope_ ? OpStack::pop_scope() : OpStack::pop_op(); }

}  // namespace gpumem::forensics
