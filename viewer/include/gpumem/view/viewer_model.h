// ViewerModel: everything the viewer shows about one file, computed once when it opens: the
// trace, allocated and reserved bytes after every entry, the peaks and the OOM, and checkpoints
// of the MemoryState every kCheckpointEvery entries so that the state at any cursor is one
// checkpoint copy plus fewer than kCheckpointEvery entries replayed, never a replay from the start.
//
// The cursor is the number of entries applied, 0..entry_count(). A snapshot's final segments
// (when the file is a snapshot) set the state before the trace's first entry: the trace is undone
// from the snapshot's blocks, so allocations made before a truncated trace began still show.
//
// Thread-safety: immutable after construction (the OOM report arrives through a future); share it
// read-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/moment.h"
#include "gpumem/forensics/snapshot.h"
#include "gpumem/forensics/trace.h"
#include "gpumem/view/memory_state.h"

namespace gpumem::view {

inline constexpr std::size_t kCheckpointEvery = 8192;
inline constexpr std::size_t kPeakBlock = 1024;

enum class GroupBy : std::uint8_t;  // live_groups.h
class ActiveMemory;                 // active_memory.h
struct ActiveMemoryCache;           // active_memory.h

// PyTorch's own numbers at the end of a snapshot, read from its segments (exact block sizes).
struct SnapshotTotals {
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t largest_inactive_bytes = 0;  // largest inactive block
  std::size_t segment_count = 0;
  std::size_t block_count = 0;
};

class ViewerModel {
 public:
  // Opens a snapshot (PyTorch's pickle, gpumem's pickle or JSON; optionally gzip-compressed) or a
  // CSV trace (.csv, .csv.gz). Throws forensics::ForensicsError naming the file and the problem.
  // When the file records an OOM, the forensics OOM report (verdict, evidence, advice) is computed
  // on a background thread, so a large file opens without waiting for it: oom_report() is empty
  // and oom_report_pending() true until it is done.
  static ViewerModel open(const std::string& path, std::optional<int> device = std::nullopt);
  // From data already in memory (tests, benchmarks); `snapshot` may be empty; `device` picks the
  // snapshot segments that go with the trace. No OOM report is computed.
  static ViewerModel from(forensics::Trace trace, std::optional<forensics::Snapshot> snapshot = std::nullopt,
                          int device = 0);

  const std::string& source() const noexcept { return trace_.source; }
  const forensics::Trace& trace() const noexcept { return trace_; }
  std::size_t entry_count() const noexcept { return trace_.entries.size(); }
  const std::string& site(std::uint32_t index) const { return trace_.sites.at(index); }

  // Allocated / reserved bytes after `applied` entries (0..entry_count()).
  std::uint64_t allocated_at(std::size_t applied) const { return allocated_[applied]; }
  std::uint64_t reserved_at(std::size_t applied) const { return reserved_[applied]; }
  std::int64_t time_us_at(std::size_t applied) const;  // time of the last applied entry
  // Time of entry `entry` since the first entry, made non-decreasing (a later entry stamped
  // earlier takes its predecessor's time), so that time buckets are contiguous runs of entries.
  std::int64_t elapsed_us_of(std::size_t entry) const { return elapsed_us_[entry]; }
  // The cursor's time since the first entry: that of its last applied entry (0 for cursor 0).
  std::int64_t cursor_elapsed_us(std::size_t applied) const {
    return applied == 0 || elapsed_us_.empty() ? 0 : elapsed_us_[std::min(applied, entry_count()) - 1];
  }
  // The number of entries before time t (since the first entry): the cursor at the end of a time
  // bucket that ends at t. O(log entries).
  std::size_t applied_before_us(std::int64_t elapsed_us) const;
  // Time from the first entry to the last, plus one microsecond (at least 1): every entry's
  // elapsed time lies in [0, span).
  std::int64_t span_us() const noexcept { return elapsed_us_.empty() ? 1 : elapsed_us_.back() + 1; }

  // The first cursor in [lo, hi] (lo <= hi <= entry_count()) where allocated bytes are highest.
  // O(kPeakBlock + (hi - lo) / kPeakBlock): per-block maxima are kept.
  std::size_t peak_allocated_cursor_in(std::size_t lo, std::size_t hi) const;

  std::size_t peak_reserved_cursor() const noexcept { return peak_reserved_; }
  std::size_t peak_allocated_cursor() const noexcept { return peak_allocated_; }
  // The cursor just after the last oom entry, if the trace has one.
  std::optional<std::size_t> oom_cursor() const noexcept { return oom_; }
  // Where the viewer opens: the OOM if there is one, else the end.
  std::size_t initial_cursor() const noexcept { return oom_.value_or(entry_count()); }
  // The cursor of a moment (`gpumem view --at`), as the viewer's keys find it: oom as `o` (just
  // after the oom entry), peak as `p`, alloc-peak as `a`, entry:N as N, time:T after the last
  // entry at most T after the first; automatic is initial_cursor(). Throws ForensicsError naming
  // the file and the fix when the trace has no such moment.
  std::size_t cursor_at(const forensics::MomentSpec& spec) const;

  MemoryState state_at(std::size_t applied) const;

  bool is_snapshot() const noexcept { return snapshot_totals_.has_value(); }
  const std::optional<SnapshotTotals>& snapshot_totals() const noexcept { return snapshot_totals_; }
  // device_free of the oom entry (snapshots only), bytes free on the device when it failed.
  std::optional<std::uint64_t> oom_device_free_bytes() const noexcept { return oom_device_free_; }
  bool expandable() const noexcept { return expandable_; }

  // The forensics OOM analysis at the OOM moment, once computed (empty while pending, for files
  // without an OOM, for models built with from(), or if the report failed: see report_notes()).
  const std::optional<forensics::OomAnalysis>& oom_report() const;
  const std::vector<std::string>& report_notes() const;
  bool oom_report_pending() const;
  void wait_for_oom_report() const;

  // Op names (gpumem snapshots record the op of each allocation); op 0 is "" (unknown).
  bool has_ops() const noexcept { return op_names_.size() > 1; }
  const std::string& op_name(std::uint32_t op) const { return op_names_.at(op); }

  // The private pool (a CUDA graph's or a MemPool's segment_pool_id) whose memory holds addr, or
  // nullopt for the default pool. Known from the snapshot's segments at its end: memory a pool
  // held only earlier in the trace shows as the default pool's.
  std::optional<std::pair<std::int64_t, std::int64_t>> pool_of(std::uint64_t addr) const;

  // Real block size of an alloc entry where a snapshot knows it (0: round the request), and the
  // op it ran under (0: not recorded): what MemoryState::apply takes for entry `entry`.
  std::uint64_t entry_block_bytes(std::size_t entry) const noexcept { return block_bytes_of(entry); }
  std::uint32_t entry_op(std::size_t entry) const noexcept { return op_of(entry); }

  // Live bytes over time grouped `by` (the Active view's model), built on first use and kept
  // (thread-safe: built once per grouping). Defined in active_memory.cpp.
  const ActiveMemory& active_memory(GroupBy by) const;

  // A second file to diff against (gpumem view A --diff B).
  std::shared_ptr<const ViewerModel> compare;

  struct OomReport {
    std::optional<forensics::OomAnalysis> analysis;
    std::vector<std::string> notes;
  };

 private:
  static ViewerModel build(forensics::Trace trace, const forensics::Snapshot* snapshot, int device,
                           std::vector<std::string> op_names, std::vector<std::uint32_t> entry_ops);

  forensics::Trace trace_;
  std::vector<std::uint64_t> allocated_;  // entry_count() + 1 values
  std::vector<std::uint64_t> reserved_;
  std::vector<std::int64_t> elapsed_us_;  // entry_count() values, non-decreasing
  // block_peak_[b]: the first cursor of [b * kPeakBlock, (b + 1) * kPeakBlock) with the most allocated.
  std::vector<std::size_t> block_peak_;
  std::shared_ptr<ActiveMemoryCache> active_cache_;  // shared by copies (the data is immutable)
  // checkpoints_[i]: the state after i * kCheckpointEvery entries.
  std::vector<MemoryState> checkpoints_;
  // Real block sizes of alloc entries, by entry: where a snapshot knows them, or (a CSV trace) from
  // segments rebuilt forward from the trace (forensics::rebuilt_block_bytes); 0 = unknown.
  std::vector<std::uint64_t> block_bytes_;
  std::uint64_t block_bytes_of(std::size_t entry) const noexcept {
    return entry < block_bytes_.size() ? block_bytes_[entry] : 0;
  }
  std::vector<std::string> op_names_{""};
  std::vector<std::uint32_t> entry_ops_;  // op of each entry, empty when the file has none
  std::uint32_t op_of(std::size_t entry) const noexcept { return entry < entry_ops_.size() ? entry_ops_[entry] : 0; }
  std::shared_future<OomReport> oom_report_;  // invalid when no report is computed
  std::size_t peak_reserved_ = 0;
  std::size_t peak_allocated_ = 0;
  std::optional<std::size_t> oom_;
  std::optional<std::uint64_t> oom_device_free_;
  std::optional<SnapshotTotals> snapshot_totals_;
  bool expandable_ = false;
  struct PoolRange {
    std::uint64_t lo = 0, hi = 0;
    std::pair<std::int64_t, std::int64_t> pool_id;
  };
  std::vector<PoolRange> pool_ranges_;  // private pools' segments in the snapshot, by address
};

}  // namespace gpumem::view
