// checkpoint_llama: a Llama-style decoder trained with gpumem activation checkpointing.
//
// The model is a CheckpointedSequential chain: embedding, then per layer an attention block
// (RMSNorm, fused QKV, rotary embeddings, causal scaled_dot_product_attention, output projection,
// residual) and an MLP block (RMSNorm, SwiGLU, residual), then the head (RMSNorm, vocabulary
// projection). Cross-entropy runs outside the chain. On the GPU it trains under bf16 autocast
// with fp32 master weights and AdamW.
//
// Modes: none (no checkpointing), every (each layer one checkpointed segment, like transformers'
// gradient_checkpointing_enable), sqrt (Chen et al.: ceil(sqrt(layers)) segments of layers),
// planner (the DP planner over the whole chain at --budget bytes, or at --budget-fraction of
// the activation memory of "none"), plan (the segments given by --plan). --selective also
// recomputes the norms and the SwiGLU activation inside every block (nested checkpoints). Every
// mode first profiles the chain without checkpointing
// and prints the predicted peak and step time next to the measured ones.
//
//   checkpoint_llama --mode planner --budget-fraction 0.5          (GPU, the benchmark config)
//   checkpoint_llama --device cpu --hidden 64 --intermediate 172 --layers 4 --heads 4
//                    --vocab 256 --batch 2 --seq 32 --mode sqrt    (a CPU smoke run)
//
// --record-native-history FILE (with --probe cuda-native) records libtorch's native allocator
// history for the whole run and writes it as a snapshot pickle (see native_history.h).
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "gpumem/ckpt/chain_profiler.h"
#include "gpumem/ckpt/checkpointed_sequential.h"
#include "gpumem/ckpt/memory_probes.h"
#include "gpumem/ckpt/planner.h"
#include "native_history.h"

namespace ckpt = gpumem::ckpt;
using torch::Tensor;

namespace {

// ---- command line ----

struct Options {
  std::string mode = "planner";
  std::string plan;  // --mode plan: segments as Plan::to_string writes them
  std::int64_t budget_bytes = 0;  // 0: use budget_fraction
  double budget_fraction = 0.5;
  std::string device;  // cuda if available, else cpu
  std::string probe;   // by device
  std::int64_t hidden = 2048, intermediate = 5504, layers = 12, heads = 16, vocab = 32000;
  std::int64_t batch = 4, seq = 2048;
  int steps = 10, warmup = 3;
  int autocast = -1;  // -1: on for cuda, off for cpu
  bool verbose = false;
  bool selective = false;  // checkpoint the cheap, memory-heavy parts inside every block
  std::uint64_t seed = 0;
  std::string record_native_history;  // snapshot pickle path; empty: no recording
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "checkpoint_llama: %s\n"
               "usage: checkpoint_llama [--mode none|every|sqrt|planner|plan] [--budget BYTES | "
               "--budget-fraction F]\n"
               "       [--plan \"ckpt[b,e) ...\" (with --mode plan)]\n"
               "       [--device cpu|cuda] [--probe gpumem-cpu|gpumem-cuda|cpu-events|cuda-native] [--hidden N] "
               "[--intermediate N]\n"
               "       [--layers N] [--heads N] [--vocab N] [--batch N] [--seq N] [--steps N] "
               "[--warmup N]\n"
               "       [--autocast on|off] [--selective] [--seed N] [--verbose]\n"
               "       [--record-native-history FILE (with --device cuda --probe cuda-native)]\n",
               what.c_str());
  std::exit(2);
}

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t lo) {
  std::size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != text.size() || pos == 0 || v < lo) {
    usage_error(flag + " wants an integer >= " + std::to_string(lo) + ", got '" + text + "'");
  }
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (flag == "--selective") {
      o.selective = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") usage_error("help");
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const std::string v = argv[++i];
    if (flag == "--mode") {
      if (v != "none" && v != "every" && v != "sqrt" && v != "planner" && v != "plan") {
        usage_error("--mode must be none, every, sqrt, planner or plan, got '" + v + "'");
      }
      o.mode = v;
    } else if (flag == "--plan") {
      o.plan = v;
    } else if (flag == "--budget") {
      try {
        o.budget_bytes = ckpt::parse_bytes(v);
      } catch (const std::invalid_argument& e) {
        usage_error(std::string("--budget: ") + e.what());
      }
    } else if (flag == "--budget-fraction") {
      char* end = nullptr;
      o.budget_fraction = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.budget_fraction > 0) || o.budget_fraction > 1) {
        usage_error("--budget-fraction wants a number in (0, 1], got '" + v + "'");
      }
    } else if (flag == "--device") {
      if (v != "cpu" && v != "cuda") usage_error("--device must be cpu or cuda, got '" + v + "'");
      o.device = v;
    } else if (flag == "--probe") {
      o.probe = v;
    } else if (flag == "--autocast") {
      if (v != "on" && v != "off") usage_error("--autocast must be on or off, got '" + v + "'");
      o.autocast = v == "on";
    } else if (flag == "--hidden") {
      o.hidden = parse_int(flag, v, 1);
    } else if (flag == "--intermediate") {
      o.intermediate = parse_int(flag, v, 1);
    } else if (flag == "--layers") {
      o.layers = parse_int(flag, v, 1);
    } else if (flag == "--heads") {
      o.heads = parse_int(flag, v, 1);
    } else if (flag == "--vocab") {
      o.vocab = parse_int(flag, v, 2);
    } else if (flag == "--batch") {
      o.batch = parse_int(flag, v, 1);
    } else if (flag == "--seq") {
      o.seq = parse_int(flag, v, 1);
    } else if (flag == "--steps") {
      o.steps = static_cast<int>(parse_int(flag, v, 1));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, v, 1));
    } else if (flag == "--seed") {
      o.seed = static_cast<std::uint64_t>(parse_int(flag, v, 0));
    } else if (flag == "--record-native-history") {
      o.record_native_history = v;
    } else {
      usage_error("unknown option '" + flag + "'");
    }
  }
  if (o.hidden % o.heads != 0 || (o.hidden / o.heads) % 2 != 0) {
    usage_error("--hidden must be a multiple of --heads with an even head size (hidden " +
                std::to_string(o.hidden) + ", heads " + std::to_string(o.heads) + ")");
  }
  if ((o.mode == "plan") != !o.plan.empty()) {
    usage_error("--mode plan and --plan \"ckpt[b,e) ...\" go together");
  }
  if (o.device.empty()) o.device = ckpt::cuda_available() ? "cuda" : "cpu";
  if (o.device == "cuda" && !ckpt::cuda_available()) {
    usage_error("--device cuda: no CUDA device is visible; use --device cpu");
  }
  if (o.probe.empty()) o.probe = o.device == "cuda" ? "gpumem-cuda" : "gpumem-cpu";
  if (o.autocast < 0) o.autocast = o.device == "cuda";
  if (!o.record_native_history.empty() && (o.probe != "cuda-native" || o.device != "cuda")) {
    usage_error("--record-native-history records PyTorch's native CUDA allocator: use it with "
                "--device cuda --probe cuda-native (the device is '" + o.device + "', the probe '" +
                o.probe + "')");
  }
  return o;
}

// ---- the model ----

// With selective on, the norm recomputes in backward (gpumem::checkpoint, nested inside any
// checkpointed segment): it keeps only its input, which the block keeps anyway, instead of a
// normalized fp32 copy, for an elementwise recompute (Korthikanti et al.'s selective idea).
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(std::int64_t dim, bool selective)
      : selective(selective), weight(register_parameter("weight", torch::ones({dim}))) {}
  Tensor normalize(const Tensor& x) {
    const Tensor xf = x.to(torch::kFloat);
    return xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + 1e-5) * weight;
  }
  Tensor forward(const Tensor& x) {
    if (!selective) return normalize(x);
    return gpumem::checkpoint([this](const Tensor& t) { return normalize(t); }, x, {weight});
  }
  bool selective;
  Tensor weight;
};
TORCH_MODULE(RMSNorm);

Tensor rotate_half(const Tensor& x) {
  const std::int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

torch::nn::Linear linear(std::int64_t in, std::int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

struct AttentionBlockImpl : torch::nn::Module {
  AttentionBlockImpl(const Options& o)
      : heads(o.heads),
        head_dim(o.hidden / o.heads),
        norm(register_module("norm", RMSNorm(o.hidden, o.selective))),
        q(register_module("q", linear(o.hidden, o.hidden))),
        k(register_module("k", linear(o.hidden, o.hidden))),
        v(register_module("v", linear(o.hidden, o.hidden))),
        out(register_module("out", linear(o.hidden, o.hidden))) {
    // Rotary tables (seq, head_dim): position p, frequency 10000^(-2i/d), repeated for both
    // halves of the head.
    const Tensor inv = torch::pow(10000.0, -torch::arange(0, head_dim, 2, torch::kFloat) / double(head_dim));
    const Tensor angles = torch::outer(torch::arange(o.seq, torch::kFloat), inv);
    const Tensor full = torch::cat({angles, angles}, -1);
    cos = register_buffer("cos", full.cos());
    sin = register_buffer("sin", full.sin());
  }
  Tensor rope(const Tensor& x) {  // x: (batch, heads, seq, head_dim)
    const std::int64_t s = x.size(2);
    const Tensor c = cos.slice(0, 0, s).to(x.scalar_type());
    const Tensor sn = sin.slice(0, 0, s).to(x.scalar_type());
    return x * c + rotate_half(x) * sn;
  }
  Tensor heads_first(const Tensor& x, std::int64_t b, std::int64_t s) {
    return x.view({b, s, heads, head_dim}).transpose(1, 2);  // (batch, heads, seq, head_dim)
  }
  Tensor forward(const Tensor& h) {
    const std::int64_t b = h.size(0), s = h.size(1), d = h.size(2);
    const Tensor x = norm(h);
    const Tensor attn = at::scaled_dot_product_attention(
        rope(heads_first(q(x), b, s)), rope(heads_first(k(x), b, s)), heads_first(v(x), b, s),
        /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
    return h + out(attn.transpose(1, 2).reshape({b, s, d}));
  }
  std::int64_t heads, head_dim;
  RMSNorm norm;
  torch::nn::Linear q, k, v, out;
  Tensor cos, sin;
};
TORCH_MODULE(AttentionBlock);

// With selective on, silu(gate) * up recomputes in backward: the block keeps gate and up
// (which it keeps anyway) but not silu(gate).
struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(const Options& o)
      : selective(o.selective),
        norm(register_module("norm", RMSNorm(o.hidden, o.selective))),
        gate(register_module("gate", linear(o.hidden, o.intermediate))),
        up(register_module("up", linear(o.hidden, o.intermediate))),
        down(register_module("down", linear(o.intermediate, o.hidden))) {}
  Tensor forward(const Tensor& h) {
    const Tensor x = norm(h);
    const Tensor g = gate(x), u = up(x);
    const Tensor act =
        selective ? gpumem::checkpoint(
                        [](const ckpt::TensorList& in) {
                          return ckpt::TensorList{torch::silu(in[0]) * in[1]};
                        },
                        {g, u})[0]
                  : torch::silu(g) * u;
    return h + down(act);
  }
  bool selective;
  RMSNorm norm;
  torch::nn::Linear gate, up, down;
};
TORCH_MODULE(MlpBlock);

struct HeadImpl : torch::nn::Module {
  HeadImpl(const Options& o)
      : norm(register_module("norm", RMSNorm(o.hidden, o.selective))),
        proj(register_module("proj", linear(o.hidden, o.vocab))) {}
  Tensor forward(const Tensor& h) { return proj(norm(h)); }
  RMSNorm norm;
  torch::nn::Linear proj;
};
TORCH_MODULE(Head);

ckpt::CheckpointedSequential build_model(const Options& o) {
  ckpt::CheckpointedSequential chain;
  chain->push_back("embed", torch::nn::Embedding(o.vocab, o.hidden));
  for (std::int64_t l = 0; l < o.layers; ++l) {
    chain->push_back("attn" + std::to_string(l), AttentionBlock(o));
    chain->push_back("mlp" + std::to_string(l), MlpBlock(o));
  }
  chain->push_back("head", Head(o));
  return chain;
}

// ---- plans ----

// Layer l is chain modules [1 + 2l, 3 + 2l).
ckpt::Plan layer_plan(std::size_t n, const ckpt::Plan& over_layers) {
  std::vector<ckpt::Segment> segs;
  for (const ckpt::Segment& s : over_layers.checkpointed()) {
    segs.push_back({1 + 2 * s.begin, 1 + 2 * s.end});
  }
  return ckpt::Plan(n, std::move(segs));
}

// ---- the training step ----

struct Autocast {
  bool on = false;
  c10::DeviceType device = c10::DeviceType::CUDA;
  void enter() const {
    if (!on) return;
    at::autocast::set_autocast_enabled(device, true);
    at::autocast::set_autocast_dtype(device, at::kBFloat16);
  }
  void leave() const {  // as Python's torch.autocast does on exit
    if (!on) return;
    at::autocast::set_autocast_enabled(device, false);
    at::autocast::clear_cache();
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  try {
    std::optional<gpumem::examples::NativeHistoryRecorder> history;
    if (!o.record_native_history.empty()) history.emplace(o.record_native_history);
    // The probe first: the CPU one installs the counting allocator, which must see the model.
    std::unique_ptr<ckpt::MemoryProbe> probe = ckpt::make_memory_probe(o.probe, 0);
    torch::manual_seed(o.seed);
    const torch::Device device(o.device == "cuda" ? torch::kCUDA : torch::kCPU, 0);
    const Autocast autocast{o.autocast != 0, device.type()};

    ckpt::CheckpointedSequential model = build_model(o);
    model->to(device);
    const std::size_t n = model->size();
    std::int64_t param_bytes = 0;
    for (const auto& p : model->parameters()) param_bytes += p.numel() * p.element_size();
    const std::int64_t state_bytes = 4 * param_bytes;  // weights, gradients, AdamW's 2 moments
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));

    const Tensor tokens = torch::randint(o.vocab, {o.batch, o.seq}, torch::TensorOptions(device).dtype(torch::kLong));
    const Tensor targets = torch::randint(o.vocab, {o.batch * o.seq}, torch::TensorOptions(device).dtype(torch::kLong));
    const ckpt::LossFn loss_fn = [&](const Tensor& logits) {
      Tensor loss = torch::nn::functional::cross_entropy(logits.view({-1, o.vocab}), targets);
      autocast.leave();  // backward outside autocast
      return loss;
    };
    double optimizer_ms = 0;
    auto train_step = [&]() {
      optimizer.zero_grad();  // set_to_none
      autocast.enter();
      Tensor loss = loss_fn(model->forward(tokens));  // the logits die here
      loss.backward();
      probe->synchronize();
      const auto t_opt = std::chrono::steady_clock::now();
      optimizer.step();
      probe->synchronize();
      optimizer_ms = ms_since(t_opt);
      return loss.item<double>();
    };

    std::printf("checkpoint_llama: device %s, probe %s, autocast %s%s; hidden %lld, intermediate "
                "%lld, layers %lld, heads %lld, vocab %lld, batch %lld, seq %lld; %zu chain "
                "modules; parameters %s, model state (weights, grads, AdamW) %s\n",
                o.device.c_str(), probe->name().c_str(), autocast.on ? "bf16" : "off",
                o.selective ? ", selective recompute in blocks" : "",
                (long long)o.hidden, (long long)o.intermediate, (long long)o.layers,
                (long long)o.heads, (long long)o.vocab, (long long)o.batch, (long long)o.seq, n,
                ckpt::format_bytes(param_bytes).c_str(), ckpt::format_bytes(state_bytes).c_str());

    // 1. Warm up without checkpointing (AdamW's moments get allocated), then profile.
    for (int s = 0; s < o.warmup; ++s) train_step();
    ckpt::ProfileOptions popts;
    popts.warmup_steps = 0;  // the training steps above warmed up
    popts.on_step_begin = [&] { autocast.enter(); };
    const ckpt::ChainProfile profile = ckpt::profile_chain(*model, tokens, loss_fn, *probe, popts);
    if (o.verbose) std::printf("%s", ckpt::format_profile(profile).c_str());
    const ckpt::Prediction none = ckpt::predict(profile, ckpt::Plan::none(n));

    // 2. The plan.
    ckpt::Plan plan = ckpt::Plan::none(n);
    std::int64_t budget = 0;
    if (o.mode == "every") {
      plan = layer_plan(n, ckpt::Plan::every(static_cast<std::size_t>(o.layers)));
    } else if (o.mode == "sqrt") {
      plan = layer_plan(n, ckpt::Plan::sqrt_n(static_cast<std::size_t>(o.layers)));
    } else if (o.mode == "plan") {
      plan = ckpt::Plan::parse(n, o.plan);
    } else if (o.mode == "planner") {
      budget = o.budget_bytes > 0
                   ? o.budget_bytes
                   : state_bytes + static_cast<std::int64_t>(
                                       o.budget_fraction *
                                       static_cast<double>(none.peak_bytes - state_bytes));
      const ckpt::PlanResult r = ckpt::plan_for_budget(profile, budget);
      if (!r.feasible) {
        std::fprintf(stderr, "checkpoint_llama: %s\n", r.message.c_str());
        return 1;
      }
      plan = r.plan;
      std::printf("planner: budget %s; %zu DP states; plan %s\n",
                  ckpt::format_bytes(budget).c_str(), r.states, plan.to_string().c_str());
    }
    const ckpt::Prediction pred = ckpt::predict(profile, plan);
    model->set_plan(plan);

    // 3. Measure: the cache emptied so reserved bytes are this mode's own, two steps to settle,
    //    then peaks over the measured steps.
    probe->release_cached();
    for (int s = 0; s < 2; ++s) train_step();
    probe->synchronize();
    if (history) history->note_peaks_before_reset();
    probe->reset_peak();
    std::vector<double> step_ms, opt_ms;
    double loss = 0;
    for (int s = 0; s < o.steps; ++s) {
      probe->synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      loss = train_step();
      step_ms.push_back(ms_since(t0));
      opt_ms.push_back(optimizer_ms);
    }
    const ckpt::MemoryReading mem = probe->read();
    std::sort(step_ms.begin(), step_ms.end());
    std::sort(opt_ms.begin(), opt_ms.end());
    const double step = step_ms[step_ms.size() / 2];
    const double pred_step = pred.step_ns / 1e6 + opt_ms[opt_ms.size() / 2];

    auto gb = [](std::int64_t b) { return static_cast<double>(b) / 1e9; };
    std::printf("mode %s: plan %s (%zu of %zu modules recomputed)\n", o.mode.c_str(),
                plan.to_string().c_str(), plan.checkpointed_modules(), n);
    std::printf("  %-28s %12s %12s\n", "", "predicted", "measured");
    std::printf("  %-28s %9.3f GB %9.3f GB\n", "peak allocated", gb(pred.peak_bytes),
                gb(mem.peak_allocated_bytes));
    std::printf("  %-28s %9.3f GB %9.3f GB\n", "peak allocated - model state",
                gb(pred.peak_bytes - state_bytes), gb(mem.peak_allocated_bytes - state_bytes));
    if (mem.peak_reserved_bytes > 0) {
      std::printf("  %-28s %12s %9.3f GB\n", "peak reserved", "", gb(mem.peak_reserved_bytes));
    } else {
      std::printf("  %-28s %12s %12s\n", "peak reserved", "", "n/a (probe)");
    }
    std::printf("  %-28s %9.1f ms %9.1f ms\n", "step time (median)", pred_step, step);
    std::printf("  no checkpointing (profiled): peak %.3f GB, step %.1f ms; loss %.4f\n",
                gb(none.peak_bytes), none.step_ns / 1e6 + opt_ms[opt_ms.size() / 2], loss);
    std::printf(
        "RESULT mode=%s peak_allocated_bytes=%lld peak_reserved_bytes=%lld step_ms=%.2f "
        "predicted_peak_bytes=%lld predicted_step_ms=%.2f none_predicted_peak_bytes=%lld "
        "model_state_bytes=%lld budget_bytes=%lld recomputed_modules=%zu selective=%d "
        "plan=\"%s\"\n",
        o.mode.c_str(), (long long)mem.peak_allocated_bytes, (long long)mem.peak_reserved_bytes,
        step, (long long)pred.peak_bytes, pred_step, (long long)none.peak_bytes,
        (long long)state_bytes, (long long)budget, plan.checkpointed_modules(),
        o.selective ? 1 : 0, plan.to_string().c_str());
    if (history) {
      history->write();
      std::printf("native allocator history written to %s\n", history->path().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_llama: %s\n", e.what());
    return 1;
  }
}
