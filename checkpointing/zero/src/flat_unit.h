// FlatUnit: a group of parameters laid out in one flat buffer and sharded evenly over ranks.
//
// Layout: parameter i occupies [offset_i, offset_i + numel_i) of the unit's buffer, in the order
// they were added; the buffer is padded with zeros to padded_numel, a multiple of shard_count,
// and shard k (k = 0..shard_count-1) is [k·shard_numel, (k+1)·shard_numel). shard_offset is
// where this unit's shard starts inside the rank's flat shard buffers (master weights, moments,
// gradient shard, stage-3 parameter shard).
//
// Invariants: sum(numel_i) == numel <= padded_numel == shard_count·shard_numel and
// padded_numel - numel < shard_count; offsets are increasing and disjoint; every parameter is a
// view of full_params at its offset (same StorageImpl). full_params's storage has
// padded_numel·itemsize bytes exactly when state != kSharded (stage-3 units free it between
// uses; other units never do). pending_grads == number of parameters whose grad_ready is false.
//
// Thread-safety: none; owned by one TrainerCore.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace gpumem::zero::detail {

struct ParamSlot {
  at::Tensor param;  // the module's parameter itself (same TensorImpl as the module's member)
  std::string name;  // its name in the model's named_parameters()
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  // in the unit's flat buffer
  std::int64_t numel = 0;
  int group = 0;  // 0: ShardedTrainerOptions::adamw; g > 0: param_groups[g - 1]
  bool grad_ready = false;
};

enum class GatherState { kSharded, kGathering, kGathered };

struct FlatUnit {
  std::string name;
  const torch::nn::Module* module = nullptr;  // a stage-3 unit's module; null for buckets, root
  std::vector<ParamSlot> params;
  std::int64_t numel = 0;
  std::int64_t padded_numel = 0;
  std::int64_t shard_numel = 0;
  std::int64_t shard_offset = 0;
  int shard_count = 1;
  bool persistent_full = true;  // full compute parameters kept between steps

  at::Tensor full_params;   // [padded_numel], compute dtype
  at::Tensor full_grads;    // stages 0-1: [padded_numel], the parameters' .grad are views of it
  at::Tensor grad_staging;  // stages 2-3: gradients waiting for their reduce-scatter

  GatherState state = GatherState::kGathered;
  c10::intrusive_ptr<c10d::Work> gather_work;  // while kGathering
  bool gathered_on_side_stream = false;

  int pending_grads = 0;

  // Appends a parameter at the end of the buffer (before finalize()).
  void add(const at::Tensor& param, std::string param_name, int group = 0);
  // Pads to a multiple of shard_count; sets shard_numel. Call once, after the last add().
  void finalize(int count);
  // [k·shard_numel, (k+1)·shard_numel) of a padded_numel-long tensor.
  at::Tensor shard_of(const at::Tensor& flat, int k) const;
  void check_invariants() const;
};

// Gives `t`'s storage nbytes bytes of fresh memory from its own allocator, keeping the
// StorageImpl (and so every view of it, including tensors autograd saved) in place.
void allocate_storage(const at::Tensor& t, std::size_t nbytes);
// Drops `t`'s storage memory, keeping the StorageImpl; nbytes becomes 0.
void free_storage(const at::Tensor& t);
std::size_t storage_bytes(const at::Tensor& t);

}  // namespace gpumem::zero::detail
