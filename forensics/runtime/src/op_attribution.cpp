#include "gpumem/forensics/op_attribution.h"

#include <deque>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace gpumem::forensics {
namespace {

struct Stack {
  std::uint32_t ids[OpStack::kMaxDepth];
  std::size_t depth = 0;

  void push(std::uint32_t id) noexcept {
    if (depth < OpStack::kMaxDepth) ids[depth] = id;
    ++depth;
  }
  void pop() noexcept {
    if (depth > 0) --depth;
  }
  std::uint32_t top() const noexcept {
    if (depth == 0) return 0;
    return ids[(depth < OpStack::kMaxDepth ? depth : OpStack::kMaxDepth) - 1];
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

void OpStack::push_op(std::uint32_t id) noexcept { t_ops.push(id); }
void OpStack::pop_op() noexcept { t_ops.pop(); }
void OpStack::push_scope(std::uint32_t id) noexcept { t_scopes.push(id); }
void OpStack::pop_scope() noexcept { t_scopes.pop(); }
std::uint32_t OpStack::current_op() noexcept { return t_ops.top(); }
std::uint32_t OpStack::current_scope() noexcept { return t_scopes.top(); }
std::size_t OpStack::op_depth() noexcept { return t_ops.depth; }

ScopedOp::ScopedOp(std::string_view name, bool user_scope) : user_scope_(user_scope) {
  const std::uint32_t id = OpRegistry::global().intern(name);
  user_scope_ ? OpStack::push_scope(id) : OpStack::push_op(id);
}

ScopedOp::~ScopedOp() { user_scope_ ? OpStack::pop_scope() : OpStack::pop_op(); }

}  // namespace gpumem::forensics
