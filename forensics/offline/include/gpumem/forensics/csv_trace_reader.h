// Reader of the compact CSV trace format (docs/forensics.md): gzip-compressed (or plain)
// UTF-8, the header `action,addr,size,stream,time_us,where`, then one line per trace entry.
//
// Errors: one ForensicsError naming the file and the line (or, for damaged gzip, the byte offset),
// the field that is wrong and what was expected. Numbers are checked for plausibility (sizes,
// address ranges, time stamps, the sum of sizes: read_limits.h), and a trace of more than
// ReadLimits::max_records entries is refused.
//
// Thread-safety: free functions; no shared state.
#pragma once

#include <string>
#include <string_view>

#include "gpumem/forensics/read_limits.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

// Reads a .csv.gz (or .csv) trace file.
Trace read_csv_trace(const std::string& path, const ReadLimits& limits = default_read_limits());

// Parses CSV text already in memory; `source` names it in error messages.
Trace parse_csv_trace(std::string_view text, const std::string& source,
                      const ReadLimits& limits = default_read_limits());

// The header line every CSV trace starts with.
inline constexpr std::string_view kCsvTraceHeader = "action,addr,size,stream,time_us,where";

}  // namespace gpumem::forensics
