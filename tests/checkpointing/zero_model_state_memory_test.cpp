// Model-state memory per rank, measured from the tensors each rank's trainer holds, against the
// ZeRO paper's formulas (ANCHORS.md): within 5% at every stage, and ordered 0 > 1 > 2 > 3.
#include "rank_counting_cpu_allocator.h"
#include "toy_training.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using namespace gpumem::zero;
using namespace gpumem::zero::testing;

TEST_CASE("per-rank model-state bytes match the ZeRO formulas within 5%", "[zero][memory]") {
  at::set_num_threads(1);
  // Two measurements per rank: the trainer's own count of the tensors it holds, and what the
  // rank's thread allocated from c10's CPU allocator and still holds after the last step.
  RankCountingCpuAllocator& counter = RankCountingCpuAllocator::instance();
  counter.install();
  struct Uninstall {
    ~Uninstall() { RankCountingCpuAllocator::instance().uninstall(); }
  } uninstall;
  const auto batches = make_batches(20, 16, 21);
  for (int world : {2, 4}) {
    double previous_total = 0;
    for (int stage : {0, 1, 2, 3}) {
      ShardedTrainerOptions o;  // bf16 compute, fp32 master weights and Adam moments
      o.stage = stage;
      o.bucket_size_bytes = 4 << 10;
      const ShardedRun run = train_sharded(world, o, 99, batches);
      for (std::size_t r = 0; r < run.errors.size(); ++r) {
        INFO("rank " << r << ": " << run.errors[r]);
        REQUIRE(run.errors[r].empty());
      }
      for (int r = 0; r < world; ++r) {
        const RankReport& rep = run.ranks[r];
        const double error = max_relative_error(rep.states, rep.expected);
        const double allocated = static_cast<double>(rep.allocator_live_bytes);
        const double allocator_error =
            std::abs(allocated - rep.expected.total_bytes()) / rep.expected.total_bytes();
        if (r == 0) {
          std::printf(
              "stage %d, %d ranks, %lld parameters, rank 0 after 20 steps "
              "(transient peak %.0f B):\n%s"
              "allocated by the rank's thread and alive: %.0f B (%+.2f%% vs formula), "
              "peak during the run %lld B (with construction, activations, and the test backend's\n"
                      "double-precision reduction scratch when this rank arrives last)\n",
              stage, world, static_cast<long long>(rep.num_params), rep.transient_peak_bytes,
              format_model_state_table(rep.states, rep.expected).c_str(), allocated,
              (allocated - rep.expected.total_bytes()) / rep.expected.total_bytes() * 100,
              static_cast<long long>(rep.allocator_peak_bytes));
        }
        INFO("stage " << stage << ", rank " << r << " of " << world << "\n"
                      << format_model_state_table(rep.states, rep.expected)
                      << "allocator live bytes " << allocated);
        CHECK(error <= 0.05);
        CHECK(allocator_error <= 0.05);
        // The states are persistent: the peak over the run is what the last step holds.
        CHECK(rep.peak_states.total_bytes() == rep.states.total_bytes());
        // Gradient buckets (stages 2-3) and gathered units (stage 3) come and go within a step.
        if (stage >= 2) CHECK(rep.transient_peak_bytes > 0);
      }
      const double total = run.ranks[0].states.total_bytes();
      if (stage > 0) CHECK(total < previous_total);
      previous_total = total;
    }
  }
}
