// The forensics keys: trace_entries, oom_report_dir, record_ops, python_stacks,
// python_stacks_min_kb (gpumem/forensics/config.h).
// docs/config.md documents them; keep the table below and that page in step.
#include "gpumem/forensics/config.h"

#include <iterator>

#include <fmt/format.h>

namespace gpumem::forensics {
namespace {

using alloc::config_syntax::Entry;
using alloc::config_syntax::fail_value;
using alloc::config_syntax::Key;
using alloc::config_syntax::KeyInfo;

constexpr std::uint64_t kMaxTraceEntries = 1ull << 30;

void apply_trace_entries(const Entry& e, const KeyInfo& k, Config& c) {
  std::uint64_t v = alloc::config_syntax::want_uint(e, k);
  if (v > kMaxTraceEntries) fail_value(e, k, "is too large");
  c.trace_entries = static_cast<std::size_t>(v);
}

void apply_oom_report_dir(const Entry& e, const KeyInfo& k, Config& c) {
  if (e.is_list) fail_value(e, k, "is a list, but this key takes a single value");
  c.oom_report_dir = e.raw_value;  // empty = off; spaces inside the path are kept
}

void apply_record_ops(const Entry& e, const KeyInfo& k, Config& c) {
  c.record_ops = alloc::config_syntax::want_bool(e, k);
}

void apply_python_stacks(const Entry& e, const KeyInfo& k, Config& c) {
  const std::string& v = alloc::config_syntax::want_scalar(e, k);
  if (v == "auto") {
    c.python_stacks = StackMode::automatic;
  } else {
    c.python_stacks = alloc::config_syntax::want_bool(e, k) ? StackMode::on : StackMode::off;
  }
}

constexpr std::uint64_t kMaxStackMinKiB = std::uint64_t{1} << 40;  // 1 EiB

void apply_python_stacks_min_kb(const Entry& e, const KeyInfo& k, Config& c) {
  const std::uint64_t kib = alloc::config_syntax::want_uint(e, k);
  if (kib > kMaxStackMinKiB) fail_value(e, k, "is too large");
  c.python_stacks_min_bytes = static_cast<std::size_t>(kib) << 10;
}

constexpr Key<Config> kKeys[] = {
    {{"trace_entries", "", "a whole number from 0 (off) to 1073741824", "trace_entries:100000"}, apply_trace_entries},
    {{"oom_report_dir", "", "a directory path without ',', ':', '[' or ']' (empty = off)", "oom_report_dir:/tmp/oom"},
     apply_oom_report_dir},
    {{"record_ops", "", "True or False", "record_ops:True"}, apply_record_ops},
    {{"python_stacks", "", "auto (on when oom_report_dir is set), True or False", "python_stacks:True"},
     apply_python_stacks},
    {{"python_stacks_min_kb", "", "a whole number of KiB (0 = every allocation; default 1024)", "python_stacks_min_kb:64"},
     apply_python_stacks_min_kb},
};

}  // namespace

alloc::config_syntax::KeyTable config_key_table(Config& target) { return alloc::config_syntax::KeyTable(kKeys, target); }

const char* to_string(StackMode mode) noexcept {
  switch (mode) {
    case StackMode::automatic: return "auto";
    case StackMode::off: return "False";
    case StackMode::on: return "True";
  }
  return "auto";
}

std::string to_string(const Config& c) {
  return fmt::format("trace_entries:{},oom_report_dir:{},record_ops:{},python_stacks:{},python_stacks_min_kb:{}",
                     c.trace_entries, c.oom_report_dir, alloc::config_syntax::bool_text(c.record_ops),
                     to_string(c.python_stacks), c.python_stacks_min_bytes >> 10);
}

}  // namespace gpumem::forensics
