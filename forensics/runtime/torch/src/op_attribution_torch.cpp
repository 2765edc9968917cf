// The only translation unit of gpumem's forensics that includes torch headers (gpumem_forensics_torch).
#include "gpumem/forensics/op_attribution_torch.h"

#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {
namespace {

std::mutex g_install_mutex;
std::atomic<bool> g_installed{false};
at::CallbackHandle g_handle = 0;

struct CachedName {
  std::uint32_t id = 0;
  std::string name;
};

// name pointer -> id, per thread. Op names (schema names) have stable pointers; user scope names
// may not, so a hit is confirmed by content.
std::uint32_t op_id(const char* name) {
  thread_local std::unordered_map<const char*, CachedName> cache;
  auto it = cache.find(name);
  if (it != cache.end() && it->second.name == name) return it->second.id;
  const std::uint32_t id = OpRegistry::global().intern(name);
  cache[name] = CachedName{id, name};
  return id;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const std::uint32_t id = op_id(fn.name());
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    OpStack::push_scope(id);
  } else {
    OpStack::push_op(id);
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* /*ctx*/) {
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    OpStack::pop_scope();
  } else {
    OpStack::pop_op();
  }
}

}  // namespace

bool install_record_function_attribution() {
  std::lock_guard lock(g_install_mutex);
  if (g_installed.load()) return true;
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_start, &on_end)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
  g_installed.store(true);
  return true;
}

void remove_record_function_attribution() {
  std::lock_guard lock(g_install_mutex);
  if (!g_installed.load()) return;
  at::removeCallback(g_handle);
  g_installed.store(false);
}

bool record_function_attribution_installed() noexcept { return g_installed.load(); }

}  // namespace gpumem::forensics
