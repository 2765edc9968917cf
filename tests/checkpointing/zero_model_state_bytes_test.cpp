// The ZeRO paper's model-state formulas (ANCHORS.md), checked against the paper's own example.
#include "catch.h"

#include <gpumem/zero/model_state_bytes.h>

#include <cmath>
#include <stdexcept>

using gpumem::zero::expected_model_state_bytes;
using gpumem::zero::max_relative_error;
using gpumem::zero::ModelStateBytes;
using gpumem::zero::ModelStateShape;

namespace {

// Catch2 2 and 3 spell Approx differently; a plain comparison works with both.
bool near(double a, double b, double margin) { return std::abs(a - b) <= margin; }

double gigabytes(int stage, std::int64_t psi, int n) {
  ModelStateShape s;
  s.stage = stage;
  s.num_params = psi;
  s.world_size = n;
  return expected_model_state_bytes(s).total_bytes() / 1e9;
}

}  // namespace

TEST_CASE("the paper's 7.5B-parameter example on 64 GPUs", "[zero][formula]") {
  // Rajbhandari et al., Figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device (rounded to
  // 0.1 GB; exactly 120, 31.41, 16.64 and 1.875).
  const std::int64_t psi = 7'500'000'000;
  CHECK(near(gigabytes(0, psi, 64), 120.0, 0.05));
  CHECK(near(gigabytes(1, psi, 64), 31.4, 0.05));
  CHECK(near(gigabytes(2, psi, 64), 16.6, 0.05));
  CHECK(near(gigabytes(3, psi, 64), 1.9, 0.05));
}

TEST_CASE("each stage divides the kinds the paper says by N", "[zero][formula]") {
  ModelStateShape s;
  s.num_params = 1000;
  s.world_size = 4;
  s.stage = 2;
  const ModelStateBytes b = expected_model_state_bytes(s);
  CHECK(b.compute_params_bytes == 2000);
  CHECK(b.grads_bytes == 500);
  CHECK(b.master_params_bytes == 1000);
  CHECK(b.optimizer_state_bytes == 2000);
  s.stage = 0;
  CHECK(expected_model_state_bytes(s).total_bytes() == 16000);
  s.compute_bytes_per_param = 4;  // fp32 compute
  s.stage = 3;
  CHECK(expected_model_state_bytes(s).total_bytes() == (4 + 4 + 12) * 1000 / 4);
}

TEST_CASE("bad shapes are rejected", "[zero][formula]") {
  ModelStateShape s;
  s.stage = 4;
  CHECK_THROWS_AS(expected_model_state_bytes(s), std::invalid_argument);
  s.stage = 1;
  s.world_size = 0;
  CHECK_THROWS_AS(expected_model_state_bytes(s), std::invalid_argument);
}

TEST_CASE("relative error covers every kind and the total", "[zero][formula]") {
  ModelStateBytes e{100, 100, 100, 100};
  ModelStateBytes m = e;
  CHECK(max_relative_error(m, e) == 0);
  m.grads_bytes = 104;
  CHECK(near(max_relative_error(m, e), 0.04, 1e-12));
  ModelStateBytes none{100, 0, 100, 100};
  ModelStateBytes leak{100, 1, 100, 100};
  CHECK(max_relative_error(leak, none) == 1.0);  // held what the formula says is not held
  CHECK(gpumem::zero::format_model_state_table(m, e).find("gradients") != std::string::npos);
}
