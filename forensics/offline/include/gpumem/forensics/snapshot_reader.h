// Reader of PyTorch memory snapshots: the pickle torch.cuda.memory._dump_snapshot writes (or
// libtorch's torch::cuda::_memory_snapshot_pickled), turned into a Snapshot.
//
// Required: a dict with `segments` (list) and `device_traces` (list of lists). Everything else is
// optional and defaulted, so snapshots of other PyTorch versions with the same fields read too.
// Errors: one ForensicsError naming the file and what is missing or malformed (for pickle damage,
// the byte offset).
//
// Thread-safety: free functions; no shared state.
#pragma once

#include <string>

#include "gpumem/forensics/pickle_value.h"
#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

Snapshot read_snapshot(const std::string& path);

// Builds a Snapshot from an already parsed pickle; `source` names it in messages.
Snapshot snapshot_from_pickle(const PickleValue& root, const std::string& source);

}  // namespace gpumem::forensics
