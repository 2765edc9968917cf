// RngSnapshot: the states of the default random generators a checkpointed function may draw
// from (the CPU generator, and the CUDA generator of each CUDA device its tensors live on),
// taken at one moment, so that the recompute in backward draws the same numbers (dropout masks)
// as the forward did. RngFork applies a snapshot for a scope and puts the generators back as
// they were when the scope ends, so the recompute leaves the program's random stream untouched.
//
// CUDA generators are only touched when a tensor lives on CUDA, and only in builds where torch
// has CUDA (GPUMEM_TORCH_HAS_CUDA); a CPU-only run never initializes CUDA.
//
// Thread-safety: each generator is read and written under its own mutex; a snapshot is a
// plain value.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <utility>
#include <vector>

namespace gpumem::ckpt::detail {

class RngSnapshot {
 public:
  RngSnapshot() = default;
  // The CPU generator and the CUDA generators of the devices `tensors` live on.
  static RngSnapshot capture(const std::vector<at::Tensor>& tensors);
  // The same generators as `like`, as they are now.
  static RngSnapshot capture_like(const RngSnapshot& like);
  void restore() const;
  bool empty() const noexcept { return !cpu_state_.defined() && cuda_states_.empty(); }

 private:
  at::Tensor cpu_state_;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda_states_;
};

class RngFork {
 public:
  explicit RngFork(const RngSnapshot& apply);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngSnapshot outside_;
};

}  // namespace gpumem::ckpt::detail
