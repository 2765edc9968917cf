// Policy names, as `gpumem replay --policy` takes them:
//   gpumem               gpumem's engine with its default configuration
//   gpumem:CONF          ... with the configuration string CONF: the engine's keys (alloc::Config;
//                        GPUMEM_ALLOC_CONF syntax; keys of other layers, such as source or
//                        trace_entries, change nothing a replay does and are refused)
//   pytorch              the model of PyTorch 2.11's native allocator, default settings
//   pytorch:expandable   ... with expandable_segments:True
//   pytorch:CONF         ... with the PYTORCH_CUDA_ALLOC_CONF string CONF (keys the model uses:
//                        expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
//                        large_segment_size_mb, roundup_power2_divisions,
//                        garbage_collection_threshold, per_process_memory_fraction)
// A bad name or configuration is one ForensicsError naming it and listing the accepted forms.
//
// Thread-safety: free functions; the factories they return may be called from any thread.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/forensics/pytorch_policy.h"
#include "gpumem/forensics/replay.h"

namespace gpumem::forensics {

struct ReplayEnvironment {
  std::size_t device_total_bytes = kH200TotalBytes;
  // A cap on reserved bytes applied to every policy (--memory-limit); max = none.
  std::size_t memory_limit_bytes = std::numeric_limits<std::size_t>::max();
};

struct PolicySpec {
  std::string name;
  PolicyFactory make;
  bool step_plan = false;  // a gpumem policy whose engine has the step planner (it uses step marks)
};

PolicySpec parse_policy_spec(std::string_view text, const ReplayEnvironment& env = {});

// The policies `gpumem replay` compares when none is named.
std::vector<std::string> default_policy_names();

// One line per accepted form, for --help and error messages.
std::string policy_forms_help();

}  // namespace gpumem::forensics
