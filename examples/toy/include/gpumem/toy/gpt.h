// gpumem::toy::Gpt: the small GPT-style language model that gpumem's examples, benchmarks and
// tests train (train_transformer, zero_train, bench_op_attribution_overhead, torch_cpu_training).
// One copy, so a workload named in a note or a benchmark is the same model everywhere.
//
// The model: token and position embeddings; `layers` pre-norm blocks, each causal self-attention
// through at::scaled_dot_product_attention (fused QKV projection, output projection, residual)
// and a GELU MLP of 4 x width (residual); a final LayerNorm and the vocabulary projection.
//
//     tokens [batch, seq] (long)  ->  logits [batch, seq, vocab] (options.dtype)
//
// It is three kinds of unit, in this order: Embeddings, `layers` Blocks, Head. units() lists
// them for ZeRO stage 3 (gpumem::zero::ShardedTrainer), and forward_with(tokens, call) runs each
// through call(unit, x), e.g. gpumem::zero::call; forward(tokens) calls each unit directly.
//
// Initialisation: libtorch's defaults, drawn from the global generator in construction order
// (token embedding, position embedding, then per block qkv, proj, fc, fc_out, then the head), so
// torch::manual_seed(s) before construction fixes every parameter. Parameters are created in
// fp32 and then cast to options.dtype: one seed gives the same values, rounded, in any dtype.
//
// Thread-safety: a torch::nn::Module (construct on one thread; forward like any module).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>
#include <vector>

// TORCH_MODULE(Name) with ::torch spelled out (see the note at the top). Undefined at the end.
#define GPUMEM_TOY_MODULE(Name)                                     \
  class Name : public ::torch::nn::ModuleHolder<Name##Impl> {       \
   public:                                                          \
    using ::torch::nn::ModuleHolder<Name##Impl>::ModuleHolder;      \
    using Impl = Name##Impl;                                        \
  }

namespace gpumem::toy {

// The model's shape. A plain value; check_options() says what a valid one is.
struct GptOptions {
  std::int64_t layers = 4;     // transformer blocks, >= 1
  std::int64_t width = 256;    // d_model, a multiple of heads
  std::int64_t heads = 8;      // attention heads, >= 1
  std::int64_t vocab = 8192;   // token ids are 0..vocab-1, >= 2
  std::int64_t max_seq = 512;  // rows of the position embedding: the longest sequence, >= 1
  bool head_bias = false;      // whether the vocabulary projection has a bias
  c10::ScalarType dtype = c10::ScalarType::Float;  // of every parameter: float, bfloat16, half, double
};

// Throws std::invalid_argument naming the field, its value and what it must be.
void check_options(const GptOptions& options);

// The number of parameters the model has (what Gpt(options)->parameters() holds, in elements).
std::int64_t parameter_count(const GptOptions& options);

// Token embedding plus learned position embedding (positions 0..seq-1).
struct EmbeddingsImpl : ::torch::nn::Module {
  explicit EmbeddingsImpl(const GptOptions& options);
  at::Tensor forward(const at::Tensor& tokens);  // [batch, seq] long -> [batch, seq, width]
  ::torch::nn::Embedding tok{nullptr}, pos{nullptr};
};
GPUMEM_TOY_MODULE(Embeddings);

// x + attention(ln1(x)), then x + fc_out(gelu(fc(ln2(x)))).
struct BlockImpl : ::torch::nn::Module {
  explicit BlockImpl(const GptOptions& options);
  at::Tensor forward(at::Tensor x);  // [batch, seq, width] -> same
  std::int64_t heads;
  ::torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  ::torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_out{nullptr};
};
GPUMEM_TOY_MODULE(Block);

// Final LayerNorm and the vocabulary projection.
struct HeadImpl : ::torch::nn::Module {
  explicit HeadImpl(const GptOptions& options);
  at::Tensor forward(const at::Tensor& x);  // [batch, seq, width] -> [batch, seq, vocab]
  ::torch::nn::LayerNorm ln_f{nullptr};
  ::torch::nn::Linear proj{nullptr};
};
GPUMEM_TOY_MODULE(Head);

struct GptImpl : ::torch::nn::Module {
  explicit GptImpl(const GptOptions& options);  // check_options() first

  at::Tensor forward(const at::Tensor& tokens);

  // forward() with every unit run as call(unit, x), where unit is an Embeddings, a Block or a
  // Head (a torch::nn::ModuleHolder) and x a Tensor; call returns the unit's output.
  template <class Call>
  at::Tensor forward_with(const at::Tensor& tokens, Call&& call) {
    at::Tensor x = call(embed, tokens);
    for (Block& block : blocks) x = call(block, x);
    return call(head, x);
  }

  // The units in forward order (for ZeRO stage 3).
  std::vector<std::shared_ptr<::torch::nn::Module>> units() const;

  const GptOptions options;
  Embeddings embed{nullptr};
  std::vector<Block> blocks;
  Head head{nullptr};
};
GPUMEM_TOY_MODULE(Gpt);

}  // namespace gpumem::toy

#undef GPUMEM_TOY_MODULE
