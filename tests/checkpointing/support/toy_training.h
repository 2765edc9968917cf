// Toy training for the ShardedTrainer tests: a small residual MLP whose forward runs its units
// through gpumem::zero::call, a deterministic data set, single-process reference training with
// torch::optim::AdamW, and sharded training of the same steps on N thread ranks.
//
// The reference is independent of gpumem::zero: fp32 compute trains the fp32 model directly;
// bf16 compute keeps an fp32 master model updated by torch::optim::AdamW and a bf16 copy for
// forward and backward (the ZeRO paper's mixed precision, without any sharding).
//
// Thread-safety: make_* and train_reference are called from one thread; train_sharded runs its
// ranks on threads it owns.
#pragma once

#include "thread_group_backend.h"

#include <gpumem/zero/model_state_bytes.h>
#include <gpumem/zero/sharded_trainer_options.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gpumem::zero::testing {

struct ToyBlockImpl : torch::nn::Module {
  ToyBlockImpl(std::int64_t width, std::int64_t hidden);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(ToyBlock);

struct ToyNetImpl : torch::nn::Module {
  static constexpr std::int64_t kIn = 12, kWidth = 32, kHidden = 64, kOut = 6, kBlocks = 3;
  ToyNetImpl();
  at::Tensor forward(const at::Tensor& x);
  // The stage-3 units: input projection, each block, head. out_scale stays in the root unit.
  std::vector<std::shared_ptr<torch::nn::Module>> units();
  torch::nn::Linear input{nullptr};
  std::vector<ToyBlock> blocks;
  torch::nn::Linear head{nullptr};
  at::Tensor out_scale;
};
TORCH_MODULE(ToyNet);

ToyNet make_toy_net(std::uint64_t seed);

struct Batch {
  at::Tensor x;  // [rows, kIn] fp32
  at::Tensor y;  // [rows, kOut] fp32
};
std::vector<Batch> make_batches(int steps, int rows, std::uint64_t seed);
Batch local_batch(const Batch& global, int rank, int world_size);
Batch to_device(const Batch& batch, at::Device device);
// Mean squared error of the model's output (computed in `compute`) against y, in fp32.
at::Tensor toy_loss(ToyNet& net, const Batch& batch, c10::ScalarType compute);

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Single-process training on the global batches (see above). With data_parallel_ranks > 1 the
// gradient of each step is computed as data parallelism defines it: the mean, taken in double
// and rounded once to the compute dtype, of the gradients of the global batch's
// data_parallel_ranks equal slices (each computed in the compute dtype). With fp32 compute
// that equals the full-batch gradient to rounding; with bf16 it is what data parallelism
// computes, and differs from the full-batch bf16 gradient by bf16 rounding.
NamedTensors train_reference(std::uint64_t seed, const std::vector<Batch>& batches,
                             const ShardedTrainerOptions& options, at::Device device = at::kCPU,
                             int data_parallel_ranks = 1);

struct RankReport {
  ModelStateBytes states;       // model_state_bytes() after the last step
  ModelStateBytes peak_states;  // peak_model_state_bytes()
  ModelStateBytes expected;     // the formula
  double transient_peak_bytes = 0;
  std::int64_t num_params = 0;
  // When RankCountingCpuAllocator is installed: the bytes this rank's thread allocated and
  // still holds right after the last step (before gathering the parameters), and its peak.
  std::int64_t allocator_live_bytes = -1;
  std::int64_t allocator_peak_bytes = -1;
  std::map<std::string, int> collectives;  // issued by this rank, by name
};

struct ShardedRun {
  NamedTensors params;  // fp32 master parameters gathered on rank 0 after the last step
  std::vector<RankReport> ranks;
  std::vector<std::string> errors;  // by rank, "" when it succeeded
  double seconds = 0;
};

// Called on each rank before each step's backward: may throw (a failing rank) or install hooks.
using Injection = std::function<void(int rank, int step, ToyNet& net)>;

// at_quiescence, when given, runs on rank 0 after every rank finished its last step and before
// any gathers its parameters (between two barriers): nothing but the model states is alive then.
ShardedRun train_sharded(int world_size, const ShardedTrainerOptions& options, std::uint64_t seed,
                         const std::vector<Batch>& batches, const Injection& inject = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(60),
                         const std::function<void()>& at_quiescence = {});

// Largest |a - b| over all parameters, and the largest allowed by |a - b| <= atol + rtol·|b|
// violated (0 when all are within).
struct Difference {
  double max_abs = 0;
  double max_violation = 0;
  std::string worst_param;
};
Difference compare(const NamedTensors& a, const NamedTensors& b, double atol, double rtol);

}  // namespace gpumem::zero::testing
