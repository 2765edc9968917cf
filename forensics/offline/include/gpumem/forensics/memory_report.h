// MemoryReport: what `gpumem report` says about a snapshot or trace: where the memory went (live
// bytes by op and by call site, the per-op table), how fragmented it is, and, when the file
// records an OOM, an analysis of the failed request at the moment it failed.
//
// The OOM analysis works on state_at_moment (frees recorded after the oom entry rolled back, and
// the report says so). Its verdict is one of:
//   fragmentation   enough memory is cached free for the request, but no free extent it could
//                   use is large enough (largest usable extent < rounded request <= free)
//   pending_frees   the request would fit if blocks freed but still in use on other streams
//                   were released
//   outside_memory  the device's memory is held outside the allocator (the device total minus
//                   its free memory minus what the allocator reserved would hold the request)
//   capacity        live memory really is too large for the cap or the device
// with the numbers that support it, and advice computed from the data (a replay of the trace up
// to the OOM under gpumem's default policy with the same memory; the bytes the pinned segments'
// blocks keep from being released; the call sites holding the most live memory).
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/forensics/fragmentation.h"
#include "gpumem/forensics/oom_moment.h"
#include "gpumem/forensics/op_table.h"
#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

struct LiveGroup {
  std::string name;  // op or call site; "(unknown)" when the file does not say
  std::uint64_t live_bytes = 0;
  std::uint64_t blocks = 0;
};

struct OomAnalysis {
  std::uint64_t request_bytes = 0;
  std::uint64_t rounded_request_bytes = 0;
  std::uint64_t largest_usable_extent_bytes = 0;  // on the request's stream and pool
  std::uint64_t stream = 0;
  std::int64_t time_us = 0;
  std::string site;                                // where the failed request came from
  std::string op;
  std::optional<std::uint64_t> device_free_bytes;
  std::optional<std::uint64_t> device_total_bytes;
  std::optional<std::uint64_t> cap_bytes;
  std::optional<std::uint64_t> outside_bytes;      // device total - free - reserved
  std::string verdict;
  std::vector<std::string> evidence;
  std::vector<std::string> advice;
};

struct MemoryReport {
  std::string source;
  int device = 0;
  std::size_t trace_entries = 0;
  StateAtMoment moment;              // segments described (at the OOM when there is one)
  Fragmentation fragmentation;
  std::optional<OomAnalysis> oom;
  std::vector<LiveGroup> top_ops;
  std::vector<LiveGroup> top_sites;
  std::vector<OpRow> op_table;       // gpumem's table, else built from the trace by op
  std::vector<OpRow> site_table;     // built from the trace by call site
  std::vector<std::string> notes;    // what was done to the data (rollbacks, reconstruction)
};

struct ReportOptions {
  std::size_t top = 10;
  std::optional<int> device;  // default: the device with an oom, else the first traced one
  bool replay_advice = true;  // replay the trace under gpumem's policy for the advice
};

MemoryReport build_report(const Snapshot& snapshot, const ReportOptions& options = {});

std::string render_report_text(const MemoryReport& report);
std::string render_report_json(const MemoryReport& report);

// PyTorch's rounding of a request to a block size (512-byte multiples, at least 512).
std::uint64_t rounded_request(std::uint64_t requested_bytes) noexcept;

}  // namespace gpumem::forensics
