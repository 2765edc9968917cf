// DistributedContext: the store and the c10d backend a ShardedTrainer talks through, set up the
// way torchrun expects (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; see
// launch_env.h).
//
//   * CUDA: device cuda:LOCAL_RANK is made current and the backend is ProcessGroupNCCL over a
//     TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it). Any number of ranks and nodes
//     NCCL supports; one rank works too. Needs gpumem built with NCCL (nccl_available()).
//   * CPU: a world of one only (SoloBackend). The torch wheel ships no Gloo headers, so CPU
//     runs with several ranks have no backend here; the tests use their own threaded one.
//   * Without launcher variables (from_environment = false) the store is an in-process
//     HashStore: a world of one needs no rendezvous.
//
// Every misconfiguration (bad variables, LOCAL_RANK beyond the GPUs present, CUDA without NCCL,
// CPU with several ranks) is one std::invalid_argument or LaunchEnvError naming the fix.
//
// Thread-safety: init_distributed() is called once per process, from one thread.
#pragma once

#include "gpumem/zero/launch_env.h"

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace gpumem::zero {

struct DistributedContext {
  LaunchEnv env;
  at::Device device{at::kCPU};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

// True when this build of gpumem can create ProcessGroupNCCL.
bool nccl_available();

DistributedContext init_distributed(const LaunchEnv& env, c10::DeviceType device_type,
                                    std::chrono::milliseconds timeout = std::chrono::minutes(10));

}  // namespace gpumem::zero
