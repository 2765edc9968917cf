// The only translation unit of gpumem's forensics that includes torch headers (gpumem_forensics_torch).
#include "gpumem/forensics/op_attribution_torch.h"

#include <ATen/record_function.h>

#include <atomic>
#include <mutex>

#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {
namespace {

std::mutex g_install_mutex;
std::atomic<bool> g_installed{false};  // registered with libtorch (g_handle valid)
std::atomic<bool> g_enabled{false};    // registered and not disabled by set_record_function_attribution
at::CallbackHandle g_handle = 0;

// The callbacks run around every op once installed, and most ops allocate nothing: push the
// name's pointer (valid until the op ends) and leave interning to the first event that asks
// (OpStack::current_op). No inputs, outputs or ids are requested, so RecordFunction gathers none.
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    OpStack::push_scope_name(fn.name());
  } else {
    OpStack::push_op_name(fn.name());
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

// Registers the callbacks with libtorch, or re-enables them. Under g_install_mutex.
void enable_locked() {
  if (g_enabled.load()) return;
  if (g_installed.load()) {
    at::reenableCallback(g_handle);
  } else {
    g_handle = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_start, &on_end)
            .needsInputs(false)
            .needsOutputs(false)
            .needsIds(false)
            // Not BACKWARD_FUNCTION: an autograd node allocates through the aten ops it calls, whose
            // FUNCTION records are innermost, so the node's own record would never name an event,
            // and each one costs libtorch a demangled node name (Node::name()) per call.
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
    g_installed.store(true);
  }
  g_enabled.store(true);
  OpStack::set_switched_on(true);
}

}  // namespace

bool install_record_function_attribution() {
  std::lock_guard lock(g_install_mutex);
  enable_locked();
  return true;
}

bool set_record_function_attribution(bool enabled) {
  std::lock_guard lock(g_install_mutex);
  const bool was = g_enabled.load();
  if (enabled) {
    enable_locked();
  } else if (was) {
    // Disabled, not removed: libtorch keeps its global callbacks in a versioned list that each
    // thread re-reads when the version changes, so disabling is safe while other threads run ops,
    // and an op that started with the callback still runs its end (every push is popped).
    at::disableCallback(g_handle);
    g_enabled.store(false);
    OpStack::set_switched_on(false);
  }
  return was;
}

void remove_record_function_attribution() {
  std::lock_guard lock(g_install_mutex);
  if (!g_installed.load()) return;
  at::removeCallback(g_handle);
  g_installed.store(false);
  g_enabled.store(false);
  OpStack::set_switched_on(false);
}

bool record_function_attribution_installed() noexcept { return g_enabled.load(); }

}  // namespace gpumem::forensics
