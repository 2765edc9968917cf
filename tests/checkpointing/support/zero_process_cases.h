// The ZeRO runs the multi-process tests make, shared by the rank worker (which trains them over
// ProcessGroupGloo, one process per rank) and the test (which launches the workers and checks
// their results against single-process training computed here).
//
// A case is a trainer configuration plus what the user does around it: gradient accumulation
// over micro-batches, frozen parameters, parameter groups. train_reference_case() trains the
// same steps in one process without gpumem::zero (torch::optim::AdamW, plain loss.backward()).
//
// Results travel through files in the launch's output directory: rank 0 writes the gathered
// parameters (<case>.params), every rank its model-state bytes (<case>.rank<r>.txt).
//
// Thread-safety: plain functions; file readers and writers touch only the paths given.
#pragma once

#include "toy_training.h"

#include <gpumem/zero/model_state_bytes.h>
#include <gpumem/zero/sharded_trainer_options.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpumem::zero::testing {

struct ProcessCase {
  std::string name;
  ShardedTrainerOptions options;
  int micro_batches = 1;             // backward() calls per step, each on 1/k of the global batch
  std::vector<std::string> frozen;   // parameters set to requires_grad(false) before wrapping
  bool check_params = true;          // compared with the single-process reference
  bool check_memory = false;         // model-state bytes compared with the ZeRO formulas
};

// fp32 compute (exact comparisons with torch::optim::AdamW), lr 1e-2, weight decay 0.05, 8 KiB
// buckets (several, so ordering and in-flight limits matter), two reductions in flight.
ShardedTrainerOptions fp32_options(int stage);

constexpr std::uint64_t kProcessSeed = 4321;
constexpr int kProcessSteps = 8;
constexpr int kProcessRows = 24;  // global batch: 3 micro-batches of 8 rows split over 2 or 4 ranks

std::vector<ProcessCase> process_cases();
std::vector<Batch> process_batches();

// Applies a case's frozen list to a model (throws naming an unknown parameter).
void freeze(ToyNet& net, const std::vector<std::string>& names);

// One step's loss for micro-batch `micro` of `micro_batches` of this rank's share of `global`,
// scaled by 1/micro_batches (the gradient of the step is then the mean over micro-batches).
at::Tensor micro_batch_loss(ToyNet& net, const Batch& global, int rank, int world_size,
                            int micro, int micro_batches, c10::ScalarType compute);

// Single-process training of the case (fp32 compute only).
NamedTensors train_reference_case(const ProcessCase& c, const std::vector<Batch>& batches);

void write_params(const std::string& path, const NamedTensors& params);
NamedTensors read_params(const std::string& path);

struct RankStateRecord {
  ModelStateBytes measured;
  ModelStateBytes expected;
  double allocator_live_bytes = -1;  // allocated by this rank and alive after the last step
  std::int64_t num_params = 0;
};
void write_rank_state(const std::string& path, const RankStateRecord& record);
RankStateRecord read_rank_state(const std::string& path);

}  // namespace gpumem::zero::testing
