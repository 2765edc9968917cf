#include "gpumem/zero/model_state_bytes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gpumem::zero {

ModelStateBytes expected_model_state_bytes(const ModelStateShape& s) {
  if (s.stage < 0 || s.stage > 3) {
    throw std::invalid_argument(
        fmt::format("ZeRO stage {} does not exist: use 0, 1, 2 or 3", s.stage));
  }
  if (s.world_size < 1) {
    throw std::invalid_argument(fmt::format("world size {} must be at least 1", s.world_size));
  }
  if (s.num_params < 0 || s.compute_bytes_per_param < 0 || s.master_bytes_per_param < 0 ||
      s.optimizer_bytes_per_param < 0) {
    throw std::invalid_argument("parameter count and bytes per parameter must not be negative");
  }
  const double psi = static_cast<double>(s.num_params);
  const double n = s.world_size;
  const double c = s.compute_bytes_per_param;
  ModelStateBytes b;
  // Which kinds are divided by N at each stage: stage >= 1 shards the optimizer (master weights
  // and moments), stage >= 2 the gradients, stage 3 the compute parameters as well.
  b.master_params_bytes = s.master_bytes_per_param * psi / (s.stage >= 1 ? n : 1.0);
  b.optimizer_state_bytes = s.optimizer_bytes_per_param * psi / (s.stage >= 1 ? n : 1.0);
  b.grads_bytes = c * psi / (s.stage >= 2 ? n : 1.0);
  b.compute_params_bytes = c * psi / (s.stage >= 3 ? n : 1.0);
  return b;
}

double max_relative_error(const ModelStateBytes& m, const ModelStateBytes& e) {
  double worst = 0;
  auto consider = [&](double measured, double expected) {
    if (expected > 0) {
      worst = std::max(worst, std::abs(measured - expected) / expected);
    } else if (measured > 0) {
      worst = std::max(worst, 1.0);  // something held that the formula says should not be
    }
  };
  consider(m.compute_params_bytes, e.compute_params_bytes);
  consider(m.grads_bytes, e.grads_bytes);
  consider(m.master_params_bytes, e.master_params_bytes);
  consider(m.optimizer_state_bytes, e.optimizer_state_bytes);
  consider(m.total_bytes(), e.total_bytes());
  return worst;
}

std::string format_model_state_table(const ModelStateBytes& m, const ModelStateBytes& e) {
  std::string out = fmt::format("{:<26}{:>16}{:>16}{:>10}\n", "model state (per rank)",
                                "measured B", "formula B", "error");
  auto row = [&](const char* name, double measured, double expected) {
    const double err = expected > 0 ? (measured - expected) / expected * 100.0 : 0.0;
    out += fmt::format("{:<26}{:>16.0f}{:>16.0f}{:>9.2f}%\n", name, measured, expected, err);
  };
  row("compute parameters", m.compute_params_bytes, e.compute_params_bytes);
  row("gradients", m.grads_bytes, e.grads_bytes);
  row("fp32 master parameters", m.master_params_bytes, e.master_params_bytes);
  row("optimizer moments", m.optimizer_state_bytes, e.optimizer_state_bytes);
  row("total", m.total_bytes(), e.total_bytes());
  return out;
}

}  // namespace gpumem::zero
