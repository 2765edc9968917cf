// A rank that fails mid-step makes every rank fail with a clear error instead of hanging, and
// leaves its trainer refusing further use.
#include "toy_training.h"
#include "zero_test_helpers.h"

#include <ATen/Parallel.h>
#include <gpumem/zero/sharded_trainer.h>

#include <chrono>
#include <stdexcept>
#include <thread>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using namespace gpumem::zero;
using namespace gpumem::zero::testing;
using namespace std::chrono_literals;

namespace {

ShardedTrainerOptions options(int stage) {
  ShardedTrainerOptions o;
  o.stage = stage;
  o.bucket_size_bytes = 4 << 10;
  o.max_inflight_reductions = 1;
  return o;
}

}  // namespace

TEST_CASE("a rank that throws in forward fails every rank with its reason", "[zero][failure]") {
  at::set_num_threads(1);
  const auto batches = make_batches(8, 16, 31);
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    const ShardedRun run = train_sharded(
        4, options(stage), 5, batches,
        [](int rank, int step, ToyNet&) {
          if (rank == 2 && step == 5) throw std::runtime_error("injected failure in forward");
        },
        60s);
    CHECK(run.seconds < 20);  // the abort ends it, not the 60 s timeout
    CHECK(run.errors[2] == "injected failure in forward");
    for (int r : {0, 1, 3}) {
      INFO("rank " << r << ": " << run.errors[r]);
      CHECK(contains(run.errors[r], "rank 2 failed: injected failure in forward"));
    }
  }
}

TEST_CASE("a rank that throws inside backward fails every rank", "[zero][failure]") {
  at::set_num_threads(1);
  const auto batches = make_batches(6, 16, 32);
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    const ShardedRun run = train_sharded(
        4, options(stage), 5, batches,
        [](int rank, int step, ToyNet& net) {
          // The hook fires when block 0's weight gradient is computed: late in backward, after
          // the head's and later blocks' reductions were issued on every rank.
          if (rank == 1 && step == 3) {
            net->blocks[0]->fc1->weight.register_hook([](const at::Tensor&) {
              throw std::runtime_error("injected failure in backward");
            });
          }
        },
        60s);
    CHECK(run.seconds < 20);
    INFO("rank 1: " << run.errors[1]);
    CHECK(contains(run.errors[1], "injected failure in backward"));
    for (int r : {0, 2, 3}) {
      INFO("rank " << r << ": " << run.errors[r]);
      CHECK(contains(run.errors[r], "rank 1 failed"));
      CHECK(contains(run.errors[r], "injected failure in backward"));
    }
  }
}

TEST_CASE("a stalled rank times the others out, naming it", "[zero][failure]") {
  at::set_num_threads(1);
  const auto batches = make_batches(4, 12, 33);
  const ShardedRun run = train_sharded(
      3, options(2), 5, batches,
      [](int rank, int step, ToyNet&) {
        if (rank == 0 && step == 2) std::this_thread::sleep_for(1500ms);
      },
      300ms);
  for (int r : {1, 2}) {
    INFO("rank " << r << ": " << run.errors[r]);
    CHECK(contains(run.errors[r], "timed out after 300 ms"));
    CHECK(contains(run.errors[r], "rank(s) 0 never arrived"));
  }
  INFO("rank 0: " << run.errors[0]);
  CHECK(contains(run.errors[0], "thread group aborted"));
}

TEST_CASE("after a failed step the trainer refuses further use, naming the failure",
          "[zero][failure]") {
  at::set_num_threads(1);
  const auto batches = make_batches(2, 8, 34);
  std::string later_error;
  const auto errors = run_ranks(
      2,
      [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
        ToyNet net = make_toy_net(5);
        ShardedTrainer trainer(net.ptr(), comm, options(3), net->units());
        if (rank == 1) throw std::runtime_error("rank 1 gives up");
        try {
          trainer.backward(toy_loss(net, local_batch(batches[0], rank, 2), at::kBFloat16));
        } catch (const std::exception&) {
          try {
            trainer.step();
          } catch (const std::exception& e) {
            later_error = e.what();
          }
          throw;
        }
      },
      60s);
  CHECK(errors[1] == "rank 1 gives up");
  INFO(errors[0]);
  CHECK(contains(errors[0], "rank 1 failed: rank 1 gives up"));
  INFO(later_error);
  CHECK(contains(later_error, "unusable after an earlier failure: forward failed"));
  CHECK(contains(later_error, "rank 1 gives up"));
}
