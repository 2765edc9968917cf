// op_attribution_overhead: what per-op attribution costs a training step. A small GPT-style model
// (pre-norm blocks: attention through scaled_dot_product_attention, GELU MLP; AdamW; sequence
// length varied per step) trains on gpumem (install() on CUDA, install_cpu() without a GPU) in
// alternating phases: attribution off (gpumem alone) and on (the at::RecordFunction callbacks of
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

#include "gpumem/torch/config.h"
#include "gpumem/forensics/engine_forensics.h"
#include "gpumem/forensics/op_attribution_torch.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"

namespace {

struct Options {
  std::string device = "cuda";
  int phases = 10;
  int steps = 20;
  int d_model = 512;
  int layers = 6;
  int batch = 16;
  int seq = 256;
  int vocab = 8192;
  std::string on = "all";  // what "on" turns on: all, callbacks (RecordFunction only), observers
};

struct BlockImpl : torch::nn::Module {
  int heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_out{nullptr};
  BlockImpl(int d, int h) : heads(h) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    fc_out = register_module("fc_out", torch::nn::Linear(4 * d, d));
  }
  torch::Tensor forward(torch::Tensor x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2);
    auto parts = qkv(ln1(x)).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    auto a = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, /*is_causal=*/true);
    x = x + proj(a.transpose(1, 2).reshape({b, t, d}));
    return x + fc_out(torch::gelu(fc(ln2(x))));
  }
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
  explicit GptImpl(const Options& o) {
    tok = register_module("tok", torch::nn::Embedding(o.vocab, o.d_model));
    pos = register_module("pos", torch::nn::Embedding(o.seq, o.d_model));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < o.layers; ++i) blocks->push_back(Block(o.d_model, 8));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.vocab).bias(false)));
  }
  torch::Tensor forward(torch::Tensor idx) {
    auto positions = torch::arange(idx.size(1), idx.options());
    auto x = tok(idx) + pos(positions);
    for (auto& m : *blocks) x = m->as<Block>()->forward(x);
    return head(ln_f(x));
  }
};
TORCH_MODULE(Gpt);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device") o.device = v;
    else if (k == "--phases") o.phases = std::atoi(v.c_str());
    else if (k == "--steps-per-phase") o.steps = std::atoi(v.c_str());
    else if (k == "--d-model") o.d_model = std::atoi(v.c_str());
    else if (k == "--layers") o.layers = std::atoi(v.c_str());
    else if (k == "--batch") o.batch = std::atoi(v.c_str());
    else if (k == "--seq") o.seq = std::atoi(v.c_str());
    else if (k == "--on" && (v == "all" || v == "callbacks" || v == "observers")) o.on = v;
    else {
      std::fprintf(stderr, "bench_op_attribution_overhead: unknown option '%s'\n", k.c_str());
      return 2;
    }
  }
  const bool cuda = o.device == "cuda" && torch::cuda::is_available();
  if (o.device == "cuda" && !cuda) {
    std::fprintf(stderr, "no CUDA device: running on the CPU\n");
  }
  gpumem::torch::Config config;
  config.forensics.trace_entries = 262144;
  config.forensics.record_ops = true;
  if (cuda) {
    gpumem::torch::install(config);
  } else {
    gpumem::torch::install_cpu(config);
  }
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::manual_seed(0);
  Gpt model(o);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4));
  std::mt19937 rng(1);
  auto step = [&] {
    const int t = o.seq / 2 + static_cast<int>(rng() % static_cast<unsigned>(o.seq / 2));
    auto idx = torch::randint(o.vocab, {o.batch, t + 1}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto input = idx.slice(1, 0, t), target = idx.slice(1, 1, t + 1);
    auto logits = model->forward(input);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, o.vocab}), target.reshape({-1}));
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
      if (o.on != "callbacks") fx = std::make_unique<gpumem::forensics::EngineForensics>(*engine, config.forensics);
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
  std::printf("device %s, d_model %d, layers %d, batch %d, seq <= %d; %d phases x %d steps each\n",
              device.str().c_str(), o.d_model, o.layers, o.batch, o.seq, o.phases, o.steps);
  std::printf("attribution off: %.3f ms/step (median)\n", off);
  std::printf("attribution on (%s):  %.3f ms/step (median; %zu trace records in the last phase)\n", o.on.c_str(), on,
              records);
  std::printf("overhead: %.2f%% (target: at most 3%%)\n", 100.0 * (on - off) / off);
  return 0;
}
