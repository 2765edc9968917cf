// gpumem::checkpoint and CheckpointedSequential on the CPU: gradients bitwise equal to running
// without checkpointing (dropout included), the random stream left untouched, parameters
// reached when no input requires grad, undeclared tensors refused, nesting, autocast.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "catch.h"
#include "contains.h"
#include "gpumem/ckpt/checkpoint.h"
#include "gpumem/ckpt/checkpointed_sequential.h"

namespace ckpt = gpumem::ckpt;
using ckpt::TensorList;

namespace {

struct Deterministic {
  Deterministic() { torch::set_num_threads(1); }
};
const Deterministic deterministic;

// A block with parameters, a nonlinearity and dropout (random draws in forward).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t d)
      : fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))),
        fc2(register_module("fc2", torch::nn::Linear(2 * d, d))),
        drop(register_module("drop", torch::nn::Dropout(0.25))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + fc2(drop(torch::gelu(fc1(x))));
  }
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

TensorList grads_of(const std::vector<torch::Tensor>& params) {
  TensorList g;
  for (const auto& p : params) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return g;
}

void zero(const std::vector<torch::Tensor>& params) {
  for (auto p : params) p.mutable_grad() = torch::Tensor();
}

bool bitwise_equal(const TensorList& a, const TensorList& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (a[i].defined() && !torch::equal(a[i], b[i])) return false;
  }
  return true;
}

struct Run {
  torch::Tensor out, input_grad, after;  // after: a draw from the generator after backward
  TensorList param_grads;
};

// One training step of fn on a fresh input: seeds, forward, backward, then one more draw.
template <typename Fn>
Run step(Fn&& fn, const std::vector<torch::Tensor>& params, bool input_requires_grad = true) {
  zero(params);
  torch::manual_seed(1234);
  torch::Tensor x = torch::randn({8, 16}).requires_grad_(input_requires_grad);
  Run r;
  r.out = fn(x);
  (r.out * r.out).sum().backward();
  if (input_requires_grad) r.input_grad = x.grad().clone();
  r.param_grads = grads_of(params);
  r.after = torch::rand({4});
  return r;
}

}  // namespace

TEST_CASE("checkpointed gradients are bitwise identical, dropout included", "[ckpt][torch]") {
  Block a(16), b(16);
  std::vector<torch::Tensor> params = a->parameters();
  for (auto& p : b->parameters()) params.push_back(p);
  auto plain = [&](const torch::Tensor& x) { return b(a(x)); };
  auto ab = [&](const torch::Tensor& x) { return b(a(x)); };

  const Run base = step(plain, params);
  const Run ck = step([&](const torch::Tensor& x) { return ckpt::checkpoint(ab, x, params); },
                      params);
  CHECK(torch::equal(base.out, ck.out));
  CHECK(torch::equal(base.input_grad, ck.input_grad));
  CHECK(bitwise_equal(base.param_grads, ck.param_grads));
  CHECK(torch::equal(base.after, ck.after));  // the recompute left the random stream alone

  // Without restoring the generator the recompute draws other masks: the check above matters.
  ckpt::CheckpointOptions no_rng;
  no_rng.preserve_rng_state = false;
  const Run drift = step(
      [&](const torch::Tensor& x) { return ckpt::checkpoint(ab, x, params, no_rng); }, params);
  CHECK(torch::equal(base.out, drift.out));
  CHECK_FALSE(bitwise_equal(base.param_grads, drift.param_grads));
}

TEST_CASE("torch::autograd::grad reaches through a checkpoint", "[ckpt][torch]") {
  Block a(16);
  auto params = a->parameters();
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({4, 16}, torch::requires_grad());
  torch::manual_seed(8);
  auto g_plain = torch::autograd::grad({a(x).sum()}, {x})[0];
  torch::manual_seed(8);
  auto y = ckpt::checkpoint([&](const torch::Tensor& t) { return a(t); }, x, params);
  auto g_ckpt = torch::autograd::grad({y.sum()}, {x})[0];
  CHECK(torch::equal(g_plain, g_ckpt));
  for (const auto& p : params) CHECK_FALSE(p.grad().defined());  // grad() accumulates nothing
}

TEST_CASE("parameters get gradients when no input requires grad", "[ckpt][torch]") {
  Block a(16);
  auto params = a->parameters();
  auto fn = [&](const torch::Tensor& x) { return a(x); };
  const Run base = step(fn, params, /*input_requires_grad=*/false);
  const Run ck = step([&](const torch::Tensor& x) { return ckpt::checkpoint(fn, x, params); },
                      params, false);
  for (const auto& g : ck.param_grads) REQUIRE(g.defined());
  CHECK(bitwise_equal(base.param_grads, ck.param_grads));

  // Forgetting the parameters is refused at once, not discovered as missing gradients later.
  torch::Tensor data = torch::randn({8, 16});
  CHECK_THROWS_WITH(ckpt::checkpoint(fn, data),
                    CKPT_CONTAINS("no input or param requires grad, yet fn's output does"));
}

TEST_CASE("tensors requiring grad that fn did not declare are refused", "[ckpt][torch]") {
  Block a(16);
  torch::Tensor x = torch::randn({8, 16}, torch::requires_grad());
  // Parameters used but not passed, while the input requires grad: found in backward.
  auto y = ckpt::checkpoint([&](const torch::Tensor& t) { return a(t); }, x);
  CHECK_THROWS_WITH(y.sum().backward(),
                    CKPT_CONTAINS("passed neither in inputs nor in params"));

  // A tensor computed outside fn and captured by it.
  torch::Tensor w = torch::randn({16}, torch::requires_grad());
  torch::Tensor scale = w * 2;
  auto z = ckpt::checkpoint([&](const torch::Tensor& t) { return t * scale; }, x, {w});
  CHECK_THROWS_WITH(z.sum().backward(), CKPT_CONTAINS("computed outside fn"));

  // Declared, the same computation is fine.
  auto ok = ckpt::checkpoint([&](const torch::Tensor& t) { return t * (w * 2); }, x, {w});
  ok.sum().backward();
  CHECK(torch::allclose(w.grad(), 2 * x.sum(0)));
}

TEST_CASE("checkpoints nest", "[ckpt][torch]") {
  Block a(16), b(16), c(16);
  std::vector<torch::Tensor> params;
  for (auto* m : {&a, &b, &c}) {
    for (auto& p : (*m)->parameters()) params.push_back(p);
  }
  int outer_calls = 0, inner_calls = 0;
  auto inner = [&](const torch::Tensor& t) {
    ++inner_calls;
    return b(t);
  };
  auto outer = [&](const torch::Tensor& t) {
    ++outer_calls;
    return c(ckpt::checkpoint(inner, a(t), b->parameters()));
  };
  const Run base = step([&](const torch::Tensor& x) { return c(b(a(x))); }, params);
  const Run ck = step(
      [&](const torch::Tensor& x) { return ckpt::checkpoint(outer, x, params); }, params);
  CHECK(torch::equal(base.out, ck.out));
  CHECK(torch::equal(base.input_grad, ck.input_grad));
  CHECK(bitwise_equal(base.param_grads, ck.param_grads));
  CHECK(torch::equal(base.after, ck.after));
  // Outer: forward + recompute. Inner: plain in the outer forward (no grad), checkpointed in
  // the outer recompute, recomputed in its own backward.
  CHECK(outer_calls == 2);
  CHECK(inner_calls == 3);
}

TEST_CASE("the recompute runs under the forward's autocast state", "[ckpt][torch]") {
  Block a(16), b(16);
  std::vector<torch::Tensor> params = a->parameters();
  for (auto& p : b->parameters()) params.push_back(p);
  // Backward runs with autocast off, so the recompute is only bitwise equal if it runs in bf16
  // as the forward did. b also runs a second time outside the checkpoint (shared weights),
  // with the autocast cast cache on in the checkpointed run: both of its uses must still get
  // their gradients. The baseline runs with the cache off, so that each use of b casts its
  // weights separately as the checkpointed run does (a shared cached cast sums the two uses'
  // gradients in bf16 before converting them, which rounds differently).
  auto model = [&](const torch::Tensor& x, bool use_ckpt) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_cache_enabled(use_ckpt);
    auto mid = use_ckpt ? ckpt::checkpoint([&](const torch::Tensor& t) { return b(a(t)); }, x,
                                           params)
                        : b(a(x));
    auto out = b(mid).to(torch::kFloat);
    at::autocast::set_autocast_enabled(at::kCPU, false);  // backward runs outside autocast
    at::autocast::set_autocast_cache_enabled(true);
    return out;
  };
  const Run base = step([&](const torch::Tensor& x) { return model(x, false); }, params);
  at::autocast::clear_cache();
  const Run ck = step([&](const torch::Tensor& x) { return model(x, true); }, params);
  at::autocast::clear_cache();
  CHECK(base.out.scalar_type() == torch::kFloat);
  CHECK(torch::equal(base.out, ck.out));
  CHECK(bitwise_equal(base.param_grads, ck.param_grads));
  CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));  // left as the caller set it
  CHECK(at::autocast::is_autocast_cache_enabled());
}

TEST_CASE("checkpoint outside grad mode, and non-differentiable outputs", "[ckpt][torch]") {
  Block a(16);
  torch::Tensor x = torch::randn({4, 16}, torch::requires_grad());
  {
    torch::NoGradGuard no_grad;
    auto y = ckpt::checkpoint([&](const torch::Tensor& t) { return a(t); }, x, a->parameters());
    CHECK_FALSE(y.requires_grad());
  }
  auto outs = ckpt::checkpoint(
      [&](const TensorList& in) {
        auto h = a(in[0]);
        return TensorList{h, h.argmax(1)};
      },
      {x}, a->parameters());
  REQUIRE(outs.size() == 2);
  CHECK(outs[0].requires_grad());
  CHECK_FALSE(outs[1].requires_grad());
  outs[0].sum().backward();
  CHECK(x.grad().defined());
}

TEST_CASE("CheckpointedSequential is a drop-in for Sequential", "[ckpt][torch]") {
  torch::manual_seed(3);
  torch::nn::Sequential seq(Block(16), Block(16), Block(16), Block(16), Block(16));
  ckpt::CheckpointedSequential cs(seq);
  REQUIRE(cs->size() == 5);
  const auto names_seq = seq->named_parameters().keys();
  const auto names_cs = cs->named_parameters().keys();
  CHECK(names_seq == names_cs);
  const auto params = cs->parameters();

  const Run base = step([&](const torch::Tensor& x) { return seq->forward(x); }, params);
  for (const auto& plan : {ckpt::Plan::every(5), ckpt::Plan::sqrt_n(5),
                           ckpt::Plan(5, {{1, 4}}), ckpt::Plan::none(5)}) {
    cs->set_plan(plan);
    const Run ck = step([&](const torch::Tensor& x) { return cs->forward(x); }, params);
    INFO(plan.to_string());
    CHECK(torch::equal(base.out, ck.out));
    CHECK(torch::equal(base.input_grad, ck.input_grad));
    CHECK(bitwise_equal(base.param_grads, ck.param_grads));
    CHECK(torch::equal(base.after, ck.after));
  }
  // The first segment's input needs no grad; its parameters still get gradients.
  cs->set_plan(ckpt::Plan(5, {{0, 2}}));
  const Run no_input_grad =
      step([&](const torch::Tensor& x) { return cs->forward(x); }, params, false);
  for (const auto& g : no_input_grad.param_grads) CHECK(g.defined());

  CHECK_THROWS_WITH(cs->set_plan(ckpt::Plan::none(4)), CKPT_CONTAINS("n_modules = size()"));
}

TEST_CASE("CUDA: dropout recomputes the same masks from the device's generator",
          "[ckpt][torch][gpu]") {
  if (!torch::cuda::is_available()) GPUMEM_SKIP("no CUDA device");
  const torch::Device cuda(torch::kCUDA, 0);
  Block a(64), b(64);
  a->to(cuda);
  b->to(cuda);
  std::vector<torch::Tensor> params = a->parameters();
  for (auto& p : b->parameters()) params.push_back(p);
  auto ab = [&](const torch::Tensor& x) { return b(a(x)); };
  auto run = [&](bool use_ckpt, bool preserve) {
    zero(params);
    torch::manual_seed(99);  // seeds the CPU and every CUDA generator
    torch::Tensor x = torch::randn({256, 64}, torch::TensorOptions(cuda).requires_grad(true));
    ckpt::CheckpointOptions opts;
    opts.preserve_rng_state = preserve;
    torch::Tensor out = use_ckpt ? ckpt::checkpoint(ab, x, params, opts) : ab(x);
    out.pow(2).sum().backward();
    Run r;
    r.out = out.detach().cpu();
    r.input_grad = x.grad().cpu();
    for (const auto& g : grads_of(params)) r.param_grads.push_back(g.cpu());
    r.after = torch::rand({4}, torch::TensorOptions(cuda)).cpu();
    return r;
  };
  // Outputs and the random stream must match bitwise. Gradients too on the CPU; on the GPU
  // cuBLAS may pick another algorithm for the backward's GEMMs, so they must match closely
  // (dropout masks drawn from another generator state would change them by far more).
  auto close = [](const TensorList& a, const TensorList& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!torch::allclose(a[i], b[i], /*rtol=*/1e-5, /*atol=*/1e-6)) return false;
    }
    return true;
  };
  const Run base = run(false, true);
  const Run ck = run(true, true);
  CHECK(torch::equal(base.out, ck.out));
  CHECK(torch::equal(base.after, ck.after));  // the device's random stream is left alone
  CHECK(torch::allclose(base.input_grad, ck.input_grad, 1e-5, 1e-6));
  CHECK(close(base.param_grads, ck.param_grads));
  const Run drift = run(true, false);
  CHECK_FALSE(close(base.param_grads, drift.param_grads));
}
