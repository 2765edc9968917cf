#include "gpumem/zero/distributed_context.h"

#include "gpumem/zero/solo_backend.h"

#ifdef GPUMEM_ZERO_HAVE_NCCL
#include "nccl_backend.h"
#endif

#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <stdexcept>

namespace gpumem::zero {

bool nccl_available() {
#ifdef GPUMEM_ZERO_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

c10::intrusive_ptr<c10d::Store> make_store(const LaunchEnv& env,
                                           std::chrono::milliseconds timeout) {
  if (!env.from_environment) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions opts;
  opts.port = env.master_port;
  opts.isServer = env.rank == 0;
  opts.numWorkers = static_cast<std::size_t>(env.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "could not {} the TCPStore at {}:{} ({}): check MASTER_ADDR/MASTER_PORT, that rank 0 "
        "is running and the port is free and reachable",
        env.rank == 0 ? "serve" : "connect to", env.master_addr, env.master_port, e.what()));
  }
}

}  // namespace

DistributedContext init_distributed(const LaunchEnv& env, c10::DeviceType device_type,
                                    std::chrono::milliseconds timeout) {
  DistributedContext ctx;
  ctx.env = env;
  if (device_type == c10::DeviceType::CUDA) {
    if (!nccl_available()) {
      throw std::invalid_argument(
          "gpumem was built without NCCL (nccl.h was not found at configure time), so CUDA "
          "training has no backend: install NCCL's headers (pip's nvidia-nccl, or libnccl-dev) "
          "and reconfigure");
    }
    c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
    const int devices = guard.deviceCount();
    if (devices == 0) {
      throw std::invalid_argument("CUDA training was asked for but no CUDA device is visible");
    }
    if (env.local_rank >= devices) {
      throw std::invalid_argument(fmt::format(
          "LOCAL_RANK={} but this node has {} visible CUDA device(s): launch at most {} processes "
          "per node (torchrun --nproc-per-node) or fix CUDA_VISIBLE_DEVICES",
          env.local_rank, devices, devices));
    }
    ctx.device = at::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    guard.setDevice(ctx.device);
    ctx.store = make_store(env, timeout);
#ifdef GPUMEM_ZERO_HAVE_NCCL
    ctx.backend =
        detail::make_nccl_backend(ctx.store, env.rank, env.world_size, ctx.device, timeout);
#endif
    return ctx;
  }
  if (device_type != c10::DeviceType::CPU) {
    throw std::invalid_argument(fmt::format("device type {} is not supported: use CPU or CUDA",
                                            c10::DeviceTypeName(device_type)));
  }
  if (env.world_size != 1) {
    throw std::invalid_argument(fmt::format(
        "WORLD_SIZE={} on CPU: gpumem has no multi-process CPU backend (the torch wheel ships no "
        "Gloo headers); train on CUDA with NCCL, or use WORLD_SIZE=1",
        env.world_size));
  }
  ctx.store = make_store(env, timeout);
  ctx.backend = c10::make_intrusive<SoloBackend>();
  return ctx;
}

}  // namespace gpumem::zero
