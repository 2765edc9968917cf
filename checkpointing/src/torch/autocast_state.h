// AutocastState: the thread's autocast settings (enabled and dtype for CPU and CUDA, whether
// casts are cached), captured when a checkpointed function runs forward and put back for its
// recompute, which may run on another thread (the CUDA backward thread) or after the caller
// left its autocast region.
//
// AutocastCacheOff disables the autocast weight-cast cache for a scope. Note [Autocast cache
// and checkpoints]: the cache keeps the low-precision copy of an fp32 leaf (a weight) from its
// first cast until the autocast region ends. Inside a checkpointed segment that would keep a
// bf16 copy of every weight of the segment alive through the whole step, which is memory the
// checkpoint is meant to free (1.5 GB for a 0.7 B-parameter model); without the cache the copy
// made in the no-grad forward dies at once and the one made by the recompute dies with the
// segment's backward. It also keeps torch releases before the fix of pytorch #158232 safe: they
// cached casts made under no_grad without a graph, and a later use of the weight in the same
// region lost its gradient.
//
// Thread-safety: all of it is thread-local state of the calling thread.
#pragma once

#include <c10/core/ScalarType.h>

namespace gpumem::ckpt::detail {

struct AutocastState {
  bool cpu_enabled = false;
  bool cuda_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
  bool cache_enabled = true;

  static AutocastState capture();
  void apply() const;
};

// Applies a state for a scope; puts the thread's previous state back when it ends.
class AutocastStateGuard {
 public:
  explicit AutocastStateGuard(const AutocastState& apply);
  ~AutocastStateGuard();
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  AutocastState outside_;
};

class AutocastCacheOff {
 public:
  AutocastCacheOff();
  ~AutocastCacheOff();
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool was_enabled_;
};

}  // namespace gpumem::ckpt::detail
