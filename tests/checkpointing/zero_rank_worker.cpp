// zero_rank_worker: one rank of a multi-process ZeRO test, launched by zero_process_test the way
// torchrun launches a worker (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and, when
// the test serves the store, TORCHELASTIC_USE_AGENT_STORE=True). It sets up ProcessGroupGloo
// through gpumem::zero::init_distributed exactly as a user's program would.
//
//   zero_rank_worker --scenario train --out DIR
//       trains every case of zero_process_cases.h; rank 0 writes <case>.params, every rank
//       <case>.rank<r>.txt.
//   zero_rank_worker --scenario fail|crash|stall|absent --rank-at R --step S --out DIR
//       stage-2 training where rank R, at step S, throws (fail), dies without a word (crash:
//       _Exit, as if killed), sleeps for ten minutes (stall), or (absent) never joins the job.
//   Common: --timeout-ms T (collective timeout), --rendezvous-timeout-ms R (connecting; ranks of
//   a loaded CI machine start seconds apart), --grace-ms G (watchdog grace).
//
// Exit codes: 0 success; 1 this rank failed (stderr: the message report_failure() composed);
// 2 bad usage; 3 ended by the watchdog; 9 the injected crash.
#include "rank_counting_cpu_allocator.h"
#include "zero_process_cases.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gpumem/zero/distributed_context.h>
#include <gpumem/zero/error_message.h>
#include <gpumem/zero/sharded_trainer.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

using namespace gpumem::zero;
using namespace gpumem::zero::testing;

namespace {

struct Args {
  std::string scenario;
  std::string out;
  int rank_at = -1;
  int step = -1;
  long long timeout_ms = 20000;
  long long rendezvous_timeout_ms = 60000;
  long long grace_ms = 5000;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--scenario") {
      a.scenario = value;
    } else if (flag == "--out") {
      a.out = value;
    } else if (flag == "--rank-at") {
      a.rank_at = std::stoi(value);
    } else if (flag == "--step") {
      a.step = std::stoi(value);
    } else if (flag == "--timeout-ms") {
      a.timeout_ms = std::stoll(value);
    } else if (flag == "--rendezvous-timeout-ms") {
      a.rendezvous_timeout_ms = std::stoll(value);
    } else if (flag == "--grace-ms") {
      a.grace_ms = std::stoll(value);
    } else {
      throw std::invalid_argument("unknown option " + flag);
    }
  }
  if (a.scenario.empty() || a.out.empty()) throw std::invalid_argument("--scenario and --out");
  return a;
}

std::vector<std::shared_ptr<torch::nn::Module>> units_for(int stage, ToyNet& net) {
  return stage == 3 ? net->units() : std::vector<std::shared_ptr<torch::nn::Module>>{};
}

// `slot`: the allocator slot this case's allocations are charged to. A process is one rank, so
// the slots serve to keep cases apart: tensors of an earlier case that the backend's threads
// release late (a collective's Work outlives its wait() briefly) are charged to that case's slot.
void train_case(const ProcessCase& c, DistributedContext& ctx, const std::vector<Batch>& batches,
                const Args& args, int slot) {
  const int rank = ctx.env.rank, world = ctx.env.world_size;
  ToyNet net = make_toy_net(kProcessSeed);  // before the tag: only what the trainer makes counts
  freeze(net, c.frozen);
  RankCountingCpuAllocator& counter = RankCountingCpuAllocator::instance();
  RankCountingCpuAllocator::RankTag tag(slot);
  const std::int64_t live_at_start = counter.live_bytes(slot);
  std::vector<std::shared_ptr<torch::nn::Module>> units = units_for(c.options.stage, net);
  ShardedTrainer trainer(net.ptr(), ctx.backend, c.options, units);
  for (int s = 0; s < static_cast<int>(batches.size()); ++s) {
    for (int m = 0; m < c.micro_batches; ++m) {
      const at::Tensor loss =
          micro_batch_loss(net, batches[s], rank, world, m, c.micro_batches,
                           c.options.compute_dtype);
      if (rank == args.rank_at && s == args.step) {
        if (args.scenario == "fail") {
          throw std::runtime_error(fmt::format("injected failure on rank {} at step {}", rank, s));
        }
        if (args.scenario == "crash") {
          std::fprintf(stderr, "rank %d: injected crash at step %d\n", rank, s);
          std::fflush(stderr);
          std::_Exit(9);
        }
        if (args.scenario == "stall") {
          std::fprintf(stderr, "rank %d: injected stall at step %d\n", rank, s);
          std::fflush(stderr);
          std::this_thread::sleep_for(std::chrono::minutes(10));
        }
      }
      trainer.backward(loss);
    }
    trainer.step();
  }
  ctx.backend->barrier(c10d::BarrierOptions())->wait();  // every rank done: only states alive
  RankStateRecord record;
  record.allocator_live_bytes = static_cast<double>(counter.live_bytes(slot) - live_at_start);
  record.measured = trainer.model_state_bytes();
  record.expected = trainer.expected_model_state_bytes();
  record.num_params = trainer.num_params();
  const NamedTensors params = trainer.gather_full_parameters();
  write_rank_state(fmt::format("{}/{}.rank{}.txt", args.out, c.name, rank), record);
  if (rank == 0) write_params(fmt::format("{}/{}.params", args.out, c.name), params);
}

int run(const Args& args) {
  at::set_num_threads(1);
  const LaunchEnv env = launch_env_from_environment();
  if (args.scenario == "absent" && env.rank == args.rank_at) {
    std::fprintf(stderr, "rank %d: injected absence (never joins)\n", env.rank);
    return 0;
  }
  DistributedOptions options;
  options.timeout = std::chrono::milliseconds(args.timeout_ms);
  options.rendezvous_timeout = std::chrono::milliseconds(args.rendezvous_timeout_ms);
  options.monitor.poll_interval = std::chrono::milliseconds(100);
  options.monitor.grace = std::chrono::milliseconds(args.grace_ms);
  options.monitor.report_wait = std::chrono::milliseconds(1000);
  DistributedContext ctx;
  try {
    ctx = init_distributed(env, c10::DeviceType::CPU, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_rank_worker rank %d: %s\n", env.rank, error_message(e).c_str());
    return 1;
  }
  try {
    const std::vector<Batch> batches = process_batches();
    if (args.scenario == "train") {
      RankCountingCpuAllocator::instance().install();
      const std::vector<ProcessCase> cases = process_cases();
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const int slot = static_cast<int>(i % RankCountingCpuAllocator::kMaxRanks);
        train_case(cases[i], ctx, batches, args, slot);
      }
    } else if (args.scenario == "fail" || args.scenario == "crash" ||
               args.scenario == "stall" || args.scenario == "absent") {
      ProcessCase c = process_cases()[2];  // stage 2
      train_case(c, ctx, batches, args, 0);
    } else {
      throw std::invalid_argument("unknown scenario " + args.scenario);
    }
    ctx.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_rank_worker: %s\n", ctx.report_failure(error_message(e)).c_str());
    return 1;
  }
  std::printf("rank %d of %d: done\n", ctx.env.rank, ctx.env.world_size);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_rank_worker: %s\n", e.what());
    return 2;
  }
  return run(args);
}
