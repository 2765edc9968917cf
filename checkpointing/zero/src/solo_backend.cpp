#include "gpumem/zero/solo_backend.h"

#include <fmt/format.h>

#include <stdexcept>

namespace gpumem::zero {
namespace {

// A Work that is finished when it is created: the solo collectives run synchronously on the
// caller's stream, so waiting on them has nothing left to do.
class FinishedWork final : public c10d::Work {
 public:
  explicit FinishedWork(c10d::OpType op) : c10d::Work(0, op) { finish(); }
};

c10::intrusive_ptr<c10d::Work> done(c10d::OpType op) {
  return c10::make_intrusive<FinishedWork>(op);
}

void check_reduce_op(const c10d::ReduceOp& op, const char* collective) {
  using R = c10d::ReduceOp::RedOpType;
  const R kind = op.op_;
  if (kind != R::SUM && kind != R::AVG && kind != R::MAX && kind != R::MIN) {
    throw std::invalid_argument(
        fmt::format("SoloBackend {}: reduce op {} is not supported; use SUM, AVG, MIN or MAX",
                    collective, static_cast<int>(kind)));
  }
}

void copy_unless_same(at::Tensor& output, const at::Tensor& input, const char* collective) {
  if (output.numel() != input.numel()) {
    throw std::invalid_argument(fmt::format(
        "SoloBackend {}: output has {} elements but input has {}; with one rank they must match",
        collective, output.numel(), input.numel()));
  }
  if (output.data_ptr() != input.data_ptr()) output.view(-1).copy_(input.reshape(-1));
}

}  // namespace

SoloBackend::SoloBackend() : c10d::Backend(0, 1) {}

c10::intrusive_ptr<c10d::Work> SoloBackend::broadcast(std::vector<at::Tensor>& /*tensors*/,
                                                      const c10d::BroadcastOptions& opts) {
  if (opts.rootRank != 0) {
    throw std::invalid_argument(fmt::format(
        "SoloBackend broadcast: root rank {} does not exist in a world of one", opts.rootRank));
  }
  return done(c10d::OpType::BROADCAST);
}

c10::intrusive_ptr<c10d::Work> SoloBackend::allreduce(std::vector<at::Tensor>& /*tensors*/,
                                                      const c10d::AllreduceOptions& opts) {
  check_reduce_op(opts.reduceOp, "allreduce");
  return done(c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> SoloBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions&) {
  copy_unless_same(output, input, "_allgather_base");
  return done(c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> SoloBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_reduce_op(opts.reduceOp, "_reduce_scatter_base");
  copy_unless_same(output, input, "_reduce_scatter_base");
  return done(c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> SoloBackend::barrier(const c10d::BarrierOptions&) {
  return done(c10d::OpType::BARRIER);
}

}  // namespace gpumem::zero
