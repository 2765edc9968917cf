// Trace: one device's allocator history in PyTorch's vocabulary, the common model that the CSV
// and snapshot readers produce and the replay consumes.
//
// Entries are in recording order. `addr` is the address PyTorch handed out (0 for oom/snapshot);
// `size_bytes` is the size the program requested for alloc and the frees, the segment size for
// segment actions, and the requested size for oom. `site` indexes Trace::sites, the trace's
// `where` strings (site 0 is always the empty string: no call site known).
//
// Thread-safety: a plain value; share it read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpumem::forensics {

enum class TraceAction : std::uint8_t {
  alloc,
  free_requested,
  free_completed,
  segment_alloc,
  segment_free,
  segment_map,
  segment_unmap,
  snapshot,
  oom,
};

inline constexpr int kTraceActionCount = 9;

// PyTorch's action name ("alloc", "free_completed", ...).
const char* to_string(TraceAction action) noexcept;
std::optional<TraceAction> parse_trace_action(std::string_view name) noexcept;

struct TraceEntry {
  TraceAction action = TraceAction::alloc;
  std::uint32_t site = 0;       // index into Trace::sites
  std::uint64_t addr = 0;
  std::uint64_t size_bytes = 0;
  std::uint64_t stream = 0;     // cudaStream_t as an integer, 0 = default stream
  std::int64_t time_us = 0;
};

struct Trace {
  std::string source;                 // the file it came from (for messages)
  std::vector<TraceEntry> entries;
  std::vector<std::string> sites{""};  // site strings, "file:line:function"

  // Interns a site string and returns its index.
  std::uint32_t intern_site(std::string_view where);
  // Microseconds from the first to the last entry (0 for fewer than two entries).
  std::int64_t duration_us() const noexcept;
  // Number of entries of each action.
  std::size_t count(TraceAction action) const noexcept;

 private:
  std::unordered_map<std::string, std::uint32_t> site_index_;
};

}  // namespace gpumem::forensics
