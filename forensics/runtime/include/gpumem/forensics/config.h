// forensics::Config: the keys of gpumem's in-process forensics (what EngineForensics attaches to
// an engine). They are written in the same string as the engine's keys (GPUMEM_ALLOC_CONF; see
// docs/config.md), which gpumem::torch::parse_config parses once for every layer; this layer owns
// their type, their validation and their canonical spelling.
//
//   trace_entries:N        the engine's trace ring keeps the last N events (0 = off)
//   oom_report_dir:PATH    an OOM writes a snapshot and a report in PATH (empty = off)
//   record_ops:True|False  events are tagged with the PyTorch op that made them (at::RecordFunction)
//   python_stacks:auto|True|False
//                          allocations keep the Python stack that made them (torch's
//                          CapturedTraceback, symbolized only when a snapshot or postmortem is
//                          written), so reports name the Python file:line holding the memory.
//                          auto (the default) = on when oom_report_dir is set.
//   python_stacks_min_kb:N only allocations of at least N KiB gather a stack (default 1024: PyTorch's
//                          large-pool requests, which hold 99.6-99.9% of the bytes live at the
//                          peak of the repository's training traces but are only 55-61% of the
//                          allocations; 0 = every allocation)
//
// The gathering is the torch adapter's (gpumem_forensics_torch, python_stacks.h); a composer
// without it (the engine alone) keeps no stacks whatever python_stacks says.
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

// python_stacks: auto follows oom_report_dir.
enum class StackMode : std::uint8_t { automatic, off, on };
const char* to_string(StackMode mode) noexcept;

struct Config {
  // trace_entries: records the trace ring keeps (0 = no ring unless the postmortem needs one).
  std::size_t trace_entries = 0;
  // oom_report_dir: where the OOM postmortem is written; empty = no postmortem.
  std::string oom_report_dir;
  // record_ops: attribute allocations to the op current on the allocating thread.
  bool record_ops = false;
  // python_stacks: whether allocations keep their Python stack (see python_stacks_on()).
  StackMode python_stacks = StackMode::automatic;
  // python_stacks_min_kb, in bytes: smaller allocations gather no stack.
  static constexpr std::size_t kDefaultStackMinBytes = std::size_t{1} << 20;
  std::size_t python_stacks_min_bytes = kDefaultStackMinBytes;

  // python_stacks as it applies: on, or auto with oom_report_dir set.
  bool python_stacks_on() const noexcept {
    return python_stacks == StackMode::on || (python_stacks == StackMode::automatic && !oom_report_dir.empty());
  }

  friend bool operator==(const Config& a, const Config& b) noexcept = default;
};

// A canonical `key:value,...` string of the forensics keys.
std::string to_string(const Config& config);

// The forensics keys bound to target, for the parse that joins every layer's keys.
alloc::config_syntax::KeyTable config_key_table(Config& target);

}  // namespace gpumem::forensics
