// load_trace: opens a trace file whatever its format: a PyTorch snapshot pickle (from
// torch.cuda.memory._dump_snapshot, optionally gzip-compressed) or a CSV trace (.csv or .csv.gz).
// The format is recognized from the content, not the name.
//
// measured_beside: PyTorch's own numbers for a trace, read from the JSON file that sits beside it
// (NAME.json for NAME.trace.csv.gz, NAME.snapshot.pickle, NAME.pickle or NAME.csv), as the shared
// traces and the one shipped in traces/ have.
//
// Thread-safety: free functions; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gpumem/forensics/read_limits.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

enum class TraceFormat : std::uint8_t { csv, snapshot };

struct LoadedTrace {
  Trace trace;
  TraceFormat format = TraceFormat::csv;
  int device = 0;                    // the snapshot device the trace came from (0 for CSV)
  bool recorded_expandable = false;  // snapshot settings said expandable_segments:True
};

// device: which device's trace to take from a snapshot (default: the first with entries).
// CSV traces hold one device; asking for another device than 0 is an error.
LoadedTrace load_trace(const std::string& path, std::optional<int> device = std::nullopt,
                       const ReadLimits& limits = default_read_limits());

struct MeasuredPeaks {
  std::string json_path;
  std::string alloc_conf;  // PYTORCH_CUDA_ALLOC_CONF of the recorded run
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  double step_s = 0.0;  // mean step time, 0 if absent
};

// The .json beside trace_path, if there is one with peak_reserved; nullopt otherwise. A JSON file
// that is there but is not valid JSON is an error (ForensicsError naming it and the position).
std::optional<MeasuredPeaks> measured_beside(const std::string& trace_path);

}  // namespace gpumem::forensics
