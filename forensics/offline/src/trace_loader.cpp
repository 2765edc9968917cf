#include "gpumem/forensics/trace_loader.h"

#include <fstream>
#include <type_traits>

#include <fmt/format.h>

#include "file_bytes.h"
#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"
#include "gpumem/forensics/snapshot_reader.h"
#include "json_reader.h"

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

// A top-level number of a measured-peaks JSON (absent, null or of another kind: fallback).
template <class T>
T json_number(const PickleValue& root, const char* key, T fallback) {
  const PickleValue* v = root.find(key);
  if (!v) return fallback;
  if constexpr (std::is_floating_point_v<T>) {
    return v->is_int() || v->is_float() ? static_cast<T>(v->as_float()) : fallback;
  } else if constexpr (std::is_unsigned_v<T>) {
    return v->is_int() && v->as_int() >= 0 ? static_cast<T>(v->as_int()) : fallback;
  } else {
    return v->is_int() ? static_cast<T>(v->as_int()) : fallback;
  }
}

}  // namespace

LoadedTrace load_trace(const std::string& path, std::optional<int> device, const ReadLimits& limits) {
  detail::FileBytes file = detail::read_file_bytes(path, limits);
  LoadedTrace loaded;
  if (looks_like_pickle(file.bytes)) {
    const Snapshot snap = snapshot_from_pickle(parse_pickle(file.bytes, path, limits), path, limits);
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
  loaded.trace = parse_csv_trace(file.bytes, path, limits);
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
  if (!std::ifstream(json_path)) return std::nullopt;
  // It is read like any other file the user hands in: a damaged one is an error, not a guess.
  const detail::FileBytes file = detail::read_file_bytes(json_path, default_read_limits());
  const PickleValue root = detail::parse_json(file.bytes, json_path, default_read_limits());
  MeasuredPeaks m;
  m.json_path = json_path;
  m.peak_reserved_bytes = json_number<std::uint64_t>(root, "peak_reserved", 0);
  if (m.peak_reserved_bytes == 0) return std::nullopt;
  m.peak_allocated_bytes = json_number<std::uint64_t>(root, "peak_allocated", 0);
  m.num_alloc_retries = json_number<std::int64_t>(root, "num_alloc_retries", 0);
  m.num_ooms = json_number<std::int64_t>(root, "num_ooms", 0);
  m.step_s = json_number<double>(root, "step_s", 0.0);
  if (const PickleValue* conf = root.find("alloc_conf"); conf && conf->is_string()) m.alloc_conf = conf->as_string();
  return m;
}

}  // namespace gpumem::forensics
