// Creates ProcessGroupNCCL. Compiled only when NCCL's header was found at configure time
// (GPUMEM_ZERO_HAVE_NCCL); kept in its own translation unit because ProcessGroupNCCL.hpp pulls
// in the CUDA and NCCL headers.
#pragma once

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace gpumem::zero::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int world_size, at::Device device,
                                                    std::chrono::milliseconds timeout);

}  // namespace gpumem::zero::detail
