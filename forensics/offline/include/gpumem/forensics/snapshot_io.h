// load_snapshot: opens any file gpumem's forensics reads as a Snapshot: a PyTorch memory snapshot
// pickle (torch.cuda.memory._dump_snapshot, or gpumem's writer), the same dict as JSON, or a CSV
// trace (action,addr,size,stream,time_us,where; its `where` becomes one frame per entry and it has
// no segments). Files may be gzip-compressed; the format is recognized from the content.
//
// gpumem's additions (ops on blocks and trace entries, the top-level "gpumem" dict with the per-op
// table) are read when present; PyTorch's own snapshots simply lack them.
//
// Errors: one ForensicsError naming the file and what is wrong with it; a file over the limits
// (read_limits.h) or with numbers that cannot be true (snapshot_reader.h) is refused.
// Thread-safety: free functions.
#pragma once

#include <string>

#include "gpumem/forensics/pickle_value.h"
#include "gpumem/forensics/read_limits.h"
#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

Snapshot load_snapshot(const std::string& path, const ReadLimits& limits = default_read_limits());

// Parses snapshot bytes (pickle or JSON, not compressed); `source` names them in messages.
Snapshot parse_snapshot(std::string_view bytes, const std::string& source,
                        const ReadLimits& limits = default_read_limits());

// What load_snapshot does with a file's (decompressed) bytes: a pickle, JSON, or a CSV trace.
Snapshot parse_snapshot_file_bytes(std::string_view bytes, const std::string& source,
                                   const ReadLimits& limits = default_read_limits());

// Reads gpumem's additions from a parsed snapshot dict into `snapshot` (which
// snapshot_from_pickle built from the same dict).
void read_gpumem_additions(const PickleValue& root, Snapshot& snapshot);

}  // namespace gpumem::forensics
