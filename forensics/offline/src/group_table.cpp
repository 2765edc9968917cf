#include "gpumem/forensics/group_table.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "gpumem/forensics/vocabulary.h"

namespace gpumem::forensics {
namespace {

std::string key_of(const SnapshotTraceEntry& e, GroupBy by) {
  return by == GroupBy::op ? e.op : call_site(e.frames);
}

// Reserved address ranges by the row of the request that reserved them: [start, end) -> row.
class Reservations {
 public:
  void add(std::uint64_t addr, std::uint64_t size, std::size_t row) {
    remove(addr, size);
    ranges_[addr] = Range{addr + size, row};
  }
  void remove(std::uint64_t addr, std::uint64_t size) {
    const std::uint64_t end = addr + size;
    auto it = ranges_.upper_bound(addr);
    if (it != ranges_.begin()) --it;
    while (it != ranges_.end() && it->first < end) {
      const std::uint64_t lo = it->first, hi = it->second.end;
      const std::size_t row = it->second.row;
      if (hi <= addr) {
        ++it;
        continue;
      }
      it = ranges_.erase(it);
      if (lo < addr) ranges_[lo] = Range{addr, row};
      if (hi > end) {
        ranges_[end] = Range{hi, row};
        break;
      }
    }
  }
  // Calls f(row, bytes) for the parts of [addr, addr + size), row SIZE_MAX where no range covers.
  template <class F>
  void split(std::uint64_t addr, std::uint64_t size, F&& f) const {
    const std::uint64_t end = addr + size;
    std::uint64_t at = addr;
    auto it = ranges_.upper_bound(addr);
    if (it != ranges_.begin()) --it;
    for (; it != ranges_.end() && it->first < end && at < end; ++it) {
      if (it->second.end <= at) continue;
      if (it->first > at) {
        f(SIZE_MAX, it->first - at);
        at = it->first;
      }
      const std::uint64_t stop = std::min(end, it->second.end);
      f(it->second.row, stop - at);
      at = stop;
    }
    if (at < end) f(SIZE_MAX, end - at);
  }

 private:
  struct Range {
    std::uint64_t end;
    std::size_t row;
  };
  std::map<std::uint64_t, Range> ranges_;
};

}  // namespace

std::vector<GroupRow> group_table(const std::vector<SnapshotSegment>& segments,
                                  const std::vector<SnapshotTraceEntry>& trace, std::size_t applied, GroupBy by) {
  std::vector<GroupRow> rows;
  std::unordered_map<std::string, std::size_t> index;
  auto row_of = [&](const std::string& name) -> std::size_t {
    const std::string key = name.empty() ? std::string(kNotRecorded) : name;
    auto [it, added] = index.emplace(key, rows.size());
    if (added) rows.push_back(GroupRow{key});
    return it->second;
  };

  applied = std::min(applied, trace.size());
  std::unordered_map<std::uint64_t, const SnapshotTraceEntry*> last_alloc;
  Reservations reserved;
  for (std::size_t i = 0; i < applied; ++i) {
    const auto& e = trace[i];
    switch (e.action) {
      case TraceAction::alloc: {
        last_alloc[e.addr] = &e;
        GroupRow& r = rows[row_of(key_of(e, by))];
        ++r.trace_allocs;
        r.trace_alloc_bytes += e.size_bytes;
        break;
      }
      case TraceAction::segment_alloc:
      case TraceAction::segment_map: {
        const std::size_t r = row_of(key_of(e, by));
        rows[r].reserved_growth_bytes += e.size_bytes;
        reserved.add(e.addr, e.size_bytes, r);
        break;
      }
      case TraceAction::segment_free:
      case TraceAction::segment_unmap: reserved.remove(e.addr, e.size_bytes); break;
      default: break;
    }
  }

  std::size_t before_trace = SIZE_MAX;
  for (const auto& seg : segments) {
    for (const auto& b : seg.blocks) {
      if (b.state == "active_allocated") {
        std::string name = by == GroupBy::op ? b.op : call_site(b.frames);
        if (name.empty()) {
          if (auto it = last_alloc.find(b.address); it != last_alloc.end()) name = key_of(*it->second, by);
        }
        GroupRow& r = rows[row_of(name)];
        r.live_bytes += b.size_bytes;
        ++r.live_blocks;
        continue;
      }
      // Inactive or pending free: reserved-unallocated, charged to whoever reserved it.
      reserved.split(b.address, b.size_bytes, [&](std::size_t row, std::uint64_t bytes) {
        if (row == SIZE_MAX) {
          if (before_trace == SIZE_MAX) before_trace = row_of(std::string(kBeforeTrace));
          row = before_trace;
        }
        rows[row].reserved_unallocated_bytes += bytes;
      });
    }
  }
  std::erase_if(rows, [](const GroupRow& r) {
    return r.live_bytes == 0 && r.trace_allocs == 0 && r.reserved_growth_bytes == 0 && r.reserved_unallocated_bytes == 0;
  });
  std::sort(rows.begin(), rows.end(), [](const GroupRow& a, const GroupRow& b) {
    if (a.live_bytes != b.live_bytes) return a.live_bytes > b.live_bytes;
    if (a.reserved_unallocated_bytes != b.reserved_unallocated_bytes)
      return a.reserved_unallocated_bytes > b.reserved_unallocated_bytes;
    if (a.trace_alloc_bytes != b.trace_alloc_bytes) return a.trace_alloc_bytes > b.trace_alloc_bytes;
    return a.name < b.name;
  });
  return rows;
}

}  // namespace gpumem::forensics
