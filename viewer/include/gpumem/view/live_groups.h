// LiveGroup: the live allocations at a cursor, grouped by call site (the trace's `where`,
// file:line:function), by function alone, or by op (gpumem snapshots record it), sorted by bytes or by count, filtered by a search
// string (case-insensitive substring of the group's name).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpumem/view/memory_state.h"
#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

enum class GroupBy : std::uint8_t { call_site, function, op };
const char* group_by_name(GroupBy by) noexcept;
enum class SortBy : std::uint8_t { bytes, count };

struct LiveGroup {
  std::string name;
  std::size_t count = 0;
  std::uint64_t bytes = 0;
};

// The name a block is grouped under.
std::string group_name(const ViewerModel& model, const BlockInfo& block, GroupBy by);

std::vector<LiveGroup> live_groups(const ViewerModel& model, const MemoryState& state, GroupBy by, SortBy sort,
                                   std::string_view filter);

bool contains_ignore_case(std::string_view haystack, std::string_view needle) noexcept;

// One row of a diff: a group's bytes and count on each side.
struct GroupDiff {
  std::string name;
  std::uint64_t bytes_a = 0, bytes_b = 0;
  std::size_t count_a = 0, count_b = 0;
  std::int64_t delta_bytes() const noexcept {
    return static_cast<std::int64_t>(bytes_b) - static_cast<std::int64_t>(bytes_a);
  }
};

// Groups of two states (possibly of two models), by largest |delta bytes| first.
std::vector<GroupDiff> diff_groups(const ViewerModel& model_a, const MemoryState& a, const ViewerModel& model_b,
                                   const MemoryState& b, GroupBy by);

}  // namespace gpumem::view
