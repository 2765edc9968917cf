// forensics::Config: the keys of gpumem's in-process forensics (what EngineForensics attaches to
// an engine). They are written in the same string as the engine's keys (GPUMEM_ALLOC_CONF; see
// docs/config.md), which gpumem::torch::parse_config parses once for every layer; this layer owns
// their type, their validation and their canonical spelling.
//
//   trace_entries:N        the engine's trace ring keeps the last N events (0 = off)
//   oom_report_dir:PATH    an OOM writes a snapshot and a report in PATH (empty = off)
//   record_ops:True|False  events are tagged with the PyTorch op that made them (at::RecordFunction)
//   record_stacks:auto|python|none
//                          allocations keep the Python stack that made them (torch's
//                          CapturedTraceback; symbolized only when a snapshot is taken);
//                          auto = python when oom_report_dir is set, so that a postmortem alone
//                          names the Python lines holding the memory
//
// Thread-safety: a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/alloc/config_syntax.h"

namespace gpumem::forensics {

// Which stacks allocations keep (record_stacks).
enum class StackMode : std::uint8_t { automatic, none, python };
const char* to_string(StackMode mode) noexcept;

struct Config {
  // trace_entries: records the trace ring keeps (0 = no ring unless the postmortem needs one).
  std::size_t trace_entries = 0;
  // oom_report_dir: where the OOM postmortem is written; empty = no postmortem.
  std::string oom_report_dir;
  // record_ops: attribute allocations to the op current on the allocating thread.
  bool record_ops = false;
  // record_stacks: see above; python_stacks() resolves auto.
  StackMode record_stacks = StackMode::automatic;

  bool python_stacks() const noexcept {
    return record_stacks == StackMode::python || (record_stacks == StackMode::automatic && !oom_report_dir.empty());
  }

  friend bool operator==(const Config& a, const Config& b) noexcept = default;
};

// A canonical `key:value,...` string of the forensics keys.
std::string to_string(const Config& config);

// The forensics keys bound to target, for the parse that joins every layer's keys.
alloc::config_syntax::KeyTable config_key_table(Config& target);

}  // namespace gpumem::forensics
