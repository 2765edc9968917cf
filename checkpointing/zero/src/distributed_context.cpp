#include "gpumem/zero/distributed_context.h"

#include "gpumem/zero/error_message.h"
#include "gpumem/zero/solo_backend.h"

#ifdef GPUMEM_ZERO_HAVE_NCCL
#include "nccl_backend.h"
#endif
#ifdef GPUMEM_ZERO_HAVE_GLOO
#include "gloo_backend.h"
#endif

#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
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

bool gloo_available() {
#ifdef GPUMEM_ZERO_HAVE_GLOO
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
  // Under torchrun its agent serves the store on MASTER_PORT: rank 0 must not try to bind it.
  const bool serve = env.rank == 0 && !env.agent_store;
  opts.isServer = serve;
  opts.numWorkers = static_cast<std::size_t>(env.world_size);
  opts.waitWorkers = !env.agent_store;
  opts.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "could not {} the TCPStore at {}:{} ({}): check MASTER_ADDR/MASTER_PORT, that {} is "
        "running and the port is {}",
        serve ? "serve" : "connect to", env.master_addr, env.master_port, error_message(e),
        env.agent_store ? "the launcher's agent" : "rank 0",
        serve ? "free (another job may hold it)" : "reachable"));
  }
}

// The store the backend uses: namespaced, so the monitor's keys and a second process group on
// the same store never collide with this one's.
c10::intrusive_ptr<c10d::Store> backend_store(const c10::intrusive_ptr<c10d::Store>& store) {
  return c10::make_intrusive<c10d::PrefixStore>("gpumem_zero/default_pg", store);
}

void add_monitor(DistributedContext& ctx, const DistributedOptions& options) {
  if (ctx.env.world_size > 1) {
    ctx.monitor = std::make_shared<RankMonitor>(ctx.store, ctx.env.rank, ctx.env.world_size,
                                                options.monitor);
  }
}

}  // namespace

std::string DistributedContext::report_failure(const std::string& reason) const {
  if (monitor) return monitor->report_failure(reason);
  return reason;
}

void DistributedContext::finish() {
  if (backend && env.world_size > 1) backend->barrier(c10d::BarrierOptions())->wait();
  if (monitor) monitor->finish();
  if (backend) backend->shutdown();
}

DistributedContext init_distributed(const LaunchEnv& env, c10::DeviceType device_type,
                                    std::chrono::milliseconds timeout) {
  DistributedOptions options;
  options.timeout = timeout;
  return init_distributed(env, device_type, options);
}

DistributedContext init_distributed(const LaunchEnv& env, c10::DeviceType device_type,
                                    const DistributedOptions& options) {
  const std::chrono::milliseconds timeout = options.timeout;
  if (timeout.count() <= 0) {
    throw std::invalid_argument(
        fmt::format("DistributedOptions: timeout {} ms must be > 0", timeout.count()));
  }
  if (options.rendezvous_timeout.count() < 0) {
    throw std::invalid_argument(fmt::format(
        "DistributedOptions: rendezvous_timeout {} ms must be >= 0 (0: the collective timeout)",
        options.rendezvous_timeout.count()));
  }
  const std::chrono::milliseconds rendezvous =
      options.rendezvous_timeout.count() > 0 ? options.rendezvous_timeout : timeout;
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
    ctx.store = make_store(env, rendezvous);
    add_monitor(ctx, options);
#ifdef GPUMEM_ZERO_HAVE_NCCL
    ctx.backend = detail::make_nccl_backend(backend_store(ctx.store), env.rank, env.world_size,
                                            ctx.device, timeout);
#endif
    return ctx;
  }
  if (device_type != c10::DeviceType::CPU) {
    throw std::invalid_argument(fmt::format("device type {} is not supported: use CPU or CUDA",
                                            c10::DeviceTypeName(device_type)));
  }
  if (env.world_size == 1) {
    ctx.store = make_store(env, rendezvous);
    ctx.backend = c10::make_intrusive<SoloBackend>();
    return ctx;
  }
  if (!gloo_available()) {
    throw std::invalid_argument(fmt::format(
        "WORLD_SIZE={} on CPU needs ProcessGroupGloo, but gpumem was built without Gloo's headers "
        "(the torch wheel does not ship them): install libgloo-dev (scripts/setup.sh does) and "
        "reconfigure, train on CUDA with NCCL, or use WORLD_SIZE=1",
        env.world_size));
  }
  ctx.store = make_store(env, rendezvous);
  add_monitor(ctx, options);
#ifdef GPUMEM_ZERO_HAVE_GLOO
  try {
    ctx.backend = detail::make_gloo_backend(backend_store(ctx.store), env.rank, env.world_size,
                                            env.master_addr, rendezvous);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "rank {}: could not connect ProcessGroupGloo to the other {} rank(s) within {} ms: {}",
        env.rank, env.world_size - 1, rendezvous.count(), error_message(e)));
  }
  ctx.backend->setTimeout(timeout);  // from here on, the collective timeout
#endif
  return ctx;
}

}  // namespace gpumem::zero
