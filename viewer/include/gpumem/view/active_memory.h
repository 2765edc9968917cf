// ActiveMemory: live (allocated) bytes over a trace's time, grouped by call site, function or op:
// the model of the Active view, what PyTorch's memory_viz calls the Active Memory Timeline.
//
// Built once per grouping from a ViewerModel (ViewerModel::active_memory caches it): one pass over
// the trace replays the blocks as MemoryState does (an alloc adds its block, a completed free
// removes it, a free of an unknown address changes nothing) and records, for every entry that
// changes allocated bytes, which group gained or lost how much. Groups are ranked by their own
// peak of live bytes over the trace; the top `top` become slots (biggest first) and the rest merge
// into one "other" slot, so the legend and the colours stay the same at every zoom.
//
// Queries never replay more than a checkpoint interval: slot totals are kept every
// kActiveCheckpointEvery entries, so live_at() costs O(kActiveCheckpointEvery + slots), and
// sample() of C sorted moments costs O(min(entries in between, C * kActiveCheckpointEvery)), not
// O(entries * columns).
//
// Invariants (check_invariants): at every checkpoint the slots sum to the model's allocated bytes
// after that many entries; event deltas of one entry sum to that entry's change of allocated
// bytes; slots are ordered by peak, then name; "other" is last.
// Thread-safety: immutable after build(); share it read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpumem/view/live_groups.h"
#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

inline constexpr std::size_t kActiveTopGroups = 6;
inline constexpr std::size_t kActiveCheckpointEvery = 1024;

struct ActiveSlot {
  std::string name;               // the group's name (live_groups' group_name), or "other"
  std::uint64_t peak_bytes = 0;   // the slot's own peak of live bytes over the trace
  std::size_t group_count = 1;    // groups it stands for (more than 1 only for "other")
  bool other = false;
};

// One sampled moment: each slot's live bytes and their sum.
struct ActiveSample {
  std::size_t applied = 0;
  std::vector<std::uint64_t> slot_bytes;
  std::uint64_t total_bytes = 0;
};

class ActiveMemory {
 public:
  static ActiveMemory build(const ViewerModel& model, GroupBy by, std::size_t top = kActiveTopGroups);

  GroupBy group_by() const noexcept { return by_; }
  const std::vector<ActiveSlot>& slots() const noexcept { return slots_; }
  std::size_t group_count() const noexcept { return group_count_; }  // distinct groups over the trace
  // True when the file records no call site (or op) for any block: every byte is "(not recorded)".
  bool nothing_recorded() const noexcept { return nothing_recorded_; }
  std::size_t entry_count() const noexcept { return entry_count_; }

  // Each slot's live bytes after `applied` entries (0..entry_count()).
  std::vector<std::uint64_t> live_at(std::size_t applied) const;

  // Samples at the moments `applied` (non-decreasing). `events_replayed`, when given, receives
  // how many recorded changes the sampling applied (tests bound it).
  std::vector<ActiveSample> sample(std::span<const std::size_t> applied, std::size_t* events_replayed = nullptr) const;

  bool check_invariants(const ViewerModel& model) const;

 private:
  struct Event {
    std::uint32_t entry = 0;  // index of the entry that made the change
    std::uint32_t slot = 0;
    std::int64_t delta_bytes = 0;
  };
  // Advances `bytes` from cursor `from` to cursor `to` (>= from), replaying from the nearest
  // checkpoint when that is shorter; returns the events applied.
  std::size_t advance(std::vector<std::uint64_t>& bytes, std::size_t from, std::size_t to) const;

  GroupBy by_{};
  std::vector<ActiveSlot> slots_;
  std::size_t group_count_ = 0;
  bool nothing_recorded_ = false;
  std::size_t entry_count_ = 0;
  std::vector<Event> events_;  // in entry order
  // checkpoint_bytes_[c * slots + s]: slot s after c * kActiveCheckpointEvery entries;
  // checkpoint_event_[c]: the first event of an entry at or after that cursor.
  std::vector<std::uint64_t> checkpoint_bytes_;
  std::vector<std::size_t> checkpoint_event_;
};

// ViewerModel::active_memory's cache: one ActiveMemory per grouping, built on first use.
struct ActiveMemoryCache {
  static constexpr int kGroupings = 3;
  std::once_flag once[kGroupings];
  std::optional<ActiveMemory> memory[kGroupings];
};

}  // namespace gpumem::view
