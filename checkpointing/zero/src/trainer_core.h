// TrainerCore: the state and mechanism behind ShardedTrainer and gpumem::zero::call. See
// sharded_trainer.h for the design; this header is internal to gpumem_zero.
//
// Lifetime: ShardedTrainer owns the core through a shared_ptr; autograd hooks hold weak_ptrs, so
// a graph that outlives its trainer runs its hooks as no-ops. Stage-3 unit modules are entered
// in a process-wide registry (module -> core, unit) for the trainer's lifetime.
//
// Thread-safety: none beyond the registry's own mutex; see sharded_trainer.h.
#pragma once

#include "adamw_shard.h"
#include "device_streams.h"
#include "flat_unit.h"
#include "gpumem/zero/model_state_bytes.h"
#include "gpumem/zero/sharded_trainer_options.h"

#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpumem::zero::detail {

class TrainerCore : public std::enable_shared_from_this<TrainerCore> {
 public:
  TrainerCore(std::shared_ptr<torch::nn::Module> model, c10::intrusive_ptr<c10d::Backend> comm,
              ShardedTrainerOptions options, std::vector<std::shared_ptr<torch::nn::Module>> units);
  ~TrainerCore();

  // Second half of construction, once a shared_ptr owns the core (hooks need weak_from_this).
  void initialize();
  // Removes hooks and registry entries; never waits on collectives.
  void detach() noexcept;

  void backward(const at::Tensor& loss);
  void step();
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters();

  // Stage-3 unit entry points (gpumem::zero::call and the hooks it installs).
  void before_unit_forward(int unit);
  void after_unit_forward(int unit, bool will_run_backward);
  void before_unit_backward(int unit);
  // AccumulateGrad post hook of parameter `slot` of `unit`.
  void on_grad_ready(int unit, int slot, const at::Tensor& param);

  ModelStateBytes model_state_bytes() const;
  ModelStateBytes peak_model_state_bytes() const { return peak_states_; }
  ModelStateBytes expected_model_state_bytes() const;
  double transient_peak_bytes() const { return transient_peak_bytes_; }
  std::string describe_units() const;

  const ShardedTrainerOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  at::Device device() const { return device_; }
  std::int64_t num_params() const { return num_params_; }
  std::int64_t step_count() const { return optimizer_ ? optimizer_->step_count() : 0; }
  int num_units() const { return static_cast<int>(units_.size()); }

 private:
  enum class Phase { kIdle, kInBackward, kReduced };

  struct PendingReduction {
    int unit = -1;
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor input;   // kept alive until the collective is done
    at::Tensor output;  // stages 2-3: this rank's reduced shard of the unit
  };

  void validate_options() const;
  int group_of(const std::string& name, const at::Tensor& param) const;
  std::vector<ShardSegment> shard_segments() const;
  void check_requires_grad_unchanged() const;
  void fold_reduced_gradients();
  at::Tensor reduced_gradient_shard() const;
  void build_units(const std::vector<std::shared_ptr<torch::nn::Module>>& unit_modules);
  void initialize_parameters();
  void install_hooks();

  void check_usable(const char* what) const;
  template <class F>
  void guarded(const char* what, F&& fn);

  at::TensorOptions compute_options() const;
  void attach_grad_views(FlatUnit& u);

  // Gradient reduction.
  void build_reduce_order();
  void launch_ready_reductions();
  void launch_reduction(int unit);
  void complete_oldest_reduction();
  void finish_backward();

  // Stage-3 gathering.
  void start_gather(int unit, bool on_side_stream);
  void wait_gathered(int unit);
  void reshard(int unit);
  std::optional<int> next_unit_after(int unit) const;
  std::optional<int> unit_before_in_this_forward(int unit) const;

  void note_transient(double delta_bytes);
  void measure_states();

  std::shared_ptr<torch::nn::Module> model_;
  c10::intrusive_ptr<c10d::Backend> comm_;
  ShardedTrainerOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
  int shard_count_ = 1;  // 1 in stage 0 (no sharding), world_size otherwise
  int shard_index_ = 0;
  at::Device device_{at::kCPU};
  std::int64_t num_params_ = 0;
  std::vector<std::string> param_order_;  // named_parameters() order, for gather_full_parameters
  // Frozen parameters (requires_grad false): whole on every rank, compute dtype, never updated.
  std::vector<std::pair<std::string, at::Tensor>> frozen_;

  std::vector<FlatUnit> units_;
  std::vector<int> declared_order_;  // stage 3: units in the order given (root last)
  int root_unit_ = -1;               // stage 3: the unit of parameters no unit module owns
  std::int64_t shard_total_numel_ = 0;

  std::unique_ptr<AdamWShard> optimizer_;
  at::Tensor grad_shard_;   // stages 2-3: [shard_total_numel_], compute dtype
  at::Tensor param_shard_;  // stage 3: [shard_total_numel_], compute dtype
  // Gradient accumulation: the reduced gradients of this step's earlier backward() calls, fp32,
  // [shard_total_numel_]; allocated by the first step that has more than one backward().
  at::Tensor grad_accum_;
  int backwards_this_step_ = 0;
  DeviceStreams streams_;

  Phase phase_ = Phase::kIdle;
  std::string broken_;  // why the trainer is unusable; empty while healthy

  std::vector<int> reduce_order_;
  std::size_t next_reduce_ = 0;
  std::deque<PendingReduction> pending_;

  std::vector<int> forward_order_;          // stage 3: unit call order of the last full step
  std::vector<int> current_forward_order_;  // ... of the forward running now
  bool in_forward_pass_ = false;
  bool hooks_installed_ = false;
  std::vector<const torch::nn::Module*> registered_modules_;

  double transient_bytes_ = 0;
  double transient_peak_bytes_ = 0;
  ModelStateBytes peak_states_;
};

// The stage-3 registry: which live trainer core and unit a module belongs to.
struct UnitRef {
  std::shared_ptr<TrainerCore> core;
  int unit = -1;
};
void register_unit_module(const torch::nn::Module* module, const std::shared_ptr<TrainerCore>& core,
                          int unit);
void unregister_unit_module(const torch::nn::Module* module, const TrainerCore* core) noexcept;
UnitRef find_unit_module(const torch::nn::Module* module);

}  // namespace gpumem::zero::detail
