// Snapshot: PyTorch's memory snapshot (torch.cuda.memory._snapshot(); PyTorch 2.11's
// torch/cuda/memory.py documents its layout) as plain C++ data: the segments with their blocks,
// one trace per device, and the allocator settings.
//
// Fields a snapshot may lack (older PyTorch versions, snapshots without history) take the
// defaults below. Frames are innermost first, as PyTorch writes them.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/forensics/pickle_value.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

// gpumem's additions to PyTorch's snapshot dict (written under the key "gpumem"; PyTorch's tools
// ignore it). version 0 = the snapshot did not come from gpumem. (Snapshots of gpumem before the
// reports built their tables from the trace also carried a per-op table, "ops": readers ignore it.)
struct GpumemSnapshotInfo {
  static constexpr int kVersion = 1;
  int version = 0;
  std::string settings;                  // gpumem's configuration string
  std::uint64_t device_total_bytes = 0;  // 0 = unknown
  std::uint64_t device_free_bytes = 0;   // when the snapshot was taken; 0 = unknown
  std::uint64_t cap_bytes = 0;           // cap on reserved bytes; 0 = none / unknown
  // Blocks and trace entries without frames but with an op are written with frames naming the
  // op (and, for entries, the user scope in user_metadata) as {name, filename "??", line 0}, so
  // PyTorch's viewer shows them; reading such a file removes those frames again.
  bool op_frames = false;
};

struct SnapshotFrame {
  std::string name;      // function
  std::string filename;  // "??" for C++ frames without symbols
  std::int64_t line = 0;
};

struct SnapshotBlock {
  std::uint64_t address = 0;
  std::uint64_t size_bytes = 0;
  std::uint64_t requested_bytes = 0;
  std::string state;  // "active_allocated", "active_pending_free" or "inactive"
  std::vector<SnapshotFrame> frames;
  std::string op;  // gpumem: the op that allocated it ("" = unknown)
};

struct SnapshotSegment {
  int device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size_bytes = 0;
  std::uint64_t allocated_size_bytes = 0;
  std::uint64_t active_size_bytes = 0;
  std::uint64_t requested_size_bytes = 0;
  std::uint64_t stream = 0;
  std::string segment_type;  // "large" or "small"
  std::pair<std::int64_t, std::int64_t> pool_id{0, 0};
  bool is_expandable = false;
  std::vector<SnapshotBlock> blocks;
  std::vector<SnapshotFrame> frames;
};

struct SnapshotTraceEntry {
  TraceAction action = TraceAction::alloc;
  std::uint64_t addr = 0;         // oom entries: 0 (see device_free_bytes)
  std::uint64_t size_bytes = 0;
  std::uint64_t stream = 0;
  std::int64_t time_us = 0;
  std::optional<std::uint64_t> device_free_bytes;  // oom entries only
  std::string compile_context;
  std::string user_metadata;
  std::vector<SnapshotFrame> frames;
  std::string op;  // gpumem: the innermost op current at the event ("" = unknown)
};

struct Snapshot {
  std::string source;  // the file it came from
  std::vector<SnapshotSegment> segments;
  std::vector<std::vector<SnapshotTraceEntry>> device_traces;  // index = device
  // allocator_settings as written (a dict), or None when the snapshot has none.
  PickleValue allocator_settings;
  bool expandable_segments = false;  // from allocator_settings, false if absent
  std::int64_t max_split_size = -1;  // from allocator_settings, -1 = unlimited / absent
  GpumemSnapshotInfo gpumem;         // gpumem's additions (version 0 when absent)
};

// The call site PyTorch's CSV traces use: the innermost frame that is not inside torch itself and
// has a file, as "basename:line:function" (commas replaced by ';'); empty if there is none.
std::string call_site(const std::vector<SnapshotFrame>& frames);

// One device's trace as the replay's Trace model. Throws ForensicsError if the device has none.
Trace trace_from_snapshot(const Snapshot& snapshot, int device);

// Sets seg's total, allocated, active and requested sizes from its blocks: total = every block,
// allocated and requested = active_allocated blocks, active = every block that is not inactive.
void recompute_sizes(SnapshotSegment& seg) noexcept;

// The first device whose trace is not empty (0 if none is).
int first_traced_device(const Snapshot& snapshot) noexcept;

}  // namespace gpumem::forensics
