#include "adamw_shard.h"

#include <cmath>

namespace gpumem::zero::detail {

AdamWShard::AdamWShard(std::int64_t numel, at::Device device, AdamWOptions options)
    : options_(options) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  master_ = at::zeros({numel}, opts);
  exp_avg_ = at::zeros({numel}, opts);
  exp_avg_sq_ = at::zeros({numel}, opts);
}

void AdamWShard::update(const at::Tensor& grad) {
  TORCH_INTERNAL_ASSERT(grad.scalar_type() == at::kFloat && grad.numel() == master_.numel());
  ++step_;
  const double lr = options_.lr;
  const double beta1 = options_.beta1;
  const double beta2 = options_.beta2;
  // The same sequence of operations as torch::optim::AdamW::step (torch 2.11), in the same order,
  // so results agree to rounding.
  master_.mul_(1 - lr * options_.weight_decay);
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step_));
  exp_avg_.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq_.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const at::Tensor denom = (exp_avg_sq_.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
  const double step_size = lr / bias_correction1;
  master_.addcdiv_(exp_avg_, denom, -step_size);
}

}  // namespace gpumem::zero::detail
