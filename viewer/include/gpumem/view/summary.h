// Summary: the numbers of the forensics report at one cursor position, and the OOM verdict.
//
// The OOM verdict comes from the forensics OOM report (forensics::build_report: verdict, evidence,
// advice) when the model has one (files opened from disk). Models built in memory without it
// (tests, benchmarks) get the viewer's own estimate from the same numbers: the request against
// the largest free extent, the reserved-but-unallocated bytes and the device's free memory.
// `verdict_source` says which one produced it.
//
// Thread-safety: a plain value; summarize() is a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/view/memory_state.h"
#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

struct OomFacts {
  std::size_t cursor = 0;              // just after the oom entry
  std::uint64_t requested_bytes = 0;
  std::optional<std::uint64_t> device_free_bytes;
};

struct Summary {
  std::size_t cursor = 0;
  std::int64_t t_us = 0;  // since the first entry
  std::uint64_t allocated_bytes = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t reserved_unallocated_bytes = 0;
  std::uint64_t largest_free_extent_bytes = 0;
  std::size_t segment_count = 0;
  std::size_t live_block_count = 0;
  // Live blocks in no segment the file records (a trace that began after their segments were
  // reserved, or a file without segment entries): allocated_bytes counts them, reserved_bytes
  // cannot. The summary says so instead of showing allocated > reserved without a word.
  std::size_t outside_segment_block_count = 0;
  std::uint64_t outside_segment_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::optional<OomFacts> oom;  // the trace's OOM, if any
  std::string verdict;          // one line; empty without an OOM
  std::string verdict_detail;   // what to do (the estimate)
  std::vector<std::string> advice;    // the forensics report's advice
  std::vector<std::string> evidence;  // the forensics report's evidence
  std::string verdict_source;
};

Summary summarize(const ViewerModel& model, const MemoryState& state, std::size_t cursor);

// "1.50 GiB", "200.0 MiB", "512 B".
std::string format_bytes(std::uint64_t bytes);
// "+1.50 GiB" / "-3.0 MiB" / "0 B".
std::string format_delta_bytes(std::int64_t bytes);
// "12.345 s" / "850.0 ms".
std::string format_us(std::int64_t us);

}  // namespace gpumem::view
