#include "rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#if GPUMEM_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <mutex>

namespace gpumem::ckpt::detail {
namespace {

at::Tensor read_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void write_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

#if GPUMEM_TORCH_HAS_CUDA
at::Generator cuda_generator(c10::DeviceIndex index) {
  return at::cuda::detail::getDefaultCUDAGenerator(index);
}
#endif

}  // namespace

RngSnapshot RngSnapshot::capture(const std::vector<at::Tensor>& tensors) {
  RngSnapshot s;
  s.cpu_state_ = read_state(at::detail::getDefaultCPUGenerator());
  std::vector<c10::DeviceIndex> devices;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.is_cuda()) devices.push_back(t.get_device());
  }
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
#if GPUMEM_TORCH_HAS_CUDA
  for (c10::DeviceIndex d : devices) s.cuda_states_.emplace_back(d, read_state(cuda_generator(d)));
#else
  // No tensor can live on CUDA when torch was built without it.
#endif
  return s;
}

RngSnapshot RngSnapshot::capture_like(const RngSnapshot& like) {
  RngSnapshot s;
  if (like.cpu_state_.defined()) s.cpu_state_ = read_state(at::detail::getDefaultCPUGenerator());
#if GPUMEM_TORCH_HAS_CUDA
  for (const auto& [d, state] : like.cuda_states_) {
    s.cuda_states_.emplace_back(d, read_state(cuda_generator(d)));
  }
#endif
  return s;
}

void RngSnapshot::restore() const {
  if (cpu_state_.defined()) write_state(at::detail::getDefaultCPUGenerator(), cpu_state_);
#if GPUMEM_TORCH_HAS_CUDA
  for (const auto& [d, state] : cuda_states_) write_state(cuda_generator(d), state);
#endif
}

RngFork::RngFork(const RngSnapshot& apply) : outside_(RngSnapshot::capture_like(apply)) {
  apply.restore();
}

RngFork::~RngFork() { outside_.restore(); }

}  // namespace gpumem::ckpt::detail
