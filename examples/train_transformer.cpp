// A small GPT-style language model (gpumem::toy::Gpt: token and position embeddings, pre-norm
// blocks with causal attention through scaled_dot_product_attention and a GELU MLP) trained with
// libtorch on gpumem, AdamW. The sequence length changes every step (uniform in [--min-seq, --max-seq]),
// the workload that fragments a caching allocator.
//
//   train_transformer [--device cuda|cuda:N|cpu] [--allocator gpumem|native] [--config STR]
//                     [--steps N] [--batch B] [--min-seq S] [--max-seq S] [--d-model D]
//                     [--layers L] [--heads H] [--vocab V] [--lr F] [--seed N] [--deterministic]
//
// gpumem is installed before anything touches the device: gpumem::torch::install() for CUDA,
// install_cpu() for the CPU (--allocator native leaves libtorch's allocators alone). --config is a
// GPUMEM_ALLOC_CONF-style string (default: the environment's). --deterministic makes two runs
// bit-identical whatever the allocator (deterministic algorithms, the math attention kernel, a
// fixed cuBLAS workspace), which is how scripts/gpu/torch_adapter.sh compares gpumem with native.
//
// Each step prints its time, loss, and the peak allocated and reserved memory so far; the last
// line ("summary ...") is key=value pairs for scripts.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <variant>
#include <vector>

#if defined(GPUMEM_TORCH_HAVE_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "gpumem/torch/config.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"
#include "gpumem/toy/gpt.h"

namespace {

struct Options {
  std::string device = "cuda";
  std::string allocator = "gpumem";
  std::string config;
  int steps = 30;
  int64_t batch = 16;
  int64_t min_seq = 64;
  gpumem::toy::GptOptions model;  // --max-seq, --d-model, --layers, --heads, --vocab
  double lr = 3e-4;
  uint64_t seed = 0;
  bool deterministic = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "train_transformer: %s\nusage: train_transformer [--device cuda|cuda:N|cpu] [--allocator gpumem|native] "
               "[--config STR] [--steps N] [--batch B] [--min-seq S] [--max-seq S] [--d-model D] [--layers L] "
               "[--heads H] [--vocab V] [--lr F] [--seed N] [--deterministic]\n",
               what.c_str());
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const char* text, int64_t min_value) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < min_value)
    usage_error(flag + " needs an integer >= " + std::to_string(min_value) + ", got '" + text + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--device") o.device = value();
    else if (a == "--allocator") o.allocator = value();
    else if (a == "--config") o.config = value();
    else if (a == "--steps") o.steps = static_cast<int>(parse_int(a, value(), 1));
    else if (a == "--batch") o.batch = parse_int(a, value(), 1);
    else if (a == "--min-seq") o.min_seq = parse_int(a, value(), 2);
    else if (a == "--max-seq") o.model.max_seq = parse_int(a, value(), 2);
    else if (a == "--d-model") o.model.width = parse_int(a, value(), 8);
    else if (a == "--layers") o.model.layers = parse_int(a, value(), 1);
    else if (a == "--heads") o.model.heads = parse_int(a, value(), 1);
    else if (a == "--vocab") o.model.vocab = parse_int(a, value(), 8);
    else if (a == "--seed") o.seed = static_cast<uint64_t>(parse_int(a, value(), 0));
    else if (a == "--lr") o.lr = std::atof(value());
    else if (a == "--deterministic") o.deterministic = true;
    else usage_error("unknown argument '" + a + "'");
  }
  if (o.allocator != "gpumem" && o.allocator != "native") usage_error("--allocator is gpumem or native");
  if (o.min_seq > o.model.max_seq) usage_error("--min-seq must not exceed --max-seq");
  if (o.model.width % o.model.heads != 0) usage_error("--d-model must be a multiple of --heads");
  if (!(o.lr > 0)) usage_error("--lr must be a positive number");
  return o;
}

struct Peaks {
  int64_t allocated = -1, reserved = -1, requested = -1;
};

Peaks read_peaks(const torch::Device& device, bool gpumem) {
  Peaks p;
  c10::CachingDeviceAllocator::DeviceStats s;
  if (device.is_cuda()) {
#if defined(GPUMEM_TORCH_HAVE_CUDA)
    s = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
#else
    return p;
#endif
  } else if (gpumem) {
    s = gpumem::torch::cpu_stats();
  } else {
    return p;  // c10's CPU allocator keeps no statistics
  }
  p.allocated = s.allocated_bytes[0].peak;
  p.reserved = s.reserved_bytes[0].peak;
  p.requested = s.requested_bytes[0].peak;
  return p;
}

double mib(int64_t bytes) { return bytes < 0 ? -1.0 : static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool gpumem = o.allocator == "gpumem";
  if (o.deterministic) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);  // before cuBLAS starts

  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(o.device);
  } catch (const c10::Error&) {
    usage_error("--device '" + o.device + "' is not a device (cpu, cuda, cuda:N)");
  }
  if (device.is_cuda() && !device.has_index()) device = torch::Device(torch::kCUDA, 0);
  if (device.is_cuda() && !torch::cuda::is_available()) usage_error("--device " + o.device + ": no CUDA device here");

  try {
    // Install before anything touches the device's allocator.
    if (gpumem) {
      gpumem::torch::Config config;
      if (!o.config.empty()) {
        auto parsed = gpumem::torch::parse_config(o.config);
        if (auto* error = std::get_if<gpumem::torch::ConfigError>(&parsed)) usage_error("--config: " + error->message);
        config = std::get<gpumem::torch::Config>(parsed);
      } else {
        auto parsed = gpumem::torch::config_from_environment();
        if (auto* error = std::get_if<gpumem::torch::ConfigError>(&parsed)) usage_error(error->message);
        config = std::get<gpumem::torch::Config>(parsed);
      }
      if (device.is_cuda()) {
        gpumem::torch::install(config);
      } else {
        gpumem::torch::install_cpu(config);
      }
    }
    if (o.deterministic) {
      auto& ctx = at::globalContext();
      ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
      ctx.setDeterministicCuDNN(true);
      ctx.setBenchmarkCuDNN(false);
      ctx.setSDPUseFlash(false);
      ctx.setSDPUseMemEfficient(false);
      ctx.setSDPUseCuDNN(false);
    }
    torch::manual_seed(o.seed);

    gpumem::toy::Gpt model(o.model);
    model->to(device);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(0.1));
    std::mt19937_64 lengths(o.seed + 1);
    std::uniform_int_distribution<int64_t> seq_dist(o.min_seq, o.model.max_seq);
    const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);

    std::printf("train_transformer: device %s, allocator %s, %lld layers, d_model %lld, vocab %lld, batch %lld, "
                "seq %lld..%lld, %d steps%s\n",
                device.str().c_str(), gpumem ? "gpumem" : "native", static_cast<long long>(o.model.layers),
                static_cast<long long>(o.model.width), static_cast<long long>(o.model.vocab),
                static_cast<long long>(o.batch), static_cast<long long>(o.min_seq),
                static_cast<long long>(o.model.max_seq), o.steps,
                o.deterministic ? ", deterministic" : "");
    std::vector<double> step_ms;
    double loss_value = 0;
    for (int step = 0; step < o.steps; ++step) {
      const int64_t seq = seq_dist(lengths);
      const auto t0 = std::chrono::steady_clock::now();
      // A learnable stream: each token determines the next (x -> x + 7 mod V).
      auto start = torch::randint(o.model.vocab, {o.batch, 1}, long_opts);
      auto tokens = (start + 7 * torch::arange(seq + 1, long_opts).unsqueeze(0)) % o.model.vocab;
      auto input = tokens.slice(1, 0, seq);
      auto target = tokens.slice(1, 1, seq + 1);
      auto logits = model->forward(input);
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, o.model.vocab}), target.reshape({-1}));
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
      loss_value = loss.item<double>();  // synchronizes the device
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      step_ms.push_back(ms);
      const Peaks p = read_peaks(device, gpumem);
      std::printf("step %3d seq %4lld time_ms %9.3f loss %.9g peak_allocated_mib %.1f peak_reserved_mib %.1f\n", step,
                  static_cast<long long>(seq), ms, loss_value, mib(p.allocated), mib(p.reserved));
      std::fflush(stdout);
    }
    // The first steps include one-time costs (kernel loading, first growth): the median skips them.
    std::vector<double> sorted(step_ms.begin() + std::min<std::size_t>(3, step_ms.size() - 1), step_ms.end());
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const Peaks p = read_peaks(device, gpumem);
    std::printf("summary allocator=%s device=%s steps=%d median_step_ms=%.3f final_loss=%.9g peak_allocated_bytes=%lld "
                "peak_reserved_bytes=%lld peak_requested_bytes=%lld reserved_over_requested=%.4f\n",
                gpumem ? "gpumem" : "native", device.str().c_str(), o.steps, median, loss_value,
                static_cast<long long>(p.allocated), static_cast<long long>(p.reserved),
                static_cast<long long>(p.requested),
                p.requested > 0 ? static_cast<double>(p.reserved) / static_cast<double>(p.requested) : -1.0);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "train_transformer: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
