// Writers of a Snapshot: the pickle PyTorch's tools read (torch.cuda._memory_viz and the
// memory_viz page's MemoryViz.js) and the same dict as JSON (which newer memory_viz pages also
// accept, and which anything else can parse).
//
// The pickle is protocol 2 and uses only the opcodes MemoryViz.js's own unpickler accepts
// (the unpickler in PyTorch 2.11's torch/utils/viz/MemoryViz.js): PROTO, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS,
// APPENDS, TUPLE2, BININT, BININT1, BININT2, LONG1, BINFLOAT, BINUNICODE, NEWTRUE, NEWFALSE,
// NONE, BINPUT, LONG_BINPUT, BINGET, LONG_BINGET, STOP. Repeated strings (keys, op names, frame
// file and function names) and repeated frames lists are written once and referred to through the
// memo; the keys and the most common values go first, in a list under the top-level key
// "gpumem_keys", so that their references take two bytes.
//
// Layout: PyTorch 2.11's dict (segments, device_traces, allocator_settings,
// external_annotations) plus gpumem's additions, which PyTorch's tools ignore: an "op" key on
// blocks and trace entries that have one, and a top-level "gpumem" dict (version, settings,
// device_total, device_free, cap, ops: the per-op table). Sets and bytes in allocator_settings are
// written as lists and str (the viewer's unpickler has neither).
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <string>

#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

enum class SnapshotFormat { pickle, json };

std::string snapshot_to_pickle(const Snapshot& snapshot);
std::string snapshot_to_json(const Snapshot& snapshot);

// The format a file name asks for: a name ending in ".json" is JSON, anything else the pickle.
SnapshotFormat snapshot_format_for(const std::string& path) noexcept;

// Writes the snapshot to path (replacing it) in the format its name asks for. Throws
// ForensicsError naming the path when it cannot be written.
void write_snapshot(const Snapshot& snapshot, const std::string& path);

}  // namespace gpumem::forensics
