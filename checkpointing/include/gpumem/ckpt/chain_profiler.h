// profile_chain: the profiling step of the planner. Runs training steps of a
// CheckpointedSequential without checkpointing and measures, per module, what chain_profile.h
// describes: the bytes it keeps for backward, its output, its forward and backward peaks and
// times, and what is allocated when its backward starts. Bytes come from a MemoryProbe
// (allocator events or allocator stats), never from tensor sizes, except output_bytes, which is
// the output's storage size.
//
// The step it models: on_step_begin(); loss = loss_fn(chain(input)); loss.backward(), with the chain's parameter
// gradients undefined when it starts (zero_grad(set_to_none)) and the chain's output not held
// by the caller during backward. Backward boundaries come from gradient hooks on each module's
// output; the chain input is not hooked (the last module's backward ends when backward()
// returns). Per-module times synchronize the device (MemoryProbe::synchronize) around each
// phase; fwd_bwd_ns comes from separate steps that only synchronize at their ends.
//
// One more instrumented step keeps each module's incoming gradient alive to the end of its
// backward, for bwd_peak_held_bytes.
//
// Side effects: runs warmup_steps + instrumented_steps + 1 + timed_steps steps (random
// generators advance); leaves the chain's parameter gradients undefined; does not touch any
// optimizer. The chain's current plan is ignored and kept.
//
// Thread-safety: one profile at a time per chain and probe.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "gpumem/ckpt/chain_profile.h"
#include "gpumem/ckpt/checkpointed_sequential.h"
#include "gpumem/ckpt/memory_probe.h"

namespace gpumem::ckpt {

struct ProfileOptions {
  int warmup_steps = 1;        // plain steps first (lazy allocations, allocator caches)
  int instrumented_steps = 2;  // per-module steps: times are medians, bytes from the last one
  int timed_steps = 3;         // plain steps for fwd_bwd_ns (median)
  // Called at the start of every step, before the chain's forward (to enter an autocast
  // region, for example; loss_fn can leave it).
  std::function<void()> on_step_begin;
};

using LossFn = std::function<at::Tensor(const at::Tensor& chain_output)>;

ChainProfile profile_chain(CheckpointedSequentialImpl& chain, const at::Tensor& input,
                           const LossFn& loss_fn, MemoryProbe& probe, ProfileOptions options = {});

}  // namespace gpumem::ckpt
