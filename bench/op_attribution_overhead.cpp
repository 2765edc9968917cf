// op_attribution_overhead: what per-op attribution costs a training step. A small GPT-style model
// (gpumem::toy::Gpt with 8 heads: pre-norm blocks, attention through scaled_dot_product_attention,
// GELU MLP; AdamW; sequence length varied per step) trains on gpumem (install() on CUDA,
// install_cpu() without a GPU) in alternating phases: attribution off (gpumem alone) and on (the at::RecordFunction callbacks of
// install_record_function_attribution() plus EngineForensics with record_ops and a trace ring).
// Phases alternate so drift affects both; prints the median step time of each and the overhead.
//
//   bench_op_attribution_overhead [--device cuda|cpu] [--phases N] [--steps-per-phase N]
//                                 [--d-model D] [--layers L] [--batch B] [--seq S]
//                                 [--on all|callbacks|observers]
// --on picks what the "on" phases turn on: both (default), only the RecordFunction callbacks, or
// only EngineForensics' observers (to see which part costs what).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_args.h"
#include "gpumem/torch/config.h"
#include "gpumem/forensics/engine_forensics.h"
#include "gpumem/forensics/op_attribution_torch.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"
#include "gpumem/toy/gpt.h"

namespace {

struct Options {
  std::string device = "cuda";
  int phases = 10;
  int steps = 20;
  int batch = 16;
  // --d-model (width), --layers, --seq (max_seq; steps take seq/2 .. seq-1 tokens)
  gpumem::toy::GptOptions model{.layers = 6, .width = 512, .heads = 8, .vocab = 8192, .max_seq = 256};
  std::string on = "all";  // what "on" turns on: all, callbacks (RecordFunction only), observers
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  gpumem::bench::BenchArgs args("bench_op_attribution_overhead",
                                "[--device cuda|cpu] [--phases N] [--steps-per-phase N] [--d-model N] [--layers N] "
                                "[--batch N] [--seq N] [--on all|callbacks|observers]");
  auto one_of = [](std::string& out, std::vector<std::string> allowed) {
    return [&out, allowed = std::move(allowed)](const std::string& v) -> std::string {
      std::string list;
      for (const std::string& a : allowed) {
        if (v == a) {
          out = v;
          return {};
        }
        list += (list.empty() ? "" : ", ") + a;
      }
      return "expected one of " + list;
    };
  };
  args.custom("--device", one_of(o.device, {"cuda", "cpu"}))
      .number("--phases", o.phases, 1, 100000)
      .number("--steps-per-phase", o.steps, 1, 100000)
      .number<std::int64_t>("--d-model", o.model.width, 8, 65536)
      .number<std::int64_t>("--layers", o.model.layers, 1, 1000)
      .number("--batch", o.batch, 1, 100000)
      .number<std::int64_t>("--seq", o.model.max_seq, 2, 1000000)
      .custom("--on", one_of(o.on, {"all", "callbacks", "observers"}));
  args.parse(argc, argv);
  const bool cuda = o.device == "cuda" && torch::cuda::is_available();
  if (o.device == "cuda" && !cuda) {
    std::fprintf(stderr, "no CUDA device: running on the CPU\n");
  }
  // gpumem alone at install (the "off" phases: no ring, no tracker, no callbacks); the "on" phases
  // attach what trace_entries:262144,record_ops:True would.
  gpumem::torch::Config config;
  gpumem::forensics::Config attribution;
  attribution.trace_entries = 262144;
  attribution.record_ops = true;
  if (cuda) {
    gpumem::torch::install(config);
  } else {
    gpumem::torch::install_cpu(config);
  }
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::manual_seed(0);
  gpumem::toy::Gpt model(o.model);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4));
  std::mt19937 rng(1);
  auto step = [&] {
    const int half = static_cast<int>(o.model.max_seq / 2);
    const int t = half + static_cast<int>(rng() % static_cast<unsigned>(half));
    auto idx = torch::randint(o.model.vocab, {o.batch, t + 1}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto input = idx.slice(1, 0, t), target = idx.slice(1, 1, t + 1);
    auto logits = model->forward(input);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, o.model.vocab}), target.reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (cuda) torch::cuda::synchronize();
  };
  for (int i = 0; i < 5; ++i) step();  // warm up

  gpumem::alloc::CachingAllocator* engine = gpumem::torch::engine(device.is_cuda() ? c10::Device(c10::kCUDA, 0)
                                                                                   : c10::Device(c10::kCPU));
  if (!engine) {
    std::fprintf(stderr, "gpumem's engine for %s does not exist\n", device.str().c_str());
    return 1;
  }
  std::vector<double> off_ms, on_ms;
  std::size_t records = 0;
  for (int p = 0; p < 2 * o.phases; ++p) {
    const bool on = p % 2 == 1;
    std::unique_ptr<gpumem::forensics::EngineForensics> fx;
    if (on) {
      if (o.on != "observers") gpumem::forensics::install_record_function_attribution();
      if (o.on != "callbacks") fx = std::make_unique<gpumem::forensics::EngineForensics>(*engine, attribution);
    }
    for (int s = 0; s < o.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      (on ? on_ms : off_ms).push_back(ms);
    }
    if (on) {
      if (fx) records = fx->trace_ring()->size();
      fx.reset();
      gpumem::forensics::remove_record_function_attribution();
    }
  }
  const double off = median(off_ms), on = median(on_ms);
  std::printf("device %s, d_model %lld, layers %lld, batch %d, seq <= %lld; %d phases x %d steps each\n",
              device.str().c_str(), static_cast<long long>(o.model.width), static_cast<long long>(o.model.layers),
              o.batch, static_cast<long long>(o.model.max_seq), o.phases, o.steps);
  std::printf("attribution off: %.3f ms/step (median)\n", off);
  std::printf("attribution on (%s):  %.3f ms/step (median; %zu trace records in the last phase)\n", o.on.c_str(), on,
              records);
  std::printf("overhead: %.2f%% (target: at most 3%%)\n", 100.0 * (on - off) / off);
  return 0;
}
