// ShardedTrainer: every stage trains to the same parameters as single-process training on the
// same global batch, uses the collectives its stage calls for, and refuses misuse clearly.
#include "toy_training.h"
#include "zero_process_cases.h"
#include "zero_test_helpers.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gpumem/zero/distributed_context.h>
#include <gpumem/zero/sharded_trainer.h>
#include <gpumem/zero/solo_backend.h>
#include <torch/cuda.h>

#include <cstdio>
#include <stdexcept>
#include <string>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using namespace gpumem::zero;
using namespace gpumem::zero::testing;

namespace {

constexpr std::uint64_t kSeed = 1234;
constexpr int kSteps = 20;
constexpr int kRows = 24;  // global batch: divisible by 1, 2, 3, 4 ranks

void require_success(const ShardedRun& run) {
  for (std::size_t r = 0; r < run.errors.size(); ++r) {
    INFO("rank " << r << ": " << run.errors[r]);
    REQUIRE(run.errors[r].empty());
  }
}

NamedTensors initial_parameters() {
  ToyNet net = make_toy_net(kSeed);
  NamedTensors out;
  for (const auto& item : net->named_parameters())
    out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

}  // namespace

TEST_CASE("fp32: every stage equals single-process AdamW after 20 steps", "[zero][trainer]") {
  at::set_num_threads(1);
  const auto batches = make_batches(kSteps, kRows, 7);
  const NamedTensors reference = train_reference(kSeed, batches, fp32_options(0));
  // The comparison is meaningful: training moved the parameters far beyond the tolerance.
  CHECK(compare(reference, initial_parameters(), 0, 0).max_abs > 0.05);

  struct Case {
    int stage, world;
    bool reshard, prefetch;
  };
  const Case cases[] = {{0, 4, true, true}, {1, 4, true, true},  {2, 4, true, true},
                        {3, 4, true, true}, {3, 4, false, true}, {3, 4, true, false},
                        {1, 3, true, true}, {2, 3, true, true},  {3, 3, true, true},
                        {2, 1, true, true}, {3, 2, true, true}};
  for (const Case& c : cases) {
    ShardedTrainerOptions o = fp32_options(c.stage);
    o.reshard_after_forward = c.reshard;
    o.prefetch = c.prefetch;
    INFO("stage " << c.stage << ", " << c.world << " ranks, reshard_after_forward " << c.reshard
                  << ", prefetch " << c.prefetch);
    const ShardedRun run = train_sharded(c.world, o, kSeed, batches);
    require_success(run);
    const Difference d = compare(run.params, reference, 2e-5, 1e-4);
    INFO("max |sharded - reference| = " << d.max_abs << " (worst: " << d.worst_param << ")");
    CHECK(d.max_violation == 0);
  }
}

TEST_CASE("fp32: gradient clipping equals clip_grad_norm_", "[zero][trainer]") {
  at::set_num_threads(1);
  const auto batches = make_batches(kSteps, kRows, 8);
  for (int stage : {0, 1, 2, 3}) {
    ShardedTrainerOptions o = fp32_options(stage);
    o.max_grad_norm = 0.05;  // well below the toy model's gradient norm: every step clips
    const NamedTensors reference = train_reference(kSeed, batches, o);
    const NamedTensors unclipped = train_reference(kSeed, batches, fp32_options(stage));
    CHECK(compare(reference, unclipped, 0, 0).max_abs > 1e-3);  // clipping changed the result
    INFO("stage " << stage);
    const ShardedRun run = train_sharded(4, o, kSeed, batches);
    require_success(run);
    const Difference d = compare(run.params, reference, 2e-5, 1e-4);
    INFO("max |sharded - reference| = " << d.max_abs << " (worst: " << d.worst_param << ")");
    CHECK(d.max_violation == 0);
  }
}

TEST_CASE("bf16 compute with fp32 master weights equals single-process mixed precision",
          "[zero][trainer]") {
  at::set_num_threads(1);
  const auto batches = make_batches(kSteps, kRows, 9);
  ShardedTrainerOptions base;  // bf16 compute, fp32 master weights and AdamW moments
  base.adamw.lr = 1e-2;
  base.bucket_size_bytes = 4 << 10;
  const NamedTensors full_batch = train_reference(kSeed, batches, base);
  const NamedTensors data_parallel = train_reference(kSeed, batches, base, at::kCPU, 4);
  const double moved = compare(full_batch, initial_parameters(), 0, 0).max_abs;
  CHECK(moved > 0.1);
  for (int stage : {0, 1, 2, 3}) {
    ShardedTrainerOptions o = base;
    o.stage = stage;
    INFO("stage " << stage);
    // One rank: the same computation as the single-process mixed-precision loop.
    const ShardedRun one = train_sharded(1, o, kSeed, batches);
    require_success(one);
    const Difference d1 = compare(one.params, full_batch, 1e-6, 1e-5);
    INFO("1 rank: max |sharded - reference| = " << d1.max_abs << " (worst: " << d1.worst_param
                                                << ")");
    CHECK(d1.max_violation == 0);
    // Four ranks: equal to the single-process run whose gradient is the data-parallel mean of
    // the four slices' bf16 gradients ...
    const ShardedRun four = train_sharded(4, o, kSeed, batches);
    require_success(four);
    const Difference d4 = compare(four.params, data_parallel, 1e-6, 1e-5);
    INFO("4 ranks: max |sharded - data-parallel reference| = " << d4.max_abs << " (worst: "
                                                               << d4.worst_param << ")");
    CHECK(d4.max_violation == 0);
    // ... and close to full-batch bf16 training: they differ only where the bf16 gradient is
    // rounded (per slice, before the mean, instead of once), a small fraction of how far 20
    // steps of lr 1e-2 moved the parameters.
    const Difference df = compare(four.params, full_batch, 0.25 * moved, 0);
    std::printf(
        "bf16 stage %d, 4 ranks: max |sharded - data-parallel reference| = %.2g, "
        "max |sharded - full-batch reference| = %.3g (parameters moved up to %.3g)\n",
        stage, d4.max_abs, df.max_abs, moved);
    CHECK(df.max_violation == 0);
  }
}

TEST_CASE("each stage issues the collectives it calls for", "[zero][trainer]") {
  at::set_num_threads(1);
  const auto batches = make_batches(3, kRows, 10);
  auto count = [](const RankReport& r, const char* name) {
    auto it = r.collectives.find(name);
    return it == r.collectives.end() ? 0 : it->second;
  };
  const ShardedRun s0 = train_sharded(2, fp32_options(0), kSeed, batches);
  const ShardedRun s1 = train_sharded(2, fp32_options(1), kSeed, batches);
  const ShardedRun s2 = train_sharded(2, fp32_options(2), kSeed, batches);
  ShardedTrainerOptions keep = fp32_options(3);
  keep.reshard_after_forward = false;
  const ShardedRun s3 = train_sharded(2, fp32_options(3), kSeed, batches);
  const ShardedRun s3_keep = train_sharded(2, keep, kSeed, batches);
  for (const ShardedRun* run : {&s0, &s1, &s2, &s3, &s3_keep}) require_success(*run);
  // Stage 0: gradients all-reduced, nothing sharded.
  CHECK(count(s0.ranks[0], "allreduce") > 0);
  CHECK(count(s0.ranks[0], "_reduce_scatter_base") == 0);
  CHECK(count(s0.ranks[0], "_allgather_base") == 0);
  // Stage 1: all-reduce, then the parameters are all-gathered after each step.
  CHECK(count(s1.ranks[0], "allreduce") == count(s0.ranks[0], "allreduce"));
  CHECK(count(s1.ranks[0], "_allgather_base") > 0);
  // Stage 2: reduce-scatter instead of all-reduce, as many as stage 1 had all-reduces.
  CHECK(count(s2.ranks[0], "allreduce") == 0);
  CHECK(count(s2.ranks[0], "_reduce_scatter_base") == count(s1.ranks[0], "allreduce"));
  // Stage 3: five units + root; per step one reduce-scatter per unit, and gathers before
  // forward and again before backward unless the parameters are kept after forward.
  CHECK(count(s3.ranks[0], "_reduce_scatter_base") == 3 * 6);
  CHECK(count(s3.ranks[0], "_allgather_base") > count(s3_keep.ranks[0], "_allgather_base"));
  CHECK(count(s3_keep.ranks[0], "_allgather_base") == 3 * (5 + 1) + 6);  // + the final gather
}

TEST_CASE("stages 2 and 3 reduce-scatter while backward is still running", "[zero][trainer]") {
  at::set_num_threads(1);
  const auto batches = make_batches(2, 8, 14);
  for (int stage : {1, 2, 3}) {
    // Block 0's first weight is among the last gradients backward computes; by then the
    // buckets (units) of the layers after it must already have been handed to the backend.
    std::vector<int> issued_before_last(2, -1);
    const auto errors = run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
      ToyNet net = make_toy_net(kSeed);
      ShardedTrainerOptions o = fp32_options(stage);
      o.bucket_size_bytes = 2 << 10;
      ShardedTrainer trainer(
          net.ptr(), comm, o,
          stage == 3 ? net->units() : std::vector<std::shared_ptr<torch::nn::Module>>{});
      auto* threads = dynamic_cast<ThreadBackend*>(comm.get());
      const char* reduction = stage == 1 ? "allreduce" : "_reduce_scatter_base";
      const at::Tensor loss = toy_loss(net, local_batch(batches[0], rank, 2), at::kFloat);
      net->input->weight.register_hook([&, rank](const at::Tensor&) {
        const auto counts = threads->issued();
        auto it = counts.find(reduction);
        issued_before_last[rank] = it == counts.end() ? 0 : it->second;
      });
      trainer.backward(loss);
      trainer.step();
    });
    INFO("stage " << stage);
    for (const std::string& e : errors) REQUIRE(e.empty());
    CHECK(issued_before_last[0] >= 2);
    CHECK(issued_before_last[1] == issued_before_last[0]);
  }
}

TEST_CASE("a world of one runs without a launcher", "[zero][trainer]") {
  at::set_num_threads(1);
  LaunchEnv env;  // as parse_launch_env returns it with no variables set
  DistributedContext ctx = init_distributed(env, c10::DeviceType::CPU);
  CHECK(ctx.backend->getSize() == 1);
  CHECK(ctx.backend->getBackendName() == "gpumem-solo");
  const auto batches = make_batches(5, 8, 11);
  const NamedTensors reference = train_reference(kSeed, batches, fp32_options(3));
  ToyNet net = make_toy_net(kSeed);
  ShardedTrainer trainer(net.ptr(), ctx.backend, fp32_options(3), net->units());
  for (const Batch& b : batches) {
    trainer.backward(toy_loss(net, b, at::kFloat));
    trainer.step();
  }
  CHECK(trainer.step_count() == 5);
  CHECK(compare(trainer.gather_full_parameters(), reference, 2e-5, 1e-4).max_violation == 0);
}

TEST_CASE("a world of one with launcher variables rendezvous through a TCPStore",
          "[zero][trainer]") {
  LaunchEnv env;
  env.from_environment = true;
  env.master_addr = "127.0.0.1";
  env.master_port = 0;  // any free port (parse_launch_env never returns 0; the store accepts it)
  DistributedContext ctx = init_distributed(env, c10::DeviceType::CPU, std::chrono::seconds(20));
  ctx.store->set("gpumem-zero", std::vector<uint8_t>{1, 2, 3});
  CHECK((ctx.store->get("gpumem-zero") == std::vector<uint8_t>{1, 2, 3}));
  CHECK(ctx.backend->getSize() == 1);
}

TEST_CASE("unusable launch configurations fail with the fix", "[zero][trainer]") {
  LaunchEnv two;
  two.world_size = 2;
  two.rank = 1;
  two.from_environment = true;
  if (!gloo_available()) {  // with Gloo it would connect: zero_process_test runs that
    CHECK(contains(error_of([&] { init_distributed(two, c10::DeviceType::CPU); }),
                   "install libgloo-dev"));
  }
  CHECK(contains(error_of([&] {
                   DistributedOptions o;
                   o.timeout = std::chrono::milliseconds(0);
                   init_distributed(two, c10::DeviceType::CPU, o);
                 }),
                 "timeout 0 ms must be > 0"));
  CHECK(contains(error_of([&] {
                   DistributedOptions o;
                   o.rendezvous_timeout = std::chrono::milliseconds(-1);
                   init_distributed(two, c10::DeviceType::CPU, o);
                 }),
                 "rendezvous_timeout -1 ms must be >= 0"));
  if (!torch::cuda::is_available()) {
    const std::string e = error_of([&] { init_distributed(LaunchEnv{}, c10::DeviceType::CUDA); });
    CHECK((contains(e, "no CUDA device is visible") || contains(e, "built without NCCL")));
  }
}

TEST_CASE("misuse is refused with one clear error", "[zero][trainer]") {
  at::set_num_threads(1);
  auto solo = c10::make_intrusive<SoloBackend>();
  const auto batches = make_batches(2, 8, 12);

  SECTION("step() before backward(), loss.backward() directly") {
    ToyNet net = make_toy_net(kSeed);
    ShardedTrainer trainer(net.ptr(), solo, fp32_options(2));
    CHECK(contains(error_of([&] { trainer.step(); }),
                   "no reduced gradients; call trainer.backward(loss)"));
    trainer.backward(toy_loss(net, batches[0], at::kFloat));
    trainer.step();
    CHECK(contains(error_of([&] { toy_loss(net, batches[1], at::kFloat).backward(); }),
                   "call trainer.backward(loss) instead of loss.backward()"));
    CHECK(contains(error_of([&] { trainer.backward(at::ones({2}, at::requires_grad())); }),
                   "one-element tensor"));
    CHECK(contains(error_of([&] { trainer.backward(at::ones({})); }), "does not require grad"));
  }
  SECTION("stage 3 needs units, and units must be disjoint submodules") {
    ToyNet net = make_toy_net(kSeed);
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, fp32_options(3)); }),
                   "stage 3 needs units"));
    auto overlapping = net->units();
    overlapping.push_back(net->blocks[0]->fc1.ptr());
    CHECK(
        contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, fp32_options(3), overlapping); }),
                 "units must not contain one another"));
    ToyNet other = make_toy_net(kSeed);
    CHECK(contains(
        error_of([&] { ShardedTrainer t(net.ptr(), solo, fp32_options(3), {other->head.ptr()}); }),
        "is not a submodule of the model"));
  }
  SECTION("bad options") {
    ToyNet net = make_toy_net(kSeed);
    ShardedTrainerOptions o = fp32_options(5);
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, o); }),
                   "stage 5 does not exist"));
    o = fp32_options(1);
    o.adamw.beta2 = 1.0;
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, o); }),
                   "adamw.beta2=1 must be in [0, 1)"));
    o = fp32_options(1);
    o.compute_dtype = at::kInt;
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, o); }),
                   "compute_dtype Int is not supported"));
    o.compute_dtype = at::kHalf;
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), solo, o); }),
                   "needs dynamic loss scaling"));
    CHECK(contains(error_of([&] { ShardedTrainer t(net.ptr(), nullptr, fp32_options(1)); }),
                   "init_distributed"));
  }
  SECTION("one model, one trainer") {
    ToyNet net = make_toy_net(kSeed);
    ShardedTrainer first(net.ptr(), solo, fp32_options(3), net->units());
    CHECK(contains(
        error_of([&] { ShardedTrainer second(net.ptr(), solo, fp32_options(3), net->units()); }),
        "wrap each model in one trainer"));
  }
}

TEST_CASE("CUDA: stage 3 with side-stream prefetch over NCCL equals the reference",
          "[zero][trainer][gpu]") {
  if (!torch::cuda::is_available()) GPUMEM_SKIP("no CUDA device");
  if (!nccl_available()) GPUMEM_SKIP("gpumem was built without NCCL");
  const at::Device cuda(at::kCUDA, 0);
  const auto batches = make_batches(kSteps, kRows, 13);
  DistributedContext ctx = init_distributed(LaunchEnv{}, c10::DeviceType::CUDA);
  CHECK(ctx.device == cuda);
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    const NamedTensors reference = train_reference(kSeed, batches, fp32_options(stage), cuda);
    ToyNet net = make_toy_net(kSeed);
    net->to(cuda);
    ShardedTrainer trainer(
        net.ptr(), ctx.backend, fp32_options(stage),
        stage == 3 ? net->units() : std::vector<std::shared_ptr<torch::nn::Module>>{});
    for (const Batch& b : batches) {
      trainer.backward(toy_loss(net, to_device(b, cuda), at::kFloat));
      trainer.step();
    }
    const Difference d = compare(trainer.gather_full_parameters(), reference, 1e-4, 1e-3);
    std::printf("CUDA stage %d over %s: max |sharded - reference| = %.3g\n", stage,
                ctx.backend->getBackendName().c_str(), d.max_abs);
    INFO("max |sharded - reference| = " << d.max_abs);
    CHECK(d.max_violation == 0);
  }
  ctx.backend->shutdown();
}
