// ShardedTrainer: ZeRO stages 0-3 for a libtorch module, over any c10d Backend.
//
// Every rank builds the same model, wraps it in a ShardedTrainer with the same options and
// calls, per step:
//
//     auto loss = compute_loss(model, local_batch);   // local batch = global batch / world size
//     trainer.backward(loss);                          // gradients reduced across ranks
//     trainer.step();                                  // AdamW on this rank's shard
//
// What it holds (Ψ parameters, N ranks, c = bytes of compute_dtype; see model_state_bytes.h):
//
//   stage  compute params   gradients        fp32 master + Adam moments
//   0      full, c Ψ        full, c Ψ        full, 12 Ψ
//   1      full             full             shard, 12 Ψ / N
//   2      full             shard, c Ψ / N   shard
//   3      shard, c Ψ / N   shard            shard
//
// Layout. Parameters are grouped into units, each a flat buffer padded to a multiple of N; rank
// r owns elements [r·S, (r+1)·S) of every unit (S = padded / N) and its shards of all units lie
// one after another in its flat master, moment, gradient and (stage 3) parameter buffers. Units
// are size-bounded buckets in stages 0-2 (reverse registration order, the order backward
// produces gradients) and, in stage 3, the modules passed as `units` plus a root unit of the
// parameters no unit owns. Every module parameter becomes a view into its unit's compute-dtype
// buffer (Tensor::set_data), so the model's own forward code runs unchanged on it.
//
// Gradients. Post-accumulate-grad hooks count each unit's ready gradients; a unit whose
// gradients are all ready is reduced at once while backward continues (all-reduce AVG in
// stages 0-1 on the full gradient buffer the parameters' .grad views point into; in stages 2-3
// the gradients are copied into a bucket, reduce-scattered with AVG into the rank's gradient
// shard, and the bucket freed). Reductions start in a fixed unit order so every rank issues the
// same collectives in the same sequence; at most max_inflight_reductions are outstanding.
//
// Gradient accumulation. backward() may be called several times before step() (micro-batches):
// the gradients add up, as .grad does over several loss.backward() calls in plain PyTorch (scale
// each loss by 1/k for a mean). Every backward() reduces its gradients across ranks; from the
// second one of a step on, the reduced shard is added to an fp32 accumulator of the rank's shard
// size (4 Ψ / N bytes, allocated the first time a step has two backward() calls and kept).
//
// Frozen parameters (requires_grad false) are not sharded, reduced or updated: each rank keeps
// them whole, converted to compute_dtype, with rank 0's values. They are outside every unit, so
// stage 3 never frees them, and outside the model-state counts (which are about trained state).
// Changing requires_grad after construction is refused at the next backward().
//
// Parameter groups (options.param_groups): per-group learning rate and weight decay. Inside
// each unit parameters are laid out group by group, so the optimizer's work per group is a few
// runs per unit.
//
// Stage 3. The model's forward must run each unit through gpumem::zero::call(unit, args...)
// (unit_call.h): it gathers the unit's parameters (waiting for a prefetch if one is in flight),
// prefetches the next unit, runs forward, hooks the outputs so the unit is gathered again before
// its backward, and frees the gathered buffer after forward when reshard_after_forward. Freeing
// keeps the buffer's StorageImpl and only drops its memory, so tensors autograd saved in
// forward see the re-gathered values in backward. The root unit stays gathered. A unit's
// parameters may be used only inside its own call() (no weight tying across units): outside it
// their memory may be freed.
//
// Errors. A bad option or model (non-floating trainable parameters, nothing to train, mixed
// devices, overlapping or foreign units, stage-3 units missing, a param group without a
// predicate) is one std::invalid_argument at construction. Misuse (step() without backward(),
// loss.backward() instead of trainer.backward(), requires_grad changed after construction) is
// std::logic_error. A failure in
// the middle of backward() or step() (a collective failing because another rank died, a
// timeout) propagates and leaves the trainer broken: every later call throws, naming the
// original failure.
//
// Thread-safety: one thread drives a trainer; its autograd hooks run while that thread is inside
// backward(). Different trainers (one per rank, e.g. in tests) may run in different threads.
#pragma once

#include "gpumem/zero/model_state_bytes.h"
#include "gpumem/zero/sharded_trainer_options.h"

#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gpumem::zero {

namespace detail {
class TrainerCore;
}

class ShardedTrainer {
 public:
  // Collective: every rank constructs its trainer with the same model structure and options
  // (rank 0's initial parameters are broadcast unless options.broadcast_initial_params is off).
  // The model must already be on its device; parameters that do not require grad are frozen.
  ShardedTrainer(std::shared_ptr<torch::nn::Module> model, c10::intrusive_ptr<c10d::Backend> comm,
                 ShardedTrainerOptions options = {},
                 std::vector<std::shared_ptr<torch::nn::Module>> units = {});
  ~ShardedTrainer();
  ShardedTrainer(const ShardedTrainer&) = delete;
  ShardedTrainer& operator=(const ShardedTrainer&) = delete;

  // Collective. Runs loss.backward() and completes the gradient reduction. Called once or more
  // per step: the gradients of several calls add up (gradient accumulation).
  void backward(const at::Tensor& loss);
  // Collective. Clips (if asked), updates this rank's shard with AdamW and refreshes the
  // compute parameters (all-gather in stages 1-2; the bf16 shard in stage 3).
  void step();

  // Full fp32 master parameters, gathered from every rank's shard, in the model's
  // named_parameters() order; frozen parameters as they are (in fp32). Collective.
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters();

  // Model-state bytes this rank holds now, measured from the storages of the tensors it keeps
  // (each storage counted once): the compute parameters (full buffers and shards), gradients
  // (full buffers, shards, the accumulator and any .grad left on a parameter), master weights
  // and moments. Frozen parameters are not model state here.
  ModelStateBytes model_state_bytes() const;
  // The highest model_state_bytes().total seen at the trainer's measurement points (after
  // construction, after each backward() and each step()), by kind at that moment.
  ModelStateBytes peak_model_state_bytes() const;
  // The paper's formula for this trainer's stage, Ψ, N and compute dtype.
  ModelStateBytes expected_model_state_bytes() const;
  // High-water mark of memory held only during a step: gradient buckets awaiting reduction and
  // their shard-sized results, and stage-3 gathered parameters of non-root units.
  double transient_peak_bytes() const;

  int stage() const;
  int rank() const;
  int world_size() const;
  at::Device device() const;
  c10::ScalarType compute_dtype() const;
  std::int64_t num_params() const;  // Ψ, without padding
  std::int64_t step_count() const;
  int num_units() const;
  // One line per unit: name, parameters, padded size, and (stage 3) its module.
  std::string describe_units() const;

 private:
  std::shared_ptr<detail::TrainerCore> core_;
};

}  // namespace gpumem::zero
