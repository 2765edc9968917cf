// AdamWShard: AdamW on one rank's flat fp32 shard of master weights.
//
// Holds the master weights and both moments as flat fp32 tensors of the rank's shard size and
// applies exactly the update torch::optim::AdamW makes (decoupled weight decay, bias-corrected
// moments, eps added after the bias-corrected square root), so a sharded run can be compared
// with a single-process torch::optim::AdamW run element by element. Padding elements stay zero:
// their gradient is zero, so decay, moments and update leave them at zero.
//
// Parameter groups: the shard is covered by segments, each with its own learning rate and
// weight decay (betas and eps are common). Decay and the final update run per segment only when
// the segments differ; the moments always run on the whole shard, so the cost of groups is a few
// small kernels per segment, not per parameter.
//
// Invariants: master, exp_avg and exp_avg_sq have the same numel, fp32, on one device; the
// segments are sorted, disjoint and cover [0, numel) exactly; step_count() is the number of
// updates applied.
//
// Thread-safety: none.
#pragma once

#include "gpumem/zero/sharded_trainer_options.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace gpumem::zero::detail {

struct ShardSegment {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  double lr = 0;
  double weight_decay = 0;
};

class AdamWShard {
 public:
  // segments empty: one segment over the whole shard with options.lr and options.weight_decay.
  AdamWShard(std::int64_t numel, at::Device device, AdamWOptions options,
             std::vector<ShardSegment> segments = {});

  at::Tensor& master() { return master_; }
  const at::Tensor& master() const { return master_; }
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const std::vector<ShardSegment>& segments() const { return segments_; }
  std::int64_t step_count() const { return step_; }

  // grad: fp32, same numel as master (the rank's averaged, possibly clipped, gradient shard).
  void update(const at::Tensor& grad);

 private:
  AdamWOptions options_;
  std::vector<ShardSegment> segments_;
  bool uniform_lr_ = true;
  at::Tensor master_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  std::int64_t step_ = 0;
};

}  // namespace gpumem::zero::detail
