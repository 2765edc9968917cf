// ShardedTrainerOptions: how a ShardedTrainer shards, computes and updates. One immutable value,
// validated once by the trainer's constructor (std::invalid_argument naming the field and fix).
//
// Stages (Rajbhandari et al., "ZeRO", SC'20):
//   0  plain data parallel: every rank holds everything; gradients all-reduced (the baseline).
//   1  optimizer state (fp32 master weights, Adam moments) sharded across ranks; gradients
//      all-reduced in full; each rank updates its shard; compute parameters all-gathered.
//   2  stage 1 + gradients reduce-scattered, bucket by bucket, while backward still runs; only
//      each rank's gradient shard is kept.
//   3  stage 2 + compute parameters sharded: a unit's parameters are all-gathered before its
//      forward and its backward and freed after use (reshard_after_forward), the next unit's
//      gather prefetched (on a side stream on CUDA).
//
// Parameters with requires_grad() false are frozen: not sharded, not reduced, not updated; each
// rank keeps them whole, in compute_dtype (so the model's forward sees one dtype).
//
// Mixed precision as in the paper: forward and backward in compute_dtype (bf16 by default),
// gradients reduced in compute_dtype, fp32 master weights and fp32 Adam moments. compute_dtype
// fp32 gives exact single-precision training (tests use it to compare with torch::optim::AdamW).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gpumem::zero {

// Decoupled weight decay Adam (Loshchilov & Hutter), the update torch::optim::AdamW makes.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// A parameter group: the parameters `match` selects train with their own learning rate and
// weight decay (torch.optim's param_groups; the usual use is no weight decay for biases and
// norms). Groups are tried in order and the first match wins; parameters no group matches use
// ShardedTrainerOptions::adamw. Betas and eps are the same for every group.
struct ParamGroup {
  std::string name;  // shown in errors and describe_units()
  // name: the parameter's name in the model's named_parameters(); param: the parameter.
  std::function<bool(const std::string& name, const at::Tensor& param)> match;
  std::optional<double> lr;            // unset: adamw.lr
  std::optional<double> weight_decay;  // unset: adamw.weight_decay
};

// The common rule (GPT-2, nanoGPT, Hugging Face's Trainer): parameters with fewer than two
// dimensions (biases, norm scales and shifts) get no weight decay.
inline ParamGroup no_weight_decay_below_2d() {
  ParamGroup g;
  g.name = "no weight decay (dim < 2)";
  g.match = [](const std::string&, const at::Tensor& p) { return p.dim() < 2; };
  g.weight_decay = 0.0;
  return g;
}

struct ShardedTrainerOptions {
  int stage = 2;
  // kBFloat16 or kFloat. (kHalf is refused: fp16 needs loss scaling, which is not done here.)
  c10::ScalarType compute_dtype = c10::kBFloat16;
  AdamWOptions adamw;
  // Per-parameter-group learning rate and weight decay (see ParamGroup); empty: adamw for all.
  std::vector<ParamGroup> param_groups;
  // Clip the global gradient norm to this value before the update (0 = no clipping); the same
  // rule as torch::nn::utils::clip_grad_norm_.
  double max_grad_norm = 0.0;
  // Stages 0-2: parameters are grouped into buckets of about this many compute-precision bytes,
  // in reverse registration order (the order backward produces gradients); each bucket's
  // gradients are reduced as soon as all of them are ready.
  std::int64_t bucket_size_bytes = std::int64_t{25} << 20;
  // How many gradient reductions may be in flight before backward waits for the oldest one
  // (bounds the memory of gradient buckets waiting to be reduced).
  int max_inflight_reductions = 2;
  // Stage 3: free a unit's gathered parameters right after its forward (gather again before its
  // backward). false keeps them from forward until the unit's backward is done: less traffic,
  // more memory.
  bool reshard_after_forward = true;
  // Stage 3: start gathering the next unit's parameters (in the order recorded by the previous
  // step) before the current unit runs; on CUDA on a side stream, so it overlaps compute.
  bool prefetch = true;
  // Broadcast rank 0's initial parameters to every rank at construction, so ranks that seeded
  // differently still start from the same model.
  bool broadcast_initial_params = true;
};

}  // namespace gpumem::zero
