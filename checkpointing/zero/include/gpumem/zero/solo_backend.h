// SoloBackend: the c10d Backend of a world of one process.
//
// With one rank every collective the ShardedTrainer uses is the identity (allreduce with SUM or
// AVG, broadcast, barrier) or a copy from input to output (_allgather_base,
// _reduce_scatter_base). SoloBackend does exactly that, on any device, and returns completed
// Work. It lets a CPU process with WORLD_SIZE=1 run without Gloo (the torch wheel ships no Gloo
// headers); on CUDA init_distributed() uses ProcessGroupNCCL even for one rank.
//
// Thread-safety: stateless apart from c10d::Backend's own fields; callable from any thread.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gpumem::zero {

class SoloBackend final : public c10d::Backend {
 public:
  SoloBackend();

  const std::string getBackendName() const override { return "gpumem-solo"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
};

}  // namespace gpumem::zero
