#include "gpumem/forensics/trace.h"

#include <algorithm>
#include <array>
#include <limits>

namespace gpumem::forensics {
namespace {

constexpr std::array<const char*, kTraceActionCount> kActionNames = {
    "alloc",         "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map",   "segment_unmap",  "snapshot",       "oom",
};

}  // namespace

const char* to_string(TraceAction action) noexcept {
  const auto i = static_cast<std::size_t>(action);
  return i < kActionNames.size() ? kActionNames[i] : "?";
}

std::optional<TraceAction> parse_trace_action(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kActionNames.size(); ++i) {
    if (name == kActionNames[i]) return static_cast<TraceAction>(i);
  }
  return std::nullopt;
}

std::uint32_t Trace::intern_site(std::string_view where) {
  if (where.empty()) return 0;
  if (site_index_.empty() && sites.size() > 1) {
    // Sites were filled directly (a copied trace): index them first.
    for (std::uint32_t i = 1; i < sites.size(); ++i) site_index_.emplace(sites[i], i);
  }
  auto [it, inserted] =
      site_index_.try_emplace(std::string(where), static_cast<std::uint32_t>(sites.size()));
  if (inserted) sites.emplace_back(where);
  return it->second;
}

std::int64_t Trace::duration_us() const noexcept {
  if (entries.size() < 2) return 0;
  // Readers bound time stamps (read_limits.h); a Trace built otherwise may hold any: saturate.
  std::int64_t d = 0;
  if (__builtin_sub_overflow(entries.back().time_us, entries.front().time_us, &d)) {
    return entries.back().time_us > entries.front().time_us ? std::numeric_limits<std::int64_t>::max() : 0;
  }
  return std::max<std::int64_t>(0, d);
}

std::size_t Trace::count(TraceAction action) const noexcept {
  return static_cast<std::size_t>(std::count_if(entries.begin(), entries.end(),
                                                [action](const TraceEntry& e) { return e.action == action; }));
}

}  // namespace gpumem::forensics
