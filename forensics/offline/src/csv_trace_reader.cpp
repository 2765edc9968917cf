#include "gpumem/forensics/csv_trace_reader.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "file_bytes.h"
#include "gpumem/forensics/error.h"
#include "plausibility.h"

namespace gpumem::forensics {
namespace {

template <class T>
bool parse_number(std::string_view field, T& out) {
  if (field.empty()) return false;
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, out);
  return ec == std::errc() && ptr == end;
}

std::string_view shown(std::string_view s) {
  return s.size() > 60 ? s.substr(0, 60) : s;
}

}  // namespace

Trace parse_csv_trace(std::string_view text, const std::string& source, const ReadLimits& limits) {
  Trace trace;
  trace.source = source;
  if (text.empty()) {
    throw ForensicsError(fmt::format(
        "{}: the file is empty; a CSV trace starts with the header line '{}'", source,
        kCsvTraceHeader));
  }
  std::size_t pos = 0;
  std::size_t line_no = 0;
  bool header_seen = false;
  trace.entries.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(text.size() / 48, limits.max_records)));
  detail::SizeSum total;
  while (pos < text.size()) {
    const std::size_t eol = text.find('\n', pos);
    const bool last_without_newline = eol == std::string_view::npos;
    std::string_view line = text.substr(pos, last_without_newline ? text.size() - pos : eol - pos);
    pos = last_without_newline ? text.size() : eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!header_seen) {
      if (line != kCsvTraceHeader) {
        throw ForensicsError(fmt::format(
            "{}: line 1 is '{}', not the CSV trace header '{}'; this is not a gpumem/PyTorch CSV "
            "trace (snapshot pickles are read by the same command, CSV needs the header)",
            source, shown(line), kCsvTraceHeader));
      }
      header_seen = true;
      continue;
    }
    if (line.empty()) {
      if (last_without_newline) break;
      continue;  // blank lines carry nothing
    }
    auto fail = [&](std::string_view what) -> void {
      const char* cut = last_without_newline
                            ? " (it is the last line and has no newline: the file looks truncated)"
                            : "";
      throw ForensicsError(fmt::format("{}: line {}: {}{}; the line is '{}'", source, line_no,
                                       what, cut, shown(line)));
    };
    std::string_view fields[6];
    std::size_t start = 0;
    for (int f = 0; f < 5; ++f) {
      const std::size_t comma = line.find(',', start);
      if (comma == std::string_view::npos) {
        fail(fmt::format("expected 6 comma-separated fields (action,addr,size,stream,time_us,where), "
                         "found {}", f + 1));
      }
      fields[f] = line.substr(start, comma - start);
      start = comma + 1;
    }
    fields[5] = line.substr(start);

    TraceEntry e;
    const auto action = parse_trace_action(fields[0]);
    if (!action) {
      fail(fmt::format("unknown action '{}' (expected one of alloc, free_requested, free_completed, "
                       "segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom)",
                       shown(fields[0])));
    }
    e.action = *action;
    if (!parse_number(fields[1], e.addr)) fail(fmt::format("addr '{}' is not a non-negative integer", shown(fields[1])));
    if (!parse_number(fields[2], e.size_bytes)) fail(fmt::format("size '{}' is not a non-negative integer", shown(fields[2])));
    if (!parse_number(fields[3], e.stream)) fail(fmt::format("stream '{}' is not a non-negative integer", shown(fields[3])));
    if (!parse_number(fields[4], e.time_us)) fail(fmt::format("time_us '{}' is not an integer", shown(fields[4])));
    if (const std::string why = detail::implausible_numbers(e.addr, e.size_bytes, e.time_us); !why.empty()) {
      fail(why + ": the trace is damaged");
    }
    if (!total.add(e.size_bytes)) fail(detail::total_too_large("entries up to this line") + ": the trace is damaged");
    if (trace.entries.size() >= limits.max_records) {
      fail(fmt::format("the trace holds more than {} entries; {}", limits.max_records,
                       read_limit_hint("GPUMEM_MAX_RECORDS", limits.max_records)));
    }
    e.site = trace.intern_site(fields[5]);
    trace.entries.push_back(e);
  }
  if (!header_seen) {
    throw ForensicsError(fmt::format("{}: no header line; a CSV trace starts with '{}'", source,
                                     kCsvTraceHeader));
  }
  return trace;
}

Trace read_csv_trace(const std::string& path, const ReadLimits& limits) {
  const detail::FileBytes file = detail::read_file_bytes(path, limits);
  return parse_csv_trace(file.bytes, path, limits);
}

}  // namespace gpumem::forensics
