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
// Mixed precision as in the paper: forward and backward in compute_dtype (bf16 by default),
// gradients reduced in compute_dtype, fp32 master weights and fp32 Adam moments. compute_dtype
// fp32 gives exact single-precision training (tests use it to compare with torch::optim::AdamW).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace gpumem::zero {

// Decoupled weight decay Adam (Loshchilov & Hutter), the update torch::optim::AdamW makes.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

struct ShardedTrainerOptions {
  int stage = 2;
  // kBFloat16 or kFloat. (kHalf is refused: fp16 needs loss scaling, which is not done here.)
  c10::ScalarType compute_dtype = c10::kBFloat16;
  AdamWOptions adamw;
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
