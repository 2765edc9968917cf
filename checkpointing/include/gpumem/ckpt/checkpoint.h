// gpumem::checkpoint: activation checkpointing for libtorch's C++ frontend (what Python has as
// torch.utils.checkpoint), as a custom autograd Function.
//
// checkpoint(fn, inputs, params) runs fn(inputs) without building an autograd graph and keeps
// only `inputs` (and `params`, which are alive anyway). When backward reaches its outputs it runs
// fn again on the same inputs with grad enabled, backpropagates through that recompute, and
// returns the gradients of inputs and params to the autograd engine, which accumulates them as
// usual (hooks and torch::autograd::grad see them too).
//
// What the recompute reproduces: the random generators' states (the CPU generator, and the
// CUDA generator of every device an input or parameter lives on), so dropout draws the same
// masks; the autocast state of the forward call (enabled and dtype per device). Autocast's
// weight-cast cache is off inside fn (Note [Autocast cache and checkpoints] in
// src/torch/autocast_state.h).
//
// Gradients are never dropped silently:
//   - Pass every tensor fn uses that requires grad and is not an input in `params` (for a
//     module: module->parameters()). They are inputs of the autograd node, so gradients flow to
//     them even when no input requires grad (the first layer of a model taking token ids).
//   - With grad enabled and nothing in inputs or params requiring grad, fn runs once normally;
//     if its outputs then require grad anyway, fn reached an undeclared tensor: error.
//   - In backward, the recomputed graph is walked; a leaf requiring grad that was not passed,
//     or a tensor computed outside fn that requires grad, is an error naming it
//     (CheckpointOptions::check_undeclared turns this walk off).
//
// Nesting works: inside a checkpoint's forward grad is disabled, so inner checkpoints just run
// fn; in the outer recompute they checkpoint for real and recompute again in their backward.
// fn must be deterministic in structure (same number of outputs every call) and must not modify
// its inputs in place (the saved inputs are checked, as every saved tensor is).
//
// Thread-safety: as any autograd function; fn may be called on the backward thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace gpumem::ckpt {

using TensorList = std::vector<at::Tensor>;
using CheckpointFn = std::function<TensorList(const TensorList&)>;
using CheckpointFn1 = std::function<at::Tensor(const at::Tensor&)>;

struct CheckpointOptions {
  bool preserve_rng_state = true;  // restore generator states for the recompute
  bool check_undeclared = true;    // walk the recomputed graph for undeclared grad tensors
};

// Runs fn(inputs) now without a graph and again in backward. Outputs that are not floating
// point are non-differentiable. Throws c10::Error for misuse (messages name the fix).
TensorList checkpoint(CheckpointFn fn, const TensorList& inputs, const TensorList& params = {},
                      CheckpointOptions options = {});

// One tensor in, one tensor out.
at::Tensor checkpoint(CheckpointFn1 fn, const at::Tensor& input, const TensorList& params = {},
                      CheckpointOptions options = {});

}  // namespace gpumem::ckpt

namespace gpumem {
using ckpt::checkpoint;
}  // namespace gpumem
