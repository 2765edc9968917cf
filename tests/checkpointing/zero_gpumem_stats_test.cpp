// Model-state memory read from gpumem's own statistics: with gpumem as c10's CPU allocator
// (install_cpu), the bytes allocated and alive once every thread rank finished its last step are
// the ranks' model states, and match the ZeRO formulas summed over the ranks.
#include "toy_training.h"

#include <ATen/Parallel.h>
#include <gpumem/torch/install.h>
#include <gpumem/torch/memory_stats.h>

#include <cmath>
#include <cstdio>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using namespace gpumem::zero;
using namespace gpumem::zero::testing;

TEST_CASE("gpumem's CPU statistics see the ZeRO formulas, summed over ranks", "[zero][memory]") {
  at::set_num_threads(1);
  gpumem::torch::install_cpu();
  struct Uninstall {
    ~Uninstall() { gpumem::torch::uninstall_cpu(); }
  } uninstall;
  const auto batches = make_batches(20, 16, 41);  // allocated before the baselines below
  constexpr int kWorld = 4;
  for (int stage : {0, 1, 2, 3}) {
    ShardedTrainerOptions o;  // bf16 compute, fp32 master weights and Adam moments
    o.stage = stage;
    o.bucket_size_bytes = 4 << 10;
    // requested_bytes: what the tensors asked for (allocated_bytes adds gpumem's 512-byte
    // rounding, large against this toy model's small tensors).
    const auto requested = [] { return gpumem::torch::cpu_stats().requested_bytes[0].current; };
    const std::int64_t baseline = requested();
    std::int64_t quiet = -1;
    const ShardedRun run = train_sharded(kWorld, o, 99, batches, {}, std::chrono::seconds(60),
                                         [&] { quiet = requested(); });
    for (std::size_t r = 0; r < run.errors.size(); ++r) {
      INFO("rank " << r << ": " << run.errors[r]);
      REQUIRE(run.errors[r].empty());
    }
    double formula = 0, trainer_count = 0;
    for (const RankReport& rep : run.ranks) {
      formula += rep.expected.total_bytes();
      trainer_count += rep.states.total_bytes();
    }
    const double measured = static_cast<double>(quiet - baseline);
    std::printf("stage %d, %d ranks: gpumem requested bytes alive after the last step %.0f, "
                "formula %.0f (%+.2f%%), trainers' own count %.0f\n",
                stage, kWorld, measured, formula, (measured - formula) / formula * 100,
                trainer_count);
    INFO("stage " << stage << ": gpumem " << measured << " B, formula " << formula << " B");
    CHECK(std::abs(measured - formula) / formula <= 0.05);
  }
}
