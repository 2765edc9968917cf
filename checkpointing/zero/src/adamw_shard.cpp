#include "adamw_shard.h"

#include <cmath>

namespace gpumem::zero::detail {

AdamWShard::AdamWShard(std::int64_t numel, at::Device device, AdamWOptions options,
                       std::vector<ShardSegment> segments)
    : options_(options), segments_(std::move(segments)) {
  if (segments_.empty()) {
    segments_.push_back(ShardSegment{0, numel, options.lr, options.weight_decay});
  }
  std::int64_t next = 0;
  for (const ShardSegment& s : segments_) {
    TORCH_INTERNAL_ASSERT(s.offset == next && s.numel > 0, "AdamWShard: segments do not tile");
    next += s.numel;
    uniform_lr_ = uniform_lr_ && s.lr == segments_.front().lr;
  }
  TORCH_INTERNAL_ASSERT(next == numel, "AdamWShard: segments cover ", next, " of ", numel);
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  master_ = at::zeros({numel}, opts);
  exp_avg_ = at::zeros({numel}, opts);
  exp_avg_sq_ = at::zeros({numel}, opts);
}

void AdamWShard::update(const at::Tensor& grad) {
  TORCH_INTERNAL_ASSERT(grad.scalar_type() == at::kFloat && grad.numel() == master_.numel());
  ++step_;
  const double beta1 = options_.beta1;
  const double beta2 = options_.beta2;
  // The same sequence of operations as torch::optim::AdamW::step (torch 2.11), in the same order,
  // so results agree to rounding.
  if (segments_.size() == 1) {
    master_.mul_(1 - segments_.front().lr * segments_.front().weight_decay);
  } else {
    for (const ShardSegment& s : segments_) {
      if (s.lr * s.weight_decay != 0)
        master_.narrow(0, s.offset, s.numel).mul_(1 - s.lr * s.weight_decay);
    }
  }
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step_));
  exp_avg_.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq_.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const at::Tensor denom = (exp_avg_sq_.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
  if (uniform_lr_) {
    master_.addcdiv_(exp_avg_, denom, -segments_.front().lr / bias_correction1);
  } else {
    for (const ShardSegment& s : segments_) {
      master_.narrow(0, s.offset, s.numel)
          .addcdiv_(exp_avg_.narrow(0, s.offset, s.numel), denom.narrow(0, s.offset, s.numel),
                    -s.lr / bias_correction1);
    }
  }
}

}  // namespace gpumem::zero::detail
