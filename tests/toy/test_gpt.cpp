// gpumem::toy::Gpt: its parameter count matches the formula, bad options are named, one seed
// gives one model in every dtype, the units run in order through forward_with, and attention is
// causal (a later token never changes an earlier position's logits).
#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.h"
#include "gpumem/toy/gpt.h"

using gpumem::toy::Gpt;
using gpumem::toy::GptOptions;

namespace {

std::int64_t numel(Gpt& model) {
  std::int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

std::string error_of(const GptOptions& o) {
  try {
    gpumem::toy::check_options(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("toy gpt: the parameter count is the formula's, for each shape", "[toy]") {
  const std::vector<GptOptions> shapes = {
      GptOptions{},  // train_transformer's default: 4 layers, width 256, 8 heads, vocab 8192, 512 positions
      GptOptions{.layers = 1, .width = 32, .heads = 4, .vocab = 64, .max_seq = 64, .head_bias = true},
      GptOptions{.layers = 3, .width = 48, .heads = 6, .vocab = 97, .max_seq = 5},
  };
  for (const GptOptions& o : shapes) {
    Gpt model(o);
    CHECK(numel(model) == gpumem::toy::parameter_count(o));
    CHECK(model->blocks.size() == static_cast<std::size_t>(o.layers));
    CHECK(model->units().size() == static_cast<std::size_t>(o.layers) + 2);
  }
  // By hand for the default: embeddings 8192*256 + 512*256; per block 2 norms (2*512), qkv
  // 256*768+768, proj 256*256+256, fc 256*1024+1024, fc_out 1024*256+256; final norm 512; head
  // 256*8192 without a bias.
  CHECK(gpumem::toy::parameter_count(GptOptions{}) ==
        8192 * 256 + 512 * 256 + 4 * (1024 + 197376 + 65792 + 263168 + 262400) + 512 + 256 * 8192);
}

TEST_CASE("toy gpt: a bad option is named with its value and the rule", "[toy]") {
  CHECK(error_of(GptOptions{}).empty());
  CHECK(error_of(GptOptions{.width = 100}) ==
        "gpumem::toy::GptOptions: width is 100; it must be a positive multiple of heads (8)");
  CHECK(error_of(GptOptions{.layers = 0}) == "gpumem::toy::GptOptions: layers is 0; it must be at least 1");
  CHECK(error_of(GptOptions{.heads = 0}) == "gpumem::toy::GptOptions: heads is 0; it must be at least 1");
  CHECK(error_of(GptOptions{.vocab = 1}) == "gpumem::toy::GptOptions: vocab is 1; it must be at least 2");
  CHECK(error_of(GptOptions{.max_seq = 0}) == "gpumem::toy::GptOptions: max_seq is 0; it must be at least 1");
  CHECK(error_of(GptOptions{.dtype = c10::ScalarType::Long}).find("dtype is Long; it must be a floating type") !=
        std::string::npos);
  CHECK_THROWS_AS(Gpt(GptOptions{.width = 100}), std::invalid_argument);
}

TEST_CASE("toy gpt: one seed gives one model, rounded to the dtype", "[toy]") {
  const GptOptions o{.layers = 2, .width = 32, .heads = 4, .vocab = 50, .max_seq = 16};
  GptOptions bf16 = o;
  bf16.dtype = c10::ScalarType::BFloat16;
  torch::manual_seed(11);
  Gpt a(o);
  torch::manual_seed(11);
  Gpt b(o);
  torch::manual_seed(11);
  Gpt c(bf16);
  const auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  REQUIRE(pa.size() == pc.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].key());
    CHECK(pa[i].key() == pc[i].key());
    CHECK(torch::equal(pa[i].value(), pb[i].value()));
    CHECK(pc[i].value().scalar_type() == c10::ScalarType::BFloat16);
    CHECK(torch::equal(pa[i].value().to(torch::kBFloat16), pc[i].value()));
  }
  // The bf16 model runs and gives bf16 logits.
  const auto tokens = torch::randint(50, {2, 7}, torch::kLong);
  const auto logits = c->forward(tokens);
  CHECK(logits.scalar_type() == c10::ScalarType::BFloat16);
  CHECK(logits.sizes() == torch::IntArrayRef({2, 7, 50}));
}

TEST_CASE("toy gpt: forward_with runs the units in order; forward is forward_with calling forward", "[toy]") {
  torch::manual_seed(3);
  const GptOptions o{.layers = 3, .width = 16, .heads = 2, .vocab = 40, .max_seq = 12};
  Gpt model(o);
  const auto tokens = torch::randint(40, {3, 12}, torch::kLong);
  std::vector<const torch::nn::Module*> visited;
  const auto via_call = model->forward_with(tokens, [&](auto& unit, const at::Tensor& x) {
    visited.push_back(&*unit);
    return unit->forward(x);
  });
  const auto units = model->units();
  REQUIRE(visited.size() == units.size());
  for (std::size_t i = 0; i < units.size(); ++i) CHECK(visited[i] == units[i].get());
  CHECK(torch::equal(via_call, model->forward(tokens)));
  CHECK(via_call.sizes() == torch::IntArrayRef({3, 12, 40}));
}

TEST_CASE("toy gpt: attention is causal", "[toy]") {
  torch::manual_seed(5);
  Gpt model(GptOptions{.layers = 2, .width = 16, .heads = 4, .vocab = 30, .max_seq = 10});
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(30, {1, 10}, torch::kLong);
  const auto before = model->forward(tokens);
  tokens[0][7] = (tokens[0][7].item<std::int64_t>() + 1) % 30;
  const auto after = model->forward(tokens);
  CHECK(torch::equal(before.slice(1, 0, 7), after.slice(1, 0, 7)));      // positions before the change
  CHECK_FALSE(torch::equal(before.slice(1, 7, 10), after.slice(1, 7, 10)));  // the changed one and later
}
