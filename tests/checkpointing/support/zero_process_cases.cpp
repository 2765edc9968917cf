#include "zero_process_cases.h"

#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>

namespace gpumem::zero::testing {

ShardedTrainerOptions fp32_options(int stage) {
  ShardedTrainerOptions o;
  o.stage = stage;
  o.compute_dtype = at::kFloat;
  o.adamw.lr = 1e-2;
  o.adamw.weight_decay = 0.05;
  o.bucket_size_bytes = 8 << 10;
  o.max_inflight_reductions = 2;
  return o;
}

namespace {

torch::optim::AdamWOptions torch_adamw(const AdamWOptions& a, double lr, double weight_decay) {
  torch::optim::AdamWOptions o(lr);
  o.betas({a.beta1, a.beta2});
  o.eps(a.eps);
  o.weight_decay(weight_decay);
  return o;
}

ProcessCase make_case(std::string name, ShardedTrainerOptions options) {
  ProcessCase c;
  c.name = std::move(name);
  c.options = std::move(options);
  return c;
}

}  // namespace

std::vector<ProcessCase> process_cases() {
  std::vector<ProcessCase> out;
  for (int stage : {0, 1, 2, 3}) {
    out.push_back(make_case(fmt::format("stage{}", stage), fp32_options(stage)));
  }
  for (int stage : {0, 1, 2, 3}) {
    ProcessCase c = make_case(fmt::format("accumulate3_stage{}", stage), fp32_options(stage));
    c.micro_batches = 3;
    out.push_back(c);
  }
  for (int stage : {0, 3}) {
    // A whole stage-3 unit (block1) and parameters of two others (the input projection's
    // bias, the root's out_scale) frozen.
    ProcessCase c = make_case(fmt::format("frozen_stage{}", stage), fp32_options(stage));
    c.frozen = {"block1.norm.weight", "block1.norm.bias", "block1.fc1.weight", "block1.fc1.bias",
                "block1.fc2.weight",  "block1.fc2.bias",  "input.bias",        "out_scale"};
    out.push_back(c);
  }
  for (int stage : {1, 3}) {
    ProcessCase c = make_case(fmt::format("param_groups_stage{}", stage), fp32_options(stage));
    c.options.adamw.weight_decay = 0.3;  // large, so a group that misses it shows
    c.options.param_groups.push_back(no_weight_decay_below_2d());
    ParamGroup head;
    head.name = "head";
    head.match = [](const std::string& name, const at::Tensor&) {
      return name.rfind("head.", 0) == 0;
    };
    head.lr = 3e-3;
    c.options.param_groups.push_back(head);
    out.push_back(c);
  }
  for (int stage : {0, 1, 2, 3}) {
    ProcessCase c = make_case(fmt::format("memory_bf16_stage{}", stage), ShardedTrainerOptions{});
    c.options.stage = stage;  // bf16 compute, fp32 master weights and Adam moments
    c.options.bucket_size_bytes = 4 << 10;
    c.check_params = false;
    c.check_memory = true;
    out.push_back(c);
  }
  return out;
}

std::vector<Batch> process_batches() { return make_batches(kProcessSteps, kProcessRows, 77); }

void freeze(ToyNet& net, const std::vector<std::string>& names) {
  auto params = net->named_parameters();
  for (const std::string& name : names) {
    at::Tensor* p = params.find(name);
    if (p == nullptr) throw std::invalid_argument("no parameter named " + name + " to freeze");
    p->set_requires_grad(false);
  }
}

at::Tensor micro_batch_loss(ToyNet& net, const Batch& global, int rank, int world_size,
                            int micro, int micro_batches, c10::ScalarType compute) {
  const Batch part = local_batch(global, micro, micro_batches);
  const Batch mine = local_batch(part, rank, world_size);
  at::Tensor loss = toy_loss(net, mine, compute);
  return micro_batches == 1 ? loss : loss / micro_batches;
}

NamedTensors train_reference_case(const ProcessCase& c, const std::vector<Batch>& batches) {
  if (c.options.compute_dtype != at::kFloat) {
    throw std::invalid_argument("train_reference_case: fp32 compute only");
  }
  ToyNet net = make_toy_net(kProcessSeed);
  freeze(net, c.frozen);
  // torch::optim::AdamW with the same groups: the first matching group wins, the rest default.
  const AdamWOptions& a = c.options.adamw;
  std::vector<std::vector<at::Tensor>> members(c.options.param_groups.size() + 1);
  for (const auto& item : net->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    std::size_t g = 0;
    for (std::size_t i = 0; i < c.options.param_groups.size(); ++i) {
      if (c.options.param_groups[i].match(item.key(), item.value())) {
        g = i + 1;
        break;
      }
    }
    members[g].push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (std::size_t g = 0; g < members.size(); ++g) {
    if (members[g].empty()) continue;
    double lr = a.lr, wd = a.weight_decay;
    if (g > 0) {
      lr = c.options.param_groups[g - 1].lr.value_or(lr);
      wd = c.options.param_groups[g - 1].weight_decay.value_or(wd);
    }
    groups.emplace_back(members[g], std::make_unique<torch::optim::AdamWOptions>(
                                        torch_adamw(a, lr, wd)));
  }
  torch::optim::AdamW optimizer(std::move(groups), torch_adamw(a, a.lr, a.weight_decay));
  for (const Batch& batch : batches) {
    optimizer.zero_grad();
    for (int m = 0; m < c.micro_batches; ++m) {
      micro_batch_loss(net, batch, 0, 1, m, c.micro_batches, at::kFloat).backward();
    }
    optimizer.step();
  }
  NamedTensors out;
  for (const auto& item : net->named_parameters()) {
    out.emplace_back(item.key(), item.value().detach().clone());
  }
  return out;
}

void write_params(const std::string& path, const NamedTensors& params) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& [name, t] : params) {
    const at::Tensor v = t.to(at::kCPU, at::kFloat).contiguous();
    const std::uint64_t name_size = name.size();
    const std::int64_t numel = v.numel();
    f.write(reinterpret_cast<const char*>(&name_size), sizeof name_size);
    f.write(name.data(), static_cast<std::streamsize>(name.size()));
    f.write(reinterpret_cast<const char*>(&numel), sizeof numel);
    const std::int64_t dims = v.dim();
    f.write(reinterpret_cast<const char*>(&dims), sizeof dims);
    for (std::int64_t d : v.sizes()) f.write(reinterpret_cast<const char*>(&d), sizeof d);
    f.write(reinterpret_cast<const char*>(v.data_ptr<float>()),
            static_cast<std::streamsize>(numel * sizeof(float)));
  }
  if (!f) throw std::runtime_error("could not write " + path);
}

NamedTensors read_params(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("could not open " + path + " (the rank wrote no result)");
  NamedTensors out;
  std::uint64_t name_size = 0;
  while (f.read(reinterpret_cast<char*>(&name_size), sizeof name_size)) {
    std::string name(name_size, '\0');
    std::int64_t numel = 0, dims = 0;
    f.read(name.data(), static_cast<std::streamsize>(name_size));
    f.read(reinterpret_cast<char*>(&numel), sizeof numel);
    f.read(reinterpret_cast<char*>(&dims), sizeof dims);
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(dims));
    for (std::int64_t& d : sizes) f.read(reinterpret_cast<char*>(&d), sizeof d);
    at::Tensor t = at::empty(sizes, at::kFloat);
    f.read(reinterpret_cast<char*>(t.data_ptr<float>()),
           static_cast<std::streamsize>(numel * sizeof(float)));
    if (!f) throw std::runtime_error("truncated parameter file " + path);
    out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

void write_rank_state(const std::string& path, const RankStateRecord& r) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("could not write " + path);
  const ModelStateBytes& m = r.measured;
  const ModelStateBytes& e = r.expected;
  std::fprintf(f, "%.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %lld\n", m.compute_params_bytes,
               m.grads_bytes, m.master_params_bytes, m.optimizer_state_bytes,
               e.compute_params_bytes, e.grads_bytes, e.master_params_bytes,
               e.optimizer_state_bytes, r.allocator_live_bytes,
               static_cast<long long>(r.num_params));
  std::fclose(f);
}

RankStateRecord read_rank_state(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) throw std::runtime_error("could not open " + path + " (the rank wrote none)");
  RankStateRecord r;
  ModelStateBytes& m = r.measured;
  ModelStateBytes& e = r.expected;
  long long params = 0;
  const int n = std::fscanf(f, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %lld", &m.compute_params_bytes,
                            &m.grads_bytes, &m.master_params_bytes, &m.optimizer_state_bytes,
                            &e.compute_params_bytes, &e.grads_bytes, &e.master_params_bytes,
                            &e.optimizer_state_bytes, &r.allocator_live_bytes, &params);
  std::fclose(f);
  if (n != 10) throw std::runtime_error("malformed rank state file " + path);
  r.num_params = params;
  return r;
}

}  // namespace gpumem::zero::testing
