// zero_train: trains a small GPT-style transformer with gpumem::zero::ShardedTrainer at a chosen
// ZeRO stage, and prints the global batch's loss, step time, and per rank the peak memory and
// the model-state bytes against the ZeRO formulas.
//
// Launch like any torchrun job, one process per GPU:
//     torchrun --nproc-per-node 8 --no-python zero_train --stage 3     (RANK, WORLD_SIZE, ...)
//     zero_train --stage 2 --device cuda                              (one process, world of one)
//     zero_train --stage 3 --device cpu --steps 20 --layers 2         (CPU, world of one)
// Stage 0 is plain all-reduce data parallelism, the baseline the other stages are timed against.
//
// Data: token sequences from a fixed random Markov chain (each token has 4 possible successors
// with probabilities .55/.25/.15/.05), so the loss falls from ln(vocab) towards the chain's
// entropy (1.11 nats). Every rank draws the same global batch per step (before the step's clock
// starts) and trains on its slice; the loss printed is the mean over the ranks' slices, which is
// the global batch's loss whatever the number of ranks.
//
// Memory, per rank: the trainer counts the bytes of the model-state tensors it holds, the
// allocator's statistics give the bytes allocated after the last step (when nothing but the
// model states is alive), and peak reserved and peak allocated bytes over training (peaks are
// reset once the trainer is built). With --allocator gpumem (the default) gpumem is installed
// before anything touches the device (gpumem::torch::install on CUDA, install_cpu on the CPU);
// --allocator native keeps libtorch's allocators (statistics on CUDA only). Rank 0 prints every
// rank's numbers, and one RESULT line per rank for scripts (scripts/gpu/zero_fsdp2.sh).
// --record-native-history FILE (with --allocator native, on CUDA) records the native allocator's
// history for the whole run and writes it as a snapshot pickle (FILE.rankR per rank when
// WORLD_SIZE > 1; see native_history.h).
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <fmt/format.h>
#include <gpumem/zero/distributed_context.h>
#include <gpumem/zero/launch_env.h>
#include <gpumem/zero/sharded_trainer.h>
#include <gpumem/zero/unit_call.h>
#if GPUMEM_ZERO_HAVE_GPUMEM_TORCH
#include <gpumem/torch/install.h>
#include <gpumem/torch/memory_stats.h>
#endif
#include <gpumem/toy/gpt.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include "native_history.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <variant>
#include <stdexcept>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace zero = gpumem::zero;

// The model is gpumem::toy::Gpt (token + position embeddings, pre-norm blocks with causal
// self-attention through scaled_dot_product_attention and a GELU MLP, final norm and vocabulary
// projection). Its units (embeddings, each block, head) are the stage-3 units, each run through
// zero::call.

// ---------------------------------------------------------------------------------------------
// Command line

struct Args {
  // --layers, --width, --heads, --vocab, --seq (the sequence length every step trains on)
  gpumem::toy::GptOptions model{.layers = 8, .width = 768, .heads = 12, .vocab = 256, .max_seq = 256};
  int stage = 2;
  int steps = 200;
  std::int64_t batch = 32;  // global, over all ranks
  double lr = 3e-4;
  double clip = 1.0;
  std::string dtype = "bf16";
  std::string device = "auto";
  bool reshard_after_forward = true;
  bool prefetch = true;
  double bucket_mb = 25;
  std::string allocator = "gpumem";
  int log_every = 20;
  int micro_batches = 1;
  bool no_decay_below_2d = false;
  std::uint64_t seed = 0;
  std::string record_native_history;  // snapshot pickle path; empty: no recording
};

const char* kUsage =
    "usage: zero_train [--stage 0|1|2|3] [--steps N] [--batch GLOBAL_ROWS] [--seq T] [--layers L]\n"
    "                  [--width W] [--heads H] [--vocab V] [--lr X] [--clip NORM (0 = off)]\n"
    "                  [--dtype bf16|fp32] [--device auto|cpu|cuda] [--no-reshard-after-forward]\n"
    "                  [--no-prefetch] [--bucket-mb MB] [--allocator gpumem|native]\n"
    "                  [--micro-batches K] [--no-decay-below-2d] [--log-every N] [--seed S]\n"
    "                  [--record-native-history FILE (with --allocator native)]\n"
    "Launcher variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun) select\n"
    "the rank; without them the process is a world of one. One process per GPU:\n"
    "    torchrun --nproc-per-node N --no-python zero_train --stage 3 ...\n";

[[noreturn]] void usage_error(const std::string& what) {
  throw std::invalid_argument(what + "\n" + kUsage);
}

template <class T>
T number(const std::string& flag, const std::string& text, T lo, T hi) {
  std::size_t used = 0;
  T value{};
  try {
    if constexpr (std::is_floating_point_v<T>) {
      value = static_cast<T>(std::stod(text, &used));
    } else {
      value = static_cast<T>(std::stoll(text, &used));
    }
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    usage_error(fmt::format("{} '{}' is not a number", flag, text));
  if (value < lo || value > hi)
    usage_error(fmt::format("{} {} is outside {}..{}", flag, text, lo, hi));
  return value;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (flag == "--stage") {
      a.stage = number<int>(flag, value(), 0, 3);
    } else if (flag == "--steps") {
      a.steps = number<int>(flag, value(), 1, 10'000'000);
    } else if (flag == "--batch") {
      a.batch = number<std::int64_t>(flag, value(), 1, 1 << 20);
    } else if (flag == "--seq") {
      a.model.max_seq = number<std::int64_t>(flag, value(), 2, 1 << 20);
    } else if (flag == "--layers") {
      a.model.layers = number<std::int64_t>(flag, value(), 1, 4096);
    } else if (flag == "--width") {
      a.model.width = number<std::int64_t>(flag, value(), 8, 1 << 16);
    } else if (flag == "--heads") {
      a.model.heads = number<std::int64_t>(flag, value(), 1, 1024);
    } else if (flag == "--vocab") {
      a.model.vocab = number<std::int64_t>(flag, value(), 8, 1 << 20);
    } else if (flag == "--lr") {
      a.lr = number<double>(flag, value(), 0.0, 10.0);
    } else if (flag == "--clip") {
      a.clip = number<double>(flag, value(), 0.0, 1e9);
    } else if (flag == "--dtype") {
      a.dtype = value();
      if (a.dtype != "bf16" && a.dtype != "fp32") usage_error("--dtype must be bf16 or fp32");
    } else if (flag == "--device") {
      a.device = value();
      if (a.device != "auto" && a.device != "cpu" && a.device != "cuda") {
        usage_error("--device must be auto, cpu or cuda");
      }
    } else if (flag == "--allocator") {
      a.allocator = value();
      if (a.allocator != "gpumem" && a.allocator != "native") {
        usage_error("--allocator must be gpumem or native");
      }
    } else if (flag == "--no-reshard-after-forward") {
      a.reshard_after_forward = false;
    } else if (flag == "--no-prefetch") {
      a.prefetch = false;
    } else if (flag == "--bucket-mb") {
      a.bucket_mb = number<double>(flag, value(), 0.001, 1e6);
    } else if (flag == "--micro-batches") {
      a.micro_batches = number<int>(flag, value(), 1, 1 << 16);
    } else if (flag == "--no-decay-below-2d") {
      a.no_decay_below_2d = true;
    } else if (flag == "--log-every") {
      a.log_every = number<int>(flag, value(), 1, 1'000'000);
    } else if (flag == "--seed") {
      a.seed = number<std::uint64_t>(flag, value(), 0, ~std::uint64_t{0} >> 1);
    } else if (flag == "--record-native-history") {
      a.record_native_history = value();
    } else {
      usage_error(fmt::format("unknown option '{}'", flag));
    }
  }
  if (!a.record_native_history.empty() && a.allocator != "native") {
    usage_error("--record-native-history records PyTorch's native CUDA allocator: add "
                "--allocator native");
  }
  if (a.model.width % a.model.heads != 0) {
    usage_error(
        fmt::format("--width {} must be a multiple of --heads {}", a.model.width, a.model.heads));
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Data: a fixed random Markov chain over the vocabulary.

class MarkovData {
 public:
  MarkovData(std::int64_t vocab, std::uint64_t seed)
      : gen_(at::make_generator<at::CPUGeneratorImpl>(seed)) {
    successors_ = at::randint(vocab, {vocab, 4}, gen_, at::kLong);
    probs_ = at::tensor({0.55, 0.25, 0.15, 0.05}, at::kDouble);
    vocab_ = vocab;
  }
  static double entropy_nats() {
    return -(0.55 * std::log(0.55) + 0.25 * std::log(0.25) + 0.15 * std::log(0.15) +
             0.05 * std::log(0.05));
  }

  // The global batch of `step`: [rows, seq + 1] tokens, the same on every rank.
  at::Tensor batch(std::int64_t step, std::int64_t rows, std::int64_t seq) const {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1'000'003 * (step + 1));
    at::Tensor out = at::empty({rows, seq + 1}, at::kLong);
    at::Tensor cur = at::randint(vocab_, {rows}, g, at::kLong);
    out.select(1, 0).copy_(cur);
    const at::Tensor choice =
        at::multinomial(probs_.expand({rows * seq, 4}), 1, true, g).view({seq, rows});
    for (std::int64_t t = 1; t <= seq; ++t) {
      cur = successors_.index({cur, choice[t - 1]});
      out.select(1, t).copy_(cur);
    }
    return out;
  }

 private:
  at::Generator gen_;
  at::Tensor successors_, probs_;
  std::int64_t vocab_ = 0;
};

// ---------------------------------------------------------------------------------------------

struct AllocatorReading {
  double allocated = 0;       // bytes allocated now
  double peak_allocated = 0;  // since the last reset_allocator_peaks()
  double peak_reserved = 0;   // device memory the allocator held at most
};

// Statistics from gpumem's engine when it is installed, else from libtorch's CUDA caching
// allocator; c10's CPU allocator keeps none.
std::optional<AllocatorReading> read_allocator(const at::Device& device, bool gpumem) {
  c10::CachingDeviceAllocator::DeviceStats stats;
  if (gpumem) {
#if GPUMEM_ZERO_HAVE_GPUMEM_TORCH
    stats = gpumem::torch::stats(device);
#endif
  } else if (device.is_cuda()) {
    // libtorch's CUDA allocator sizes its per-device state when CUDA is initialized lazily
    // (the first CUDA tensor); before that its statistics fail with "Invalid device argument".
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    stats = c10::getDeviceAllocator(device.type())->getDeviceStats(device.index());
  } else {
    return std::nullopt;
  }
  constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return AllocatorReading{static_cast<double>(stats.allocated_bytes[kAll].current),
                          static_cast<double>(stats.allocated_bytes[kAll].peak),
                          static_cast<double>(stats.reserved_bytes[kAll].peak)};
}

void reset_allocator_peaks(const at::Device& device, bool gpumem) {
  if (gpumem) {
#if GPUMEM_ZERO_HAVE_GPUMEM_TORCH
    gpumem::torch::reset_peak_stats(device);
#endif
  } else if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::getDeviceAllocator(device.type())->resetPeakStats(device.index());
  }
}

void install_gpumem(c10::DeviceType type) {
#if GPUMEM_ZERO_HAVE_GPUMEM_TORCH
  auto parsed = gpumem::torch::config_from_environment();
  if (auto* error = std::get_if<gpumem::torch::ConfigError>(&parsed)) {
    throw std::invalid_argument(error->message);
  }
  const auto& config = std::get<gpumem::torch::Config>(parsed);
  if (type == c10::DeviceType::CUDA) {
    gpumem::torch::install(config);
  } else {
    gpumem::torch::install_cpu(config);
  }
#else
  (void)type;
  throw std::invalid_argument(
      "this zero_train was built without gpumem's torch adapter: use --allocator native");
#endif
}

void synchronize(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double mib(double bytes) { return bytes / (1 << 20); }

// One rank's numbers, gathered to every rank (a collective) for rank 0's per-rank report.
struct RankNumbers {
  double peak_reserved = -1, peak_allocated = -1, ms_per_step = 0, state_bytes = 0,
         formula_bytes = 0, allocator_state_bytes = -1, transient_peak_bytes = 0;
};
constexpr int kRankFields = 7;

std::vector<RankNumbers> gather_numbers(const zero::DistributedContext& ctx, const RankNumbers& n) {
  const int world = ctx.env.world_size;
  at::Tensor mine = at::tensor({n.peak_reserved, n.peak_allocated, n.ms_per_step, n.state_bytes,
                                n.formula_bytes, n.allocator_state_bytes,
                                n.transient_peak_bytes},
                               at::TensorOptions().dtype(at::kDouble))
                        .to(ctx.device);
  at::Tensor all = at::empty({world * kRankFields}, mine.options());
  ctx.backend->_allgather_base(all, mine)->wait();
  const at::Tensor host = all.cpu();
  const double* v = host.data_ptr<double>();
  std::vector<RankNumbers> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const double* f = v + r * kRankFields;
    out[static_cast<std::size_t>(r)] = RankNumbers{f[0], f[1], f[2], f[3], f[4], f[5], f[6]};
  }
  return out;
}

// The mean over ranks of a per-rank value: each rank's loss is its slice's mean, the slices are
// equal, so this is the loss of the global batch (comparable across world sizes).
double global_mean(const zero::DistributedContext& ctx, double value) {
  if (ctx.env.world_size == 1) return value;
  std::vector<at::Tensor> t{at::full({1}, value, at::TensorOptions().dtype(at::kDouble))
                                .to(ctx.device)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  ctx.backend->allreduce(t, opts)->wait();
  return t[0].item<double>() / ctx.env.world_size;
}

int run(const Args& args, zero::DistributedContext& ctx,
        std::optional<gpumem::examples::NativeHistoryRecorder>& history) {
  const zero::LaunchEnv& env = ctx.env;
  const bool gpumem = args.allocator == "gpumem";
  const int rank = env.rank, world = env.world_size;
  if (args.batch % (world * args.micro_batches) != 0) {
    throw std::invalid_argument(fmt::format(
        "--batch {} must be divisible by WORLD_SIZE={} x --micro-batches {}", args.batch, world,
        args.micro_batches));
  }
  const bool lead = rank == 0;
  auto say = [&](const std::string& s) {
    if (lead) std::fputs(s.c_str(), stdout), std::fflush(stdout);
  };
  const at::Device device = ctx.device;
  say(fmt::format("zero_train: {}, device {}, backend {}, allocator {}\n", zero::describe(env),
                  device.str(), ctx.backend->getBackendName(), args.allocator));

  const std::optional<AllocatorReading> before = read_allocator(device, gpumem);
  torch::manual_seed(args.seed);
  gpumem::toy::Gpt model(args.model);
  model->to(device);

  zero::ShardedTrainerOptions opts;
  opts.stage = args.stage;
  opts.compute_dtype = args.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  opts.adamw.lr = args.lr;
  opts.adamw.weight_decay = 0.1;
  opts.adamw.beta2 = 0.95;
  if (args.no_decay_below_2d) opts.param_groups.push_back(zero::no_weight_decay_below_2d());
  opts.max_grad_norm = args.clip;
  opts.bucket_size_bytes = static_cast<std::int64_t>(args.bucket_mb * (1 << 20));
  opts.reshard_after_forward = args.reshard_after_forward;
  opts.prefetch = args.prefetch;
  zero::ShardedTrainer trainer(
      model.ptr(), ctx.backend, opts,
      args.stage == 3 ? model->units() : std::vector<std::shared_ptr<nn::Module>>{});
  synchronize(device);
  const std::optional<AllocatorReading> after_setup = read_allocator(device, gpumem);
  // Peaks from here on are training's (the fp32 model built before wrapping is gone).
  if (history) history->note_peaks_before_reset();  // its file keeps the whole run's peaks
  reset_allocator_peaks(device, gpumem);
  say(fmt::format(
      "model: {} layers, width {}, {} heads, vocab {}, sequence {}: {} parameters ({:.1f} M)\n",
      args.model.layers, args.model.width, args.model.heads, args.model.vocab, args.model.max_seq,
      trainer.num_params(), trainer.num_params() / 1e6));
  const std::int64_t rows = args.batch / world / args.micro_batches;  // per rank, per micro-batch
  say(fmt::format("ZeRO stage {}, compute {}, {} units{}{}, global batch {} ({} per rank{})\n",
                  args.stage, args.dtype, trainer.num_units(),
                  args.stage == 3 ? (args.reshard_after_forward ? ", reshard after forward"
                                                                : ", keep after forward")
                                  : "",
                  args.stage == 3 ? (args.prefetch ? ", prefetch" : ", no prefetch") : "",
                  args.batch, args.batch / world,
                  args.micro_batches > 1
                      ? fmt::format(" in {} micro-batches of {}", args.micro_batches, rows)
                      : std::string()));

  MarkovData data(args.model.vocab, 42);
  say(fmt::format("data: Markov chain, loss floor {:.3f} nats, start ln(vocab) = {:.3f}\n",
                  MarkovData::entropy_nats(), std::log(static_cast<double>(args.model.vocab))));
  double first_loss = 0, last_loss = 0, timed_seconds = 0;
  int timed_steps = 0;
  const int warmup = std::min(5, args.steps - 1);  // NCCL setup, allocator growth
  for (int step = 0; step < args.steps; ++step) {
    // This rank's rows of the global batch, made before the clock starts.
    const at::Tensor mine = data.batch(step, args.batch, args.model.max_seq)
                                .narrow(0, rank * rows * args.micro_batches,
                                        rows * args.micro_batches)
                                .to(device);
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    double loss_value = 0;
    for (int m = 0; m < args.micro_batches; ++m) {
      const at::Tensor tokens = mine.narrow(0, m * rows, rows);
      const at::Tensor x = tokens.narrow(1, 0, args.model.max_seq);
      const at::Tensor y = tokens.narrow(1, 1, args.model.max_seq);
      const at::Tensor logits = model->forward_with(
          x, [](auto& unit, const at::Tensor& in) { return zero::call(unit, in); });
      at::Tensor loss = nn::functional::cross_entropy(
          logits.reshape({-1, args.model.vocab}).to(at::kFloat), y.reshape({-1}));
      if (args.micro_batches > 1) loss = loss / args.micro_batches;
      trainer.backward(loss);
      loss_value += loss.item<double>();
    }
    trainer.step();
    synchronize(device);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step >= warmup) {
      timed_seconds += seconds;
      ++timed_steps;
    }
    loss_value = global_mean(ctx, loss_value);  // outside the clock
    if (step == 0) first_loss = loss_value;
    last_loss = loss_value;
    if (step % args.log_every == 0 || step == args.steps - 1) {
      say(fmt::format("step {:5d}  loss {:.4f}  {:8.2f} ms\n", step, loss_value, seconds * 1e3));
    }
  }
  const std::optional<AllocatorReading> at_end = read_allocator(device, gpumem);
  const double ms_per_step = timed_steps > 0 ? timed_seconds / timed_steps * 1e3 : 0;
  const double tokens_per_s =
      timed_steps > 0 ? args.batch * args.model.max_seq / (timed_seconds / timed_steps) : 0;

  const zero::ModelStateBytes measured = trainer.model_state_bytes();
  const zero::ModelStateBytes formula = trainer.expected_model_state_bytes();
  say(fmt::format("\nrank 0 model states after {} steps (measured from the trainer's tensors):\n{}",
                  args.steps, zero::format_model_state_table(measured, formula)));
  say(fmt::format("transient peak (gradient buckets, gathered units): {:.1f} MiB\n",
                  mib(trainer.transient_peak_bytes())));
  RankNumbers mine;
  mine.ms_per_step = ms_per_step;
  mine.state_bytes = measured.total_bytes();
  mine.formula_bytes = formula.total_bytes();
  mine.transient_peak_bytes = trainer.transient_peak_bytes();
  if (at_end) {
    mine.peak_reserved = at_end->peak_reserved;
    mine.peak_allocated = at_end->peak_allocated;
  }
  if (before && after_setup && at_end) {
    // After the last step nothing but the model states (and the data set's few bytes) is alive.
    mine.allocator_state_bytes = at_end->allocated - before->allocated;
    say(fmt::format("allocator ({} statistics): allocated after setup {:.1f} MiB, after the last "
                    "step {:.1f} MiB (formula {:.1f} MiB, {:+.2f}%)\n",
                    gpumem ? "gpumem" : "libtorch", mib(after_setup->allocated - before->allocated),
                    mib(mine.allocator_state_bytes), mib(formula.total_bytes()),
                    (mine.allocator_state_bytes - formula.total_bytes()) /
                        formula.total_bytes() * 100));
  }
  say(fmt::format("loss (global batch) {:.4f} -> {:.4f}; {:.2f} ms/step, {:.0f} tokens/s over {} "
                  "timed steps\n",
                  first_loss, last_loss, ms_per_step, tokens_per_s, timed_steps));
  if (args.micro_batches > 1) {
    say("(with --micro-batches > 1 the gradients include the fp32 accumulator, 4 bytes per "
        "parameter / WORLD_SIZE beyond the formula)\n");
  }
  const std::vector<RankNumbers> ranks = gather_numbers(ctx, mine);
  say(fmt::format("\n{:>5}{:>19}{:>16}{:>10}{:>18}{:>14}{:>10}\n", "rank", "peak reserved MiB",
                  "peak alloc MiB", "ms/step", "states MiB", "formula MiB", "error"));
  for (int r = 0; r < world; ++r) {
    const RankNumbers& n = ranks[static_cast<std::size_t>(r)];
    auto mib_or_na = [](double bytes) {  // c10's CPU allocator keeps no statistics
      return bytes < 0 ? std::string("n/a") : fmt::format("{:.1f}", mib(bytes));
    };
    say(fmt::format("{:>5}{:>19}{:>16}{:>10.2f}{:>18.1f}{:>14.1f}{:>9.2f}%\n", r,
                    mib_or_na(n.peak_reserved), mib_or_na(n.peak_allocated), n.ms_per_step,
                    mib(n.state_bytes), mib(n.formula_bytes),
                    (n.state_bytes - n.formula_bytes) / n.formula_bytes * 100));
  }
  for (int r = 0; r < world; ++r) {
    const RankNumbers& n = ranks[static_cast<std::size_t>(r)];
    say(fmt::format(
        "RESULT impl=zero_train allocator={} stage={} world={} rank={} params={} dtype={} "
        "micro_batches={} first_loss={:.4f} last_loss={:.4f} ms_per_step={:.3f} "
        "peak_reserved_bytes={:.0f} peak_allocated_bytes={:.0f} state_bytes={:.0f} "
        "formula_bytes={:.0f} allocator_state_bytes={:.0f} transient_peak_bytes={:.0f}\n",
        args.allocator, args.stage, world, r, trainer.num_params(), args.dtype,
        args.micro_batches, first_loss, last_loss, n.ms_per_step, n.peak_reserved,
        n.peak_allocated, n.state_bytes, n.formula_bytes, n.allocator_state_bytes,
        n.transient_peak_bytes));
  }
  if (history) {
    synchronize(device);
    history->write();
    say(fmt::format("native allocator history written to {}\n", history->path()));
  }
  ctx.finish();  // barrier, watchdog off, orderly backend shutdown (ProcessGroupNCCL wants it)
  return 0;
}

int main(int argc, char** argv) {
  Args args;
  zero::DistributedContext ctx;
  std::optional<gpumem::examples::NativeHistoryRecorder> history;
  try {
    args = parse_args(argc, argv);
    const zero::LaunchEnv env = zero::launch_env_from_environment();
    c10::DeviceType type = c10::DeviceType::CPU;
    if (args.device == "cuda" || (args.device == "auto" && torch::cuda::is_available())) {
      type = c10::DeviceType::CUDA;
    }
    if (args.allocator == "gpumem") install_gpumem(type);  // before anything allocates
    if (!args.record_native_history.empty()) {
      if (type != c10::DeviceType::CUDA) {
        throw std::invalid_argument(
            "--record-native-history needs the CUDA device (--device cuda)");
      }
      // One file per rank when there are several (RANK is known before the process group).
      history.emplace(env.world_size > 1
                          ? fmt::format("{}.rank{}", args.record_native_history, env.rank)
                          : args.record_native_history,
                      env.local_rank);
    }
    ctx = zero::init_distributed(env, type);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_train: %s\n", e.what());
    return 1;
  }
  try {
    return run(args, ctx, history);
  } catch (const std::exception& e) {
    // With several ranks: what every rank reported, the first failure first.
    std::fprintf(stderr, "zero_train: %s\n", ctx.report_failure(e.what()).c_str());
    try {
      if (ctx.backend) ctx.backend->abort();  // NCCL: abort in-flight collectives, do not wait
    } catch (...) {
    }
    return 1;
  }
}
