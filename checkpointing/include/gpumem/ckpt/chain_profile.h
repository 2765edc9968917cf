// ChainProfile: what one profiled training step of a sequential chain measured, per module.
// The planner's only input; plain data, so it can be built by the libtorch profiler
// (chain_profiler.h), by hand in tests, or loaded from elsewhere.
//
// Memory is allocated bytes as the probe reports them (see memory_probe.h), taken in one step
// run without checkpointing. Names: A[i] is the allocated bytes just before module i's forward
// (A[0] = base_bytes, with the chain input and all model state alive), A[i+1] just after it.
//
// Invariants: fwd_peak_bytes, bwd_peak_bytes, head_peak_bytes and the times are >= 0;
// output_bytes > 0 for a module whose output feeds the next one.
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpumem::ckpt {

struct ModuleProfile {
  std::string name;
  std::int64_t kept_bytes = 0;       // A[i+1] - A[i]: what the module leaves allocated for
                                     // backward, its output included (may be negative when it
                                     // frees an input nobody saved)
  std::int64_t output_bytes = 0;     // bytes of the module's output tensor
  std::int64_t fwd_peak_bytes = 0;   // peak during its forward, above A[i]
  std::int64_t bwd_extra_bytes = 0;  // allocated when its backward starts, minus A[i+1]:
                                     // gradients in flight, parameter gradients of later
                                     // modules, what the loss left behind
  std::int64_t bwd_peak_bytes = 0;   // peak during its backward, above the start of it
  std::int64_t bwd_peak_held_bytes = 0;  // the same while the gradient of its output stays
                                         // allocated to the end of its backward, as a
                                         // checkpointed segment's backward keeps it (0: not
                                         // measured; bwd_peak_bytes is used)
  std::int64_t freed_before_bwd_bytes = 0;  // part of kept_bytes already freed when its
                                            // backward starts: its output, if nothing saved it
  double fwd_ns = 0;                 // forward time (the recompute cost if checkpointed)
  double bwd_ns = 0;                 // backward time
};

struct ChainProfile {
  std::vector<ModuleProfile> modules;
  std::int64_t base_bytes = 0;       // A[0]
  std::int64_t head_peak_bytes = 0;  // peak from the end of the chain's forward until the
                                     // gradient of its output is ready (loss forward and
                                     // backward), above A[n]
  std::int64_t measured_peak_bytes = 0;  // the step's measured peak (no checkpointing)
  double fwd_bwd_ns = 0;             // forward + loss + backward of one step, not instrumented
  std::string probe;                 // which probe measured the bytes

  std::size_t size() const noexcept { return modules.size(); }
};

// A table of the profile, one module per line, for humans.
std::string format_profile(const ChainProfile& profile);

}  // namespace gpumem::ckpt
