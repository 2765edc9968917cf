// AdamWShard: AdamW on one rank's flat fp32 shard of master weights.
//
// Holds the master weights and both moments as flat fp32 tensors of the rank's shard size and
// applies exactly the update torch::optim::AdamW makes (decoupled weight decay, bias-corrected
// moments, eps added after the bias-corrected square root), so a sharded run can be compared
// with a single-process torch::optim::AdamW run element by element. Padding elements stay zero:
// their gradient is zero, so decay, moments and update leave them at zero.
//
// Invariants: master, exp_avg and exp_avg_sq have the same numel, fp32, on one device;
// step_count() is the number of updates applied.
//
// Thread-safety: none.
#pragma once

#include "gpumem/zero/sharded_trainer_options.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace gpumem::zero::detail {

class AdamWShard {
 public:
  AdamWShard(std::int64_t numel, at::Device device, AdamWOptions options);

  at::Tensor& master() { return master_; }
  const at::Tensor& master() const { return master_; }
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  std::int64_t step_count() const { return step_; }

  // grad: fp32, same numel as master (the rank's averaged, possibly clipped, gradient shard).
  void update(const at::Tensor& grad);

 private:
  AdamWOptions options_;
  at::Tensor master_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  std::int64_t step_ = 0;
};

}  // namespace gpumem::zero::detail
