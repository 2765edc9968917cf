// ModelStateBytes: the bytes of model state one rank holds, by kind, as in the ZeRO paper
// (Rajbhandari et al., SC'20): compute-precision parameters and gradients, fp32 master weights,
// and optimizer moments. The K of the paper is (master + moments) per parameter: 12 for Adam.
//
// expected_model_state_bytes() is the paper's formula for one rank (Rajbhandari et al., "ZeRO:
// Memory Optimizations Toward Training Trillion Parameter Models", SC 2020, section 5):
//   plain data parallel (stage 0)  (c + c + K) Ψ            with c = compute bytes (2 for bf16)
//   stage 1                        c Ψ + c Ψ + K Ψ / N
//   stage 2                        c Ψ + (c + K) Ψ / N
//   stage 3                        (c + c + K) Ψ / N
// ShardedTrainer::model_state_bytes() measures the same kinds from the tensors it holds; the two
// are printed side by side by format_model_state_table().
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace gpumem::zero {

struct ModelStateBytes {
  double compute_params_bytes = 0;   // parameters in compute precision (bf16), full or shard
  double grads_bytes = 0;            // gradients in compute precision, full or shard
  double master_params_bytes = 0;    // fp32 master weights
  double optimizer_state_bytes = 0;  // fp32 Adam moments (exp_avg, exp_avg_sq)

  double total_bytes() const {
    return compute_params_bytes + grads_bytes + master_params_bytes + optimizer_state_bytes;
  }
};

struct ModelStateShape {
  int stage = 0;                      // 0 (plain data parallel), 1, 2 or 3
  std::int64_t num_params = 0;        // Ψ
  int world_size = 1;                 // N
  int compute_bytes_per_param = 2;    // c: 2 for bf16/fp16, 4 for fp32 compute
  int master_bytes_per_param = 4;     // fp32 master copy
  int optimizer_bytes_per_param = 8;  // Adam: two fp32 moments
};

// Throws std::invalid_argument on a stage outside 0..3, a world size below 1 or negative counts.
ModelStateBytes expected_model_state_bytes(const ModelStateShape& shape);

// Largest relative difference |measured - expected| / expected over the kinds that are expected
// to be non-zero, and over the total. 0 when they agree exactly.
double max_relative_error(const ModelStateBytes& measured, const ModelStateBytes& expected);

// A small table: one row per kind, measured vs formula, and the relative error.
std::string format_model_state_table(const ModelStateBytes& measured,
                                     const ModelStateBytes& expected);

}  // namespace gpumem::zero
