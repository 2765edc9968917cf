#include "gpumem/toy/gpt.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>

#include <stdexcept>
#include <string>

namespace gpumem::toy {

namespace {

void require(bool ok, const std::string& field, std::int64_t value, const std::string& rule) {
  if (!ok) {
    throw std::invalid_argument("gpumem::toy::GptOptions: " + field + " is " + std::to_string(value) +
                                "; it must be " + rule);
  }
}

}  // namespace

void check_options(const GptOptions& o) {
  require(o.layers >= 1, "layers", o.layers, "at least 1");
  require(o.heads >= 1, "heads", o.heads, "at least 1");
  require(o.width >= 1 && o.width % o.heads == 0, "width", o.width,
          "a positive multiple of heads (" + std::to_string(o.heads) + ")");
  require(o.vocab >= 2, "vocab", o.vocab, "at least 2");
  require(o.max_seq >= 1, "max_seq", o.max_seq, "at least 1");
  if (!c10::isFloatingType(o.dtype)) {
    throw std::invalid_argument(std::string("gpumem::toy::GptOptions: dtype is ") + c10::toString(o.dtype) +
                                "; it must be a floating type (float, bfloat16, half, double)");
  }
}

std::int64_t parameter_count(const GptOptions& o) {
  const std::int64_t w = o.width;
  const std::int64_t layer_norm = 2 * w;  // weight and bias
  const std::int64_t block = 2 * layer_norm     // ln1, ln2
                             + (w * 3 * w + 3 * w)  // qkv
                             + (w * w + w)          // proj
                             + (w * 4 * w + 4 * w)  // fc
                             + (4 * w * w + w);     // fc_out
  return o.vocab * w + o.max_seq * w  // embeddings
         + o.layers * block + layer_norm + w * o.vocab + (o.head_bias ? o.vocab : 0);
}

EmbeddingsImpl::EmbeddingsImpl(const GptOptions& o) {
  tok = register_module("tok", torch::nn::Embedding(o.vocab, o.width));
  pos = register_module("pos", torch::nn::Embedding(o.max_seq, o.width));
}

at::Tensor EmbeddingsImpl::forward(const at::Tensor& tokens) {
  const at::Tensor positions = at::arange(tokens.size(1), tokens.options());
  return tok(tokens) + pos(positions).unsqueeze(0);
}

BlockImpl::BlockImpl(const GptOptions& o) : heads(o.heads) {
  const std::int64_t w = o.width;
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({w})));
  qkv = register_module("qkv", torch::nn::Linear(w, 3 * w));
  proj = register_module("proj", torch::nn::Linear(w, w));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({w})));
  fc = register_module("fc", torch::nn::Linear(w, 4 * w));
  fc_out = register_module("fc_out", torch::nn::Linear(4 * w, w));
}

at::Tensor BlockImpl::forward(at::Tensor x) {
  const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  // [b, t, 3 * d] -> q, k, v of [b, heads, t, d / heads]
  const at::Tensor parts = qkv(ln1(x)).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
  const at::Tensor y = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], /*attn_mask=*/{},
                                                        /*dropout_p=*/0.0, /*is_causal=*/true);
  x = x + proj(y.transpose(1, 2).reshape({b, t, d}));
  return x + fc_out(torch::nn::functional::gelu(fc(ln2(x))));
}

HeadImpl::HeadImpl(const GptOptions& o) {
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width})));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(o.width, o.vocab).bias(o.head_bias)));
}

at::Tensor HeadImpl::forward(const at::Tensor& x) { return proj(ln_f(x)); }

GptImpl::GptImpl(const GptOptions& o) : options(o) {
  check_options(o);
  embed = register_module("embed", Embeddings(o));
  for (std::int64_t i = 0; i < o.layers; ++i) {
    blocks.push_back(register_module("block" + std::to_string(i), Block(o)));
  }
  head = register_module("head", Head(o));
  if (o.dtype != c10::ScalarType::Float) to(o.dtype);
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  return forward_with(tokens, [](auto& unit, const at::Tensor& x) { return unit->forward(x); });
}

std::vector<std::shared_ptr<::torch::nn::Module>> GptImpl::units() const {
  std::vector<std::shared_ptr<::torch::nn::Module>> out{embed.ptr()};
  for (const Block& block : blocks) out.push_back(block.ptr());
  out.push_back(head.ptr());
  return out;
}

}  // namespace gpumem::toy
