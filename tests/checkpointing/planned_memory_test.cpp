// The planner's predictions against measurement: a 12-block residual MLP on the CPU, memory
// read from gpumem's statistics of its CPU engine (gpumem::torch::install_cpu), and once more
// from the counting CPU allocator's AllocEvents as an independent check.
// Profile without checkpointing, plan for a budget, run the plan, and compare the measured
// peak with the prediction.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "catch.h"
#include "gpumem/ckpt/chain_profiler.h"
#include "gpumem/ckpt/counting_cpu_allocator.h"
#include "gpumem/ckpt/checkpointed_sequential.h"
#include "gpumem/ckpt/memory_probes.h"
#include "gpumem/ckpt/planner.h"
#include "gpumem/torch/install.h"

namespace ckpt = gpumem::ckpt;

namespace {

struct ResidualMlpImpl : torch::nn::Module {
  ResidualMlpImpl(int64_t d, int64_t hidden)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        up(register_module("up", torch::nn::Linear(d, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, d))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::gelu(up(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(ResidualMlp);

}  // namespace

namespace {

void planned_peaks_follow_predictions(const std::string& probe_name) {
  torch::set_num_threads(1);  // one thread: the same allocations in the same order every step
  auto probe = ckpt::make_memory_probe(probe_name);  // before the model: every byte is seen
  torch::manual_seed(0);
  ckpt::CheckpointedSequential chain;
  const std::size_t n = 12;
  for (std::size_t i = 0; i < n; ++i) chain->push_back(ResidualMlp(64, 256));
  const torch::Tensor input = torch::randn({512, 64});
  const ckpt::LossFn loss_fn = [](const torch::Tensor& out) { return out.pow(2).mean(); };

  ckpt::ProfileOptions options;
  options.instrumented_steps = 1;
  options.timed_steps = 1;
  const ckpt::ChainProfile profile = ckpt::profile_chain(*chain, input, loss_fn, *probe, options);
  std::printf("probe %s\n%s", probe_name.c_str(), ckpt::format_profile(profile).c_str());

  auto measure = [&](const ckpt::Plan& plan) {
    chain->set_plan(plan);
    for (auto& p : chain->parameters()) p.mutable_grad() = torch::Tensor();
    probe->reset_peak();
    torch::Tensor loss = loss_fn(chain->forward(input));  // the output dies here
    loss.backward();
    const std::int64_t peak = probe->read().peak_allocated_bytes;
    for (auto& p : chain->parameters()) p.mutable_grad() = torch::Tensor();
    return peak;
  };

  // The cost model reproduces the profiled step, and the step is deterministic.
  const ckpt::Prediction none = ckpt::predict(profile, ckpt::Plan::none(n));
  CHECK(none.peak_bytes == profile.measured_peak_bytes);
  CHECK(measure(ckpt::Plan::none(n)) == profile.measured_peak_bytes);

  const std::int64_t activation = none.peak_bytes - profile.base_bytes;
  const std::int64_t lowest = ckpt::plan_min_peak(profile).prediction.peak_bytes;
  REQUIRE(lowest < none.peak_bytes);
  const ckpt::Plan sqrt = ckpt::Plan::sqrt_n(n);
  const ckpt::Prediction sqrt_pred = ckpt::predict(profile, sqrt);

  std::printf("%-34s %12s %12s %12s\n", "plan", "predicted", "measured", "recompute ms");
  // Budgets from generous to tight; the planner must fit each and the measurement must follow.
  for (double fraction : {0.75, 0.5, 0.25}) {
    const auto budget = lowest + static_cast<std::int64_t>(
                                     fraction * static_cast<double>(none.peak_bytes - lowest));
    const ckpt::PlanResult r = ckpt::plan_for_budget(profile, budget);
    REQUIRE(r.feasible);
    const std::int64_t measured = measure(r.plan);
    std::printf("%-34s %12lld %12lld %12.3f\n", r.plan.to_string().substr(0, 34).c_str(),
                static_cast<long long>(r.prediction.peak_bytes),
                static_cast<long long>(measured), r.prediction.recompute_ns / 1e6);
    INFO("budget " << budget << " plan " << r.plan.to_string() << " predicted "
                   << r.prediction.peak_bytes << " measured " << measured);
    CHECK(r.prediction.peak_bytes <= budget);
    CHECK(std::llabs(measured - r.prediction.peak_bytes) <= activation / 20);  // within 5%
    CHECK(measured < none.peak_bytes);
    if (sqrt_pred.peak_bytes <= budget) CHECK(r.prediction.recompute_ns <= sqrt_pred.recompute_ns);
  }
  const std::int64_t sqrt_measured = measure(sqrt);
  std::printf("%-34s %12lld %12lld %12.3f\n", sqrt.to_string().substr(0, 34).c_str(),
              static_cast<long long>(sqrt_pred.peak_bytes),
              static_cast<long long>(sqrt_measured), sqrt_pred.recompute_ns / 1e6);
  CHECK(std::llabs(sqrt_measured - sqrt_pred.peak_bytes) <= activation / 20);
  CHECK(sqrt_measured < none.peak_bytes);
}

}  // namespace

TEST_CASE("measured peak memory drops as the planner predicted on a 12-block model",
          "[ckpt][torch][planner]") {
  // One process, two CPU allocators in turn: gpumem's engine first, then the counting
  // allocator in front of c10's default (its tests need the default's raw interface, so it
  // runs after gpumem's CPU allocator is put back).
  SECTION("gpumem-cpu: gpumem's CPU engine statistics") {
    planned_peaks_follow_predictions("gpumem-cpu");
    gpumem::torch::uninstall_cpu();
  }
  SECTION("cpu-events: counted from AllocEvents of the counting allocator") {
    gpumem::torch::uninstall_cpu();
    planned_peaks_follow_predictions("cpu-events");
    ckpt::CountingCpuAllocator::uninstall();
  }
}
