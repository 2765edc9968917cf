#include "gpumem/forensics/trace_loader.h"

#include <charconv>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "file_bytes.h"
#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"
#include "gpumem/forensics/snapshot_reader.h"

namespace gpumem::forensics {
namespace {

bool looks_like_pickle(const std::string& bytes) {
  if (bytes.empty()) return false;
  const auto first = static_cast<unsigned char>(bytes[0]);
  return first == 0x80 || first == '}' || first == '(';
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The value of a top-level "key": in a flat-enough JSON object (numbers and strings only).
std::optional<std::string> json_scalar(const std::string& text, std::string_view key) {
  const std::string quoted = fmt::format("\"{}\"", key);
  std::size_t pos = text.find(quoted);
  if (pos == std::string::npos) return std::nullopt;
  pos = text.find(':', pos + quoted.size());
  if (pos == std::string::npos) return std::nullopt;
  ++pos;
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t')) ++pos;
  if (pos >= text.size()) return std::nullopt;
  if (text[pos] == '"') {
    const std::size_t end = text.find('"', pos + 1);
    if (end == std::string::npos) return std::nullopt;
    return text.substr(pos + 1, end - pos - 1);
  }
  std::size_t end = pos;
  while (end < text.size() && text[end] != ',' && text[end] != '}' && text[end] != '\n') ++end;
  return text.substr(pos, end - pos);
}

template <class T>
T json_number(const std::string& text, std::string_view key, T fallback) {
  const auto s = json_scalar(text, key);
  if (!s) return fallback;
  T v{};
  auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  return ec == std::errc() ? v : fallback;
}

}  // namespace

LoadedTrace load_trace(const std::string& path, std::optional<int> device) {
  detail::FileBytes file = detail::read_file_bytes(path);
  LoadedTrace loaded;
  if (looks_like_pickle(file.bytes)) {
    const Snapshot snap = snapshot_from_pickle(parse_pickle(file.bytes, path), path);
    loaded.format = TraceFormat::snapshot;
    loaded.device = device.value_or(first_traced_device(snap));
    loaded.trace = trace_from_snapshot(snap, loaded.device);
    loaded.recorded_expandable = snap.expandable_segments;
    return loaded;
  }
  if (device && *device != 0) {
    throw ForensicsError(fmt::format("{}: a CSV trace holds one device's history; --device {} does "
                                     "not apply (leave it out)",
                                     path, *device));
  }
  loaded.format = TraceFormat::csv;
  loaded.trace = parse_csv_trace(file.bytes, path);
  return loaded;
}

std::optional<MeasuredPeaks> measured_beside(const std::string& trace_path) {
  std::string base = trace_path;
  for (std::string_view suffix : {".trace.csv.gz", ".trace.csv", ".csv.gz", ".csv", ".snapshot.pickle.gz",
                                  ".snapshot.pickle", ".pickle.gz", ".pickle", ".gz"}) {
    if (ends_with(base, suffix)) {
      base.resize(base.size() - suffix.size());
      break;
    }
  }
  const std::string json_path = base + ".json";
  std::ifstream in(json_path);
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MeasuredPeaks m;
  m.json_path = json_path;
  m.peak_reserved_bytes = json_number<std::uint64_t>(text, "peak_reserved", 0);
  if (m.peak_reserved_bytes == 0) return std::nullopt;
  m.peak_allocated_bytes = json_number<std::uint64_t>(text, "peak_allocated", 0);
  m.num_alloc_retries = json_number<std::int64_t>(text, "num_alloc_retries", 0);
  m.num_ooms = json_number<std::int64_t>(text, "num_ooms", 0);
  m.step_s = json_number<double>(text, "step_s", 0.0);
  m.alloc_conf = json_scalar(text, "alloc_conf").value_or("");
  return m;
}

}  // namespace gpumem::forensics
