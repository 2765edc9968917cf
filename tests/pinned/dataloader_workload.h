// A DataLoader-style stream of pinned-buffer requests, shared by the pinned tests and the pinned
// benchmark: what torch.utils.data.DataLoader(pin_memory=True) asks of the pinned allocator.
//
// Each step pins one batch: images [B, 3, S, S] float32, token ids and an attention mask [B, L]
// int64 with L a multiple of 8 in [64, 512] (variable-length text), and labels [B] int64. B is 32,
// except the last batch of an epoch (every 50 steps), which is 1..32. S is 224 (fixed-size
// training), or, with multi_scale, drawn per batch from the resize buckets {160, 192, ..., 320}
// (multi-scale training: image buffers of six sizes, the hard case for any cache). The pin-memory thread runs `window` batches ahead of the training loop
// (num_workers x prefetch_factor); a batch is freed when the loop has copied it to the device, and
// the copy completes `copy_lag` steps later (its marker stays pending until then).
//
// Deterministic for a seed (std::mt19937_64 and explicit arithmetic, no std distributions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace gpumem::pinned::testing {

struct DataLoaderShape {
  std::size_t batch = 32;
  std::size_t steps_per_epoch = 50;
  std::size_t window = 8;    // batches pinned ahead of the loop
  std::size_t copy_lag = 2;  // steps until the copy of a freed batch completes
  bool multi_scale = false;  // image side drawn per batch instead of 224
};

// The byte sizes of one batch's tensors.
inline std::vector<std::size_t> next_batch(std::mt19937_64& rng, std::size_t step, const DataLoaderShape& shape) {
  static constexpr std::size_t kSides[] = {160, 192, 224, 256, 288, 320};
  const bool last = (step + 1) % shape.steps_per_epoch == 0;
  const std::size_t b = last ? 1 + rng() % shape.batch : shape.batch;
  const std::size_t pick = rng() % 6;
  const std::size_t side = shape.multi_scale ? kSides[pick] : 224;
  const std::size_t len = 64 + 8 * (rng() % 57);  // 64..512
  return {b * 3 * side * side * 4, b * len * 8, b * len * 8, b * 8};
}

}  // namespace gpumem::pinned::testing
