#include "gpumem/ckpt/checkpoint.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <sstream>
#include <unordered_set>

#include "autocast_state.h"
#include "rng_state.h"

namespace gpumem::ckpt {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved tensors. Held by the autograd node (through a capsule
// in the context's saved_data), so it lives exactly as long as the graph can reach it.
struct CheckpointState final : torch::CustomClassHolder {
  CheckpointFn fn;
  CheckpointOptions options;
  std::size_t n_inputs = 0;
  std::size_t n_params = 0;
  std::size_t n_outputs = 0;
  detail::RngSnapshot rng;
  detail::AutocastState autocast;
};

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes() << " " << t.dtype() << " on " << t.device();
  return os.str();
}

// Walks the graph recomputed in backward from `roots` and fails on anything through which a
// gradient would leave it other than the declared leaves (detached inputs, params): a leaf
// requiring grad that was not passed (its AccumulateGrad is reached) or a node built before the
// recompute began (fn captured a tensor computed outside it).
void check_no_undeclared(const variable_list& roots,
                         const std::unordered_set<const c10::TensorImpl*>& declared,
                         std::uint64_t first_seq, std::uint64_t thread_id) {
  using torch::autograd::Node;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const at::Tensor& r : roots) {
    const auto edge = torch::autograd::impl::gradient_edge(r);
    if (edge.function && seen.insert(edge.function.get()).second) {
      stack.push_back(edge.function.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      TORCH_CHECK(declared.count(acc->variable.unsafeGetTensorImpl()) != 0,
                  "gpumem::checkpoint: fn used a tensor that requires grad (",
                  shape_of(acc->variable),
                  ") but was passed neither in inputs nor in params, so its gradient would be "
                  "lost. Pass it in params (for a module: module->parameters()).");
      continue;
    }
    TORCH_CHECK(node->thread_id() == thread_id && node->sequence_nr() >= first_seq,
                "gpumem::checkpoint: fn used a tensor that requires grad and was computed "
                "outside fn (by ",
                node->name(),
                "), so gradients through it would be lost. Pass that tensor in inputs.");
    for (const auto& next : node->next_edges()) {
      if (next.function && seen.insert(next.function.get()).second) {
        stack.push_back(next.function.get());
      }
    }
  }
}

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state,
                               at::TensorList inputs, at::TensorList params) {
    TensorList args(inputs.begin(), inputs.end());
    TensorList saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), params.begin(), params.end());
    state->autocast = detail::AutocastState::capture();
    if (state->options.preserve_rng_state) state->rng = detail::RngSnapshot::capture(saved);

    TensorList outputs;
    {
      detail::AutocastCacheOff no_cache;
      outputs = state->fn(args);
    }
    state->n_outputs = outputs.size();
    variable_list non_differentiable;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      TORCH_CHECK(outputs[k].defined(), "gpumem::checkpoint: fn returned an undefined tensor as "
                  "output ", k, "; return only defined tensors");
      if (!at::isFloatingType(outputs[k].scalar_type()) &&
          !at::isComplexType(outputs[k].scalar_type())) {
        non_differentiable.push_back(outputs[k]);
      }
    }
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
    ctx->save_for_backward(std::move(saved));
    ctx->set_materialize_grads(false);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data["state"].toCapsule());
    // Checks that no saved input was modified in place since forward.
    const variable_list saved = ctx->get_saved_variables();
    const std::size_t n_in = state->n_inputs, n_par = state->n_params;
    const bool create_graph = at::GradMode::is_enabled();

    TensorList detached(n_in);
    std::unordered_set<const c10::TensorImpl*> declared;
    for (std::size_t i = 0; i < n_in; ++i) {
      if (!saved[i].defined()) continue;
      detached[i] = saved[i].detach();
      if (saved[i].requires_grad()) {
        detached[i].requires_grad_(true);
        declared.insert(detached[i].unsafeGetTensorImpl());
      }
    }
    for (std::size_t j = 0; j < n_par; ++j) {
      if (saved[n_in + j].defined()) declared.insert(saved[n_in + j].unsafeGetTensorImpl());
    }

    TensorList outputs;
    std::uint64_t first_seq = 0, thread_id = 0;
    {
      std::optional<detail::RngFork> rng;
      if (state->options.preserve_rng_state) rng.emplace(state->rng);
      detail::AutocastStateGuard autocast(state->autocast);
      detail::AutocastCacheOff no_cache;
      at::AutoGradMode grad(true);
      first_seq = at::sequence_number::peek();
      thread_id = at::RecordFunction::currentThreadId();
      outputs = state->fn(detached);
    }
    TORCH_CHECK(outputs.size() == state->n_outputs,
                "gpumem::checkpoint: fn returned ", outputs.size(),
                " outputs when recomputed in backward but ", state->n_outputs,
                " in forward; fn must return the same outputs every time it runs");

    variable_list roots, root_grads;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (grad_outputs[k].defined() && outputs[k].requires_grad()) {
        roots.push_back(outputs[k]);
        root_grads.push_back(grad_outputs[k]);
      }
    }
    if (state->options.check_undeclared && !roots.empty()) {
      check_no_undeclared(roots, declared, first_seq, thread_id);
    }

    // One gradient per forward argument: the state (none), each input, each param. Leaves the
    // recompute never used have no gradient accumulator and get none.
    variable_list grads(1 + n_in + n_par);
    torch::autograd::edge_list leaf_edges;
    std::vector<std::size_t> slots;
    auto add_leaf = [&](const at::Tensor& leaf, std::size_t slot) {
      if (!leaf.defined() || !leaf.requires_grad()) return;
      if (auto acc = torch::autograd::impl::try_get_grad_accumulator(leaf)) {
        leaf_edges.emplace_back(std::move(acc), 0);
        slots.push_back(slot);
      }
    };
    for (std::size_t i = 0; i < n_in; ++i) {
      if (ctx->needs_input_grad(i)) add_leaf(detached[i], 1 + i);
    }
    for (std::size_t j = 0; j < n_par; ++j) {
      if (ctx->needs_input_grad(n_in + j)) add_leaf(saved[n_in + j], 1 + n_in + j);
    }
    if (roots.empty() || leaf_edges.empty()) return grads;

    // Run the engine on the graph's edges rather than on the recomputed outputs
    // (torch::autograd::grad would hold them): the outputs are then freed as soon as backward
    // has no use for them, as they would be without checkpointing.
    torch::autograd::edge_list root_edges;
    for (const at::Tensor& r : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(r));
    roots.clear();
    outputs.clear();
    variable_list computed = torch::autograd::Engine::get_default_engine().execute(
        root_edges, root_grads, /*keep_graph=*/create_graph, create_graph,
        /*accumulate_grad=*/false, leaf_edges);
    for (std::size_t k = 0; k < slots.size(); ++k) grads[slots[k]] = std::move(computed[k]);
    return grads;
  }
};

bool any_requires_grad(const TensorList& a, const TensorList& b) {
  for (const auto* list : {&a, &b}) {
    for (const at::Tensor& t : *list) {
      if (t.defined() && t.requires_grad()) return true;
    }
  }
  return false;
}

}  // namespace

TensorList checkpoint(CheckpointFn fn, const TensorList& inputs, const TensorList& params,
                      CheckpointOptions options) {
  TORCH_CHECK(static_cast<bool>(fn), "gpumem::checkpoint: fn is empty; pass a callable");
  if (!at::GradMode::is_enabled()) {
    // No graph would be built anyway (inference, or inside another checkpoint's forward).
    return fn(inputs);
  }
  if (!any_requires_grad(inputs, params)) {
    // Nothing declared needs a gradient, so there is nothing to recompute for. Run fn normally:
    // if fn reaches no tensor requiring grad this records nothing; if its outputs require grad
    // anyway, fn uses tensors that were not declared, and checkpointing it would lose their
    // gradients.
    TensorList outputs = fn(inputs);
    for (const at::Tensor& out : outputs) {
      TORCH_CHECK(!out.defined() || !out.requires_grad(),
                  "gpumem::checkpoint: no input or param requires grad, yet fn's output does: fn "
                  "uses tensors requiring grad (module parameters?) that were not passed. Pass "
                  "them in params (for a module: module->parameters()) so their gradients flow.");
    }
    return outputs;
  }
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = std::move(fn);
  state->options = options;
  state->n_inputs = inputs.size();
  state->n_params = params.size();
  return CheckpointFunction::apply(std::move(state), at::TensorList(inputs),
                                   at::TensorList(params));
}

at::Tensor checkpoint(CheckpointFn1 fn, const at::Tensor& input, const TensorList& params,
                      CheckpointOptions options) {
  TORCH_CHECK(static_cast<bool>(fn), "gpumem::checkpoint: fn is empty; pass a callable");
  TensorList out = checkpoint(
      [fn = std::move(fn)](const TensorList& in) { return TensorList{fn(in[0])}; }, {input},
      params, options);
  return out[0];
}

}  // namespace gpumem::ckpt
