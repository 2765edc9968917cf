// Reader of the compact CSV trace format (docs/forensics.md): gzip-compressed (or plain)
// UTF-8, the header `action,addr,size,stream,time_us,where`, then one line per trace entry.
//
// Errors: one ForensicsError naming the file and the line (or, for damaged gzip, the byte offset),
// the field that is wrong and what was expected.
//
// Thread-safety: free functions; no shared state.
#pragma once

#include <string>
#include <string_view>

#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

// Reads a .csv.gz (or .csv) trace file.
Trace read_csv_trace(const std::string& path);

// Parses CSV text already in memory; `source` names it in error messages.
Trace parse_csv_trace(std::string_view text, const std::string& source);

// The header line every CSV trace starts with.
inline constexpr std::string_view kCsvTraceHeader = "action,addr,size,stream,time_us,where";

}  // namespace gpumem::forensics
