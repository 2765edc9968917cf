// Reader of PyTorch memory snapshots: the pickle torch.cuda.memory._dump_snapshot writes (or
// libtorch's torch::cuda::_memory_snapshot_pickled), turned into a Snapshot.
//
// Required: a dict with `segments` (list) and `device_traces` (list of lists). Everything else is
// optional and defaulted, so snapshots of other PyTorch versions with the same fields read too.
// Errors: one ForensicsError naming the file and what is missing or malformed (for pickle damage,
// the byte offset).
//
// Consistency: a file whose numbers cannot be true is refused rather than read into numbers that
// are silently wrong: sizes and address ranges must be plausible (read_limits.h), blocks lie inside
// their segment in address order without overlapping, segments of a device do not overlap, and
// the segments' and the trace's sizes add up to at most kMaxTotalBytes. At most
// ReadLimits::max_records segments, blocks, trace entries and frames are decoded.
//
// Thread-safety: free functions; no shared state.
#pragma once

#include <string>

#include "gpumem/forensics/pickle_value.h"
#include "gpumem/forensics/read_limits.h"
#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

Snapshot read_snapshot(const std::string& path, const ReadLimits& limits = default_read_limits());

// Builds a Snapshot from an already parsed pickle; `source` names it in messages.
Snapshot snapshot_from_pickle(const PickleValue& root, const std::string& source,
                              const ReadLimits& limits = default_read_limits());

}  // namespace gpumem::forensics
