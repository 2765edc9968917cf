#include "gpumem/view/live_groups.h"

#include <algorithm>
#include <cctype>
#include <unordered_map>

#include "gpumem/forensics/vocabulary.h"

namespace gpumem::view {

const char* group_by_name(GroupBy by) noexcept {
  switch (by) {
    case GroupBy::call_site: return "call site";
    case GroupBy::function: return "function";
    case GroupBy::op: return "op";
  }
  return "?";
}

std::string group_name(const ViewerModel& model, const BlockInfo& block, GroupBy by) {
  if (by == GroupBy::op) return block.op == 0 ? std::string(forensics::kNotRecorded) : model.op_name(block.op);
  const std::string& s = model.site(block.site);
  if (s.empty()) return std::string(forensics::kNotRecorded);
  if (by == GroupBy::function) {
    const auto colon = s.find_last_of(':');
    return colon == std::string::npos ? s : s.substr(colon + 1);
  }
  return s;
}

bool contains_ignore_case(std::string_view haystack, std::string_view needle) noexcept {
  if (needle.empty()) return true;
  auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
  });
  return it != haystack.end();
}

namespace {

std::unordered_map<std::string, LiveGroup> collect(const ViewerModel& model, const MemoryState& state, GroupBy by) {
  // Group by site or op index first (cheap), then by name (functions merge several sites).
  std::unordered_map<std::uint32_t, std::pair<LiveGroup, const BlockInfo*>> by_key;
  for (const auto& [addr, b] : state.blocks) {
    auto& [g, example] = by_key[by == GroupBy::op ? b.op : b.site];
    ++g.count;
    g.bytes += b.size_bytes;
    example = &b;
  }
  std::unordered_map<std::string, LiveGroup> out;
  for (auto& [key, entry] : by_key) {
    const auto& [g, example] = entry;
    std::string name = group_name(model, *example, by);
    auto& o = out[name];
    o.name = name;
    o.count += g.count;
    o.bytes += g.bytes;
  }
  return out;
}

}  // namespace

std::vector<LiveGroup> live_groups(const ViewerModel& model, const MemoryState& state, GroupBy by, SortBy sort,
                                   std::string_view filter) {
  std::vector<LiveGroup> groups;
  for (auto& [name, g] : collect(model, state, by)) {
    if (contains_ignore_case(name, filter)) groups.push_back(std::move(g));
  }
  std::sort(groups.begin(), groups.end(), [sort](const LiveGroup& a, const LiveGroup& b) {
    if (sort == SortBy::bytes && a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.count != b.count) return a.count > b.count;
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    return a.name < b.name;
  });
  return groups;
}

std::vector<GroupDiff> diff_groups(const ViewerModel& model_a, const MemoryState& a, const ViewerModel& model_b,
                                   const MemoryState& b, GroupBy by) {
  std::unordered_map<std::string, GroupDiff> rows;
  for (auto& [name, g] : collect(model_a, a, by)) {
    auto& r = rows[name];
    r.name = name;
    r.bytes_a = g.bytes;
    r.count_a = g.count;
  }
  for (auto& [name, g] : collect(model_b, b, by)) {
    auto& r = rows[name];
    r.name = name;
    r.bytes_b = g.bytes;
    r.count_b = g.count;
  }
  std::vector<GroupDiff> out;
  for (auto& [name, r] : rows) {
    if (r.bytes_a != r.bytes_b || r.count_a != r.count_b) out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const GroupDiff& x, const GroupDiff& y) {
    const auto dx = std::llabs(x.delta_bytes());
    const auto dy = std::llabs(y.delta_bytes());
    if (dx != dy) return dx > dy;
    return x.name < y.name;
  });
  return out;
}

}  // namespace gpumem::view
