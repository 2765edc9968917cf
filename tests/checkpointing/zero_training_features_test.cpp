// What users reach for first, on thread ranks: gradient accumulation over several backward()
// calls, frozen parameters and parameter groups train to what single-process training gives
// (the same cases zero_process_test runs as processes), and their misuse is refused clearly.
#include "toy_training.h"
#include "zero_process_cases.h"
#include "zero_test_helpers.h"

#include <ATen/Parallel.h>
#include <gpumem/zero/sharded_trainer.h>
#include <gpumem/zero/solo_backend.h>

#include <cstdio>
#include <stdexcept>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using namespace gpumem::zero;
using namespace gpumem::zero::testing;

namespace {

// Trains a case on `world` thread ranks; returns rank 0's gathered parameters.
NamedTensors train_case_on_threads(const ProcessCase& c, int world,
                                   const std::vector<Batch>& batches) {
  std::vector<ToyNet> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(make_toy_net(kProcessSeed));
    freeze(models.back(), c.frozen);
  }
  NamedTensors out;
  const auto errors = run_ranks(world, [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
    ToyNet& net = models[rank];
    ShardedTrainer trainer(
        net.ptr(), comm, c.options,
        c.options.stage == 3 ? net->units() : std::vector<std::shared_ptr<torch::nn::Module>>{});
    for (const Batch& b : batches) {
      for (int m = 0; m < c.micro_batches; ++m) {
        trainer.backward(
            micro_batch_loss(net, b, rank, world, m, c.micro_batches, c.options.compute_dtype));
      }
      trainer.step();
    }
    NamedTensors params = trainer.gather_full_parameters();
    if (rank == 0) out = std::move(params);
  });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
  }
  return out;
}

void check_cases_with_prefix(const std::string& prefix) {
  at::set_num_threads(1);
  const auto batches = process_batches();
  for (const ProcessCase& c : process_cases()) {
    if (!c.check_params || c.name.rfind(prefix, 0) != 0) continue;
    const NamedTensors reference = train_reference_case(c, batches);
    for (int world : {2, 4}) {
      INFO("case " << c.name << ", " << world << " ranks");
      const NamedTensors got = train_case_on_threads(c, world, batches);
      const Difference d = compare(got, reference, 2e-5, 1e-4);
      INFO("max |sharded - reference| = " << d.max_abs << " (worst: " << d.worst_param << ")");
      CHECK(d.max_violation == 0);
    }
  }
}

}  // namespace

TEST_CASE("gradient accumulation over three backward() calls equals single-process accumulation",
          "[zero][features]") {
  check_cases_with_prefix("accumulate");
}

TEST_CASE("frozen parameters stay put and the rest trains as in single-process training",
          "[zero][features]") {
  check_cases_with_prefix("frozen");
}

TEST_CASE("parameter groups (no decay below 2-D, another lr for the head) equal torch's",
          "[zero][features]") {
  check_cases_with_prefix("param_groups");
}

TEST_CASE("gradient accumulation: the accumulator is model state, and only when used",
          "[zero][features]") {
  at::set_num_threads(1);
  auto solo = c10::make_intrusive<SoloBackend>();
  const auto batches = make_batches(2, 8, 3);
  ToyNet net = make_toy_net(kProcessSeed);
  ShardedTrainerOptions o;
  o.stage = 2;
  o.compute_dtype = at::kFloat;
  ShardedTrainer trainer(net.ptr(), solo, o);
  trainer.backward(toy_loss(net, batches[0], at::kFloat));
  trainer.step();
  const double one = trainer.model_state_bytes().grads_bytes;
  trainer.backward(toy_loss(net, batches[1], at::kFloat));
  trainer.backward(toy_loss(net, batches[1], at::kFloat));
  trainer.step();
  // An fp32 accumulator of the rank's shard (a world of one: the whole model) joined the
  // gradients.
  CHECK(trainer.model_state_bytes().grads_bytes ==
        one + 4.0 * static_cast<double>(trainer.num_params()));
  CHECK(trainer.step_count() == 2);
}

TEST_CASE("misuse of the training features is refused with one clear error", "[zero][features]") {
  at::set_num_threads(1);
  auto solo = c10::make_intrusive<SoloBackend>();
  const auto batches = make_batches(1, 8, 4);
  ShardedTrainerOptions o;
  o.compute_dtype = at::kFloat;

  SECTION("requires_grad changed after construction") {
    ToyNet net = make_toy_net(kProcessSeed);
    ShardedTrainer trainer(net.ptr(), solo, o);
    net->head->weight.set_requires_grad(false);
    CHECK(contains(error_of([&] { trainer.backward(toy_loss(net, batches[0], at::kFloat)); }),
                   "parameter 'head.weight' was trainable when the trainer was built"));
  }
  SECTION("a frozen parameter unfrozen after construction") {
    ToyNet net = make_toy_net(kProcessSeed);
    net->out_scale.set_requires_grad(false);
    ShardedTrainer trainer(net.ptr(), solo, o);
    net->out_scale.set_requires_grad(true);
    CHECK(contains(error_of([&] { trainer.backward(toy_loss(net, batches[0], at::kFloat)); }),
                   "parameter 'out_scale' was frozen when the trainer was built"));
  }
  SECTION("nothing to train") {
    ToyNet net = make_toy_net(kProcessSeed);
    for (auto& p : net->parameters()) p.set_requires_grad(false);
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, o); }),
                   "every parameter of the model is frozen"));
  }
  SECTION("a param group without a predicate, or with a bad value") {
    ToyNet net = make_toy_net(kProcessSeed);
    ShardedTrainerOptions g = o;
    g.param_groups.push_back(ParamGroup{"biases", nullptr, std::nullopt, 0.0});
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, g); }),
                   "param_groups[0] ('biases'): match is empty"));
    g.param_groups[0] = no_weight_decay_below_2d();
    g.param_groups[0].weight_decay = -1.0;
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, g); }),
                   "weight_decay=-1 must be >= 0"));
  }
  SECTION("frozen parameters are reported by describe_units, frozen units are no units") {
    ToyNet net = make_toy_net(kProcessSeed);
    for (auto& p : net->blocks[1]->parameters()) p.set_requires_grad(false);
    ShardedTrainerOptions s3 = o;
    s3.stage = 3;
    ShardedTrainer trainer(net.ptr(), solo, s3, net->units());
    CHECK(trainer.num_units() == 5);  // input, block0, block2, head, root
    CHECK(contains(trainer.describe_units(), "frozen block1.fc1.weight"));
    trainer.backward(toy_loss(net, batches[0], at::kFloat));
    trainer.step();
  }
}
