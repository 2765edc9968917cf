// DistributedContext: the store and the c10d backend a ShardedTrainer talks through, set up the
// way torchrun expects (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
// TORCHELASTIC_USE_AGENT_STORE; see launch_env.h).
//
//   * Store: a TCPStore at MASTER_ADDR:MASTER_PORT. Under torchrun its agent serves it and every
//     rank connects; otherwise rank 0 serves it. Without launcher variables (from_environment =
//     false) an in-process HashStore: a world of one needs no rendezvous.
//   * CUDA: device cuda:LOCAL_RANK is made current and the backend is ProcessGroupNCCL, one GPU per
//     process, any number of ranks and nodes. Needs gpumem built with NCCL (nccl_available()).
//   * CPU: ProcessGroupGloo for several ranks (needs gpumem built with Gloo's headers,
//     gloo_available()); SoloBackend for a world of one. Gloo's transport binds to 127.0.0.1 when
//     MASTER_ADDR is a loopback address (every rank on this host), to GLOO_SOCKET_IFNAME's
//     interface when that is set, and otherwise to the address this host's name resolves to.
//   * Timeouts: `rendezvous_timeout` bounds connecting to the store and to the other ranks (ranks
//     start at different moments: a slow start is not a failure); `timeout` then bounds every
//     collective: a rank waiting for one that died or stalled fails with the backend's error
//     after at most that long.
//   * monitor (world > 1): failure reports and the watchdog (rank_monitor.h). When a rank fails,
//     print report_failure(reason) instead of the bare reason: it names what the other ranks
//     reported. Call finish() after the last collective.
//
// Every misconfiguration (bad variables, LOCAL_RANK beyond the GPUs present, CUDA without NCCL,
// several CPU ranks without Gloo) is one std::invalid_argument or LaunchEnvError naming the fix.
//
// Thread-safety: init_distributed() is called once per process, from one thread; the context's
// members are then used by that thread (the monitor is thread-safe).
#pragma once

#include "gpumem/zero/launch_env.h"
#include "gpumem/zero/rank_monitor.h"

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace gpumem::zero {

struct DistributedContext {
  LaunchEnv env;
  at::Device device{at::kCPU};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::shared_ptr<RankMonitor> monitor;  // null for a world of one

  // This rank failed with `reason`: tells the other ranks and returns the message to print
  // (with what they reported). Never throws.
  std::string report_failure(const std::string& reason) const;
  // Collective, after this rank's last collective: a barrier (so no rank leaves while another
  // still needs it), then stops the watchdog and shuts the backend down.
  void finish();
};

struct DistributedOptions {
  // Bounds every collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // Bounds the rendezvous (store and backend connection); 0: the same as timeout.
  std::chrono::milliseconds rendezvous_timeout{0};
  RankMonitorOptions monitor;
};

// True when this build of gpumem can create ProcessGroupNCCL / ProcessGroupGloo.
bool nccl_available();
bool gloo_available();

DistributedContext init_distributed(const LaunchEnv& env, c10::DeviceType device_type,
                                    const DistributedOptions& options = {});
// timeout bounds the rendezvous and every collective.
DistributedContext init_distributed(const LaunchEnv& env, c10::DeviceType device_type,
                                    std::chrono::milliseconds timeout);

}  // namespace gpumem::zero
