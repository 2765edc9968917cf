#include "toy_training.h"

#include "rank_counting_cpu_allocator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gpumem/zero/sharded_trainer.h>
#include <gpumem/zero/unit_call.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <stdexcept>

namespace gpumem::zero::testing {

ToyBlockImpl::ToyBlockImpl(std::int64_t width, std::int64_t hidden) {
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  fc1 = register_module("fc1", torch::nn::Linear(width, hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, width));
}

at::Tensor ToyBlockImpl::forward(const at::Tensor& x) {
  return x + fc2(torch::nn::functional::gelu(fc1(norm(x))));
}

ToyNetImpl::ToyNetImpl() {
  input = register_module("input", torch::nn::Linear(kIn, kWidth));
  for (int i = 0; i < kBlocks; ++i) {
    blocks.push_back(register_module(fmt::format("block{}", i), ToyBlock(kWidth, kHidden)));
  }
  head = register_module("head", torch::nn::Linear(kWidth, kOut));
  out_scale = register_parameter("out_scale", at::ones({kOut}));
}

at::Tensor ToyNetImpl::forward(const at::Tensor& x) {
  at::Tensor h = gpumem::zero::call(input, x);
  for (ToyBlock& b : blocks) h = gpumem::zero::call(b, h);
  return gpumem::zero::call(head, h) * out_scale;
}

std::vector<std::shared_ptr<torch::nn::Module>> ToyNetImpl::units() {
  std::vector<std::shared_ptr<torch::nn::Module>> u{input.ptr()};
  for (ToyBlock& b : blocks) u.push_back(b.ptr());
  u.push_back(head.ptr());
  return u;
}

ToyNet make_toy_net(std::uint64_t seed) {
  torch::manual_seed(seed);
  return ToyNet();
}

std::vector<Batch> make_batches(int steps, int rows, std::uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // A fixed random teacher makes the targets learnable, so the loss falls and the gradients
  // keep a meaningful size for all 20 steps.
  const at::Tensor teacher = at::randn({ToyNetImpl::kIn, ToyNetImpl::kOut}, gen) * 0.5;
  std::vector<Batch> out;
  for (int s = 0; s < steps; ++s) {
    Batch b;
    b.x = at::randn({rows, ToyNetImpl::kIn}, gen);
    b.y = at::tanh(b.x.matmul(teacher));
    out.push_back(std::move(b));
  }
  return out;
}

Batch local_batch(const Batch& global, int rank, int world_size) {
  const std::int64_t rows = global.x.size(0);
  if (rows % world_size != 0) {
    throw std::invalid_argument(
        fmt::format("{} rows do not split over {} ranks", rows, world_size));
  }
  const std::int64_t n = rows / world_size;
  return Batch{global.x.narrow(0, rank * n, n), global.y.narrow(0, rank * n, n)};
}

at::Tensor toy_loss(ToyNet& net, const Batch& batch, c10::ScalarType compute) {
  const at::Tensor out = net->forward(batch.x.to(compute)).to(at::kFloat);
  return (out - batch.y).pow(2).mean();
}

Batch to_device(const Batch& batch, at::Device device) {
  return Batch{batch.x.to(device), batch.y.to(device)};
}

namespace {

NamedTensors named_fp32(ToyNet& net) {
  NamedTensors out;
  for (const auto& item : net->named_parameters()) {
    out.emplace_back(item.key(), item.value().detach().to(at::kCPU, at::kFloat).clone());
  }
  return out;
}

torch::optim::AdamWOptions torch_adamw(const AdamWOptions& a) {
  torch::optim::AdamWOptions o(a.lr);
  o.betas({a.beta1, a.beta2});
  o.eps(a.eps);
  o.weight_decay(a.weight_decay);
  return o;
}

}  // namespace

NamedTensors train_reference(std::uint64_t seed, const std::vector<Batch>& batches,
                             const ShardedTrainerOptions& options, at::Device device,
                             int data_parallel_ranks) {
  ToyNet master = make_toy_net(seed);
  master->to(device);
  const bool mixed = options.compute_dtype != at::kFloat;
  ToyNet compute = mixed ? make_toy_net(seed) : master;
  if (mixed) compute->to(device, options.compute_dtype);
  torch::optim::AdamW optimizer(master->parameters(), torch_adamw(options.adamw));
  const auto master_params = master->parameters();
  const auto compute_params = compute->parameters();
  for (const Batch& batch : batches) {
    if (mixed) {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < master_params.size(); ++i)
        compute_params[i].copy_(master_params[i]);
    }
    optimizer.zero_grad();
    if (data_parallel_ranks == 1) {
      compute->zero_grad();
      toy_loss(compute, to_device(batch, device), options.compute_dtype).backward();
      for (std::size_t i = 0; i < master_params.size(); ++i) {
        master_params[i].mutable_grad() = compute_params[i].grad().to(at::kFloat);
      }
    } else {
      std::vector<at::Tensor> sums(master_params.size());
      for (int r = 0; r < data_parallel_ranks; ++r) {
        compute->zero_grad();
        toy_loss(compute, to_device(local_batch(batch, r, data_parallel_ranks), device),
                 options.compute_dtype)
            .backward();
        for (std::size_t i = 0; i < sums.size(); ++i) {
          const at::Tensor g = compute_params[i].grad().to(at::kDouble);
          sums[i] = r == 0 ? g : sums[i] + g;
        }
      }
      for (std::size_t i = 0; i < sums.size(); ++i) {
        master_params[i].mutable_grad() =
            (sums[i] / data_parallel_ranks).to(options.compute_dtype).to(at::kFloat);
      }
    }
    if (options.max_grad_norm > 0)
      torch::nn::utils::clip_grad_norm_(master_params, options.max_grad_norm);
    optimizer.step();
  }
  return named_fp32(master);
}

ShardedRun train_sharded(int world_size, const ShardedTrainerOptions& options, std::uint64_t seed,
                         const std::vector<Batch>& batches, const Injection& inject,
                         std::chrono::milliseconds timeout,
                         const std::function<void()>& at_quiescence) {
  // Models are built here, one thread, so the seeded initialization is the same on every rank.
  std::vector<ToyNet> models;
  for (int r = 0; r < world_size; ++r) models.push_back(make_toy_net(seed));
  ShardedRun run;
  run.ranks.resize(world_size);
  const auto start = std::chrono::steady_clock::now();
  run.errors = run_ranks(
      world_size,
      [&](int rank, c10::intrusive_ptr<c10d::Backend> backend) {
        RankCountingCpuAllocator& counter = RankCountingCpuAllocator::instance();
        RankCountingCpuAllocator::RankTag tag(rank);
        // Deltas from here: tensors charged to this rank by earlier runs may still be alive.
        const std::int64_t live_at_start = counter.installed() ? counter.live_bytes(rank) : 0;
        if (counter.installed()) counter.reset_peak(rank);
        ToyNet& net = models[rank];
        ShardedTrainer trainer(
            net.ptr(), backend, options,
            options.stage == 3 ? net->units() : std::vector<std::shared_ptr<torch::nn::Module>>{});
        for (std::size_t s = 0; s < batches.size(); ++s) {
          const at::Tensor loss =
              toy_loss(net, local_batch(batches[s], rank, world_size), options.compute_dtype);
          if (inject) inject(rank, static_cast<int>(s), net);
          trainer.backward(loss);
          trainer.step();
        }
        if (at_quiescence) {
          backend->barrier(c10d::BarrierOptions())->wait();
          if (rank == 0) at_quiescence();
          backend->barrier(c10d::BarrierOptions())->wait();
        }
        RankReport& report = run.ranks[rank];
        if (counter.installed()) {
          report.allocator_live_bytes = counter.live_bytes(rank) - live_at_start;
          report.allocator_peak_bytes = counter.peak_bytes(rank) - live_at_start;
        }
        NamedTensors params = trainer.gather_full_parameters();
        report.states = trainer.model_state_bytes();
        report.peak_states = trainer.peak_model_state_bytes();
        report.expected = trainer.expected_model_state_bytes();
        report.transient_peak_bytes = trainer.transient_peak_bytes();
        report.num_params = trainer.num_params();
        if (auto* threads = dynamic_cast<ThreadBackend*>(backend.get())) {
          report.collectives = threads->issued();
        }
        if (rank == 0) run.params = std::move(params);
      },
      timeout);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

Difference compare(const NamedTensors& a, const NamedTensors& b, double atol, double rtol) {
  if (a.size() != b.size()) {
    throw std::invalid_argument(fmt::format("{} vs {} parameters", a.size(), b.size()));
  }
  Difference d;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first) {
      throw std::invalid_argument(
          fmt::format("parameter {} is '{}' vs '{}'", i, a[i].first, b[i].first));
    }
    const at::Tensor x = a[i].second.to(at::kCPU, at::kFloat);
    const at::Tensor y = b[i].second.to(at::kCPU, at::kFloat);
    const at::Tensor diff = (x - y).abs();
    const double max_abs = diff.max().item<double>();
    const double violation = (diff - (atol + rtol * y.abs())).max().item<double>();
    if (max_abs > d.max_abs) d.max_abs = max_abs;
    if (violation > d.max_violation) {
      d.max_violation = violation;
      d.worst_param = a[i].first;
    }
  }
  return d;
}

}  // namespace gpumem::zero::testing
