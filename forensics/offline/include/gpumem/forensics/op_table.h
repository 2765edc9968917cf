// OpTable: where memory went, per op. One row per op name (aten::mm, a user scope, ...) or, for
// snapshots without op names, per call site: the key is whatever the caller attributes events to.
//
// OpTableBuilder folds a stream of allocator events, each tagged with the key current when it
// happened, into the rows:
//   calls                   runs of consecutive events under the key (one call of the op that
//                           touched memory)
//   allocs, allocated_bytes allocations made under the key and their bytes (as recorded)
//   live_bytes              bytes of those allocations not freed yet
//   peak_contribution_bytes live_bytes of the key at the moment the total live bytes peaked
//   reserved_growth_bytes   segment_alloc / segment_map bytes while the key was current
//   frag_*                  fragmentation = reserved - live bytes; frag_delta_bytes sums, over
//                           the key's calls, (after - before); worst_call_frag_{before,after}_bytes
//                           are those of the call that raised it most
// A free is charged to the key of the allocation it frees (live_bytes), while reserved growth and
// fragmentation change are charged to the key current at the event.
//
// Invariants: sum(live_bytes) == builder.live_bytes(); peak contributions sum to the peak.
// Thread-safety: OpRow is a value; OpTableBuilder is not thread-safe (callers lock).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

struct OpRow {
  std::string name;
  std::uint64_t calls = 0;
  std::uint64_t allocs = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t live_bytes = 0;
  std::uint64_t peak_contribution_bytes = 0;
  std::uint64_t reserved_growth_bytes = 0;
  std::int64_t frag_delta_bytes = 0;
  std::int64_t worst_call_frag_before_bytes = 0;
  std::int64_t worst_call_frag_after_bytes = 0;
};

// gpumem's additions to PyTorch's snapshot dict (written under the key "gpumem"; PyTorch's tools
// ignore it). version 0 = the snapshot did not come from gpumem.
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
  std::vector<OpRow> ops;                // per-op table, largest allocated_bytes first
};

class OpTableBuilder {
 public:
  // One event; `key` is the op (or site) current at the event, "" for none.
  void add(TraceAction action, std::string_view key, std::uint64_t addr, std::uint64_t size_bytes);
  // Same with an id already interned through intern() (cheaper on hot paths).
  void add_id(TraceAction action, std::uint32_t key_id, std::uint64_t addr, std::uint64_t size_bytes);
  std::uint32_t intern(std::string_view key);

  // Rows by allocated_bytes, largest first (keys with no allocation and no growth left out).
  std::vector<OpRow> rows() const;
  std::uint64_t live_bytes() const noexcept { return live_total_; }
  std::uint64_t peak_live_bytes() const noexcept { return peak_total_; }
  std::uint64_t reserved_bytes() const noexcept { return reserved_; }

 private:
  struct Live {
    std::uint32_t key = 0;
    std::uint64_t size_bytes = 0;
  };
  void end_call();
  void capture_peak();

  std::vector<OpRow> rows_;
  std::vector<std::uint64_t> peak_live_;  // per key, at the peak
  std::unordered_map<std::string, std::uint32_t> index_;
  std::unordered_map<std::uint64_t, Live> live_;
  std::uint64_t live_total_ = 0;
  std::uint64_t peak_total_ = 0;
  bool peak_dirty_ = false;
  std::uint64_t reserved_ = 0;
  std::uint32_t call_key_ = UINT32_MAX;
  std::int64_t call_frag_before_ = 0;
};

}  // namespace gpumem::forensics
