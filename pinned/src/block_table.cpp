#include "block_table.h"

#include <algorithm>
#include <mutex>

namespace gpumem::pinned::detail {

void BlockTable::insert(std::uintptr_t addr, BlockRecord record) {
  Shard& s = shards_[shard_of(addr)];
  std::lock_guard lock(s.lock);
  s.records.insert_or_assign(addr, std::move(record));
}

FreeAction BlockTable::begin_free(std::uintptr_t addr, BlockRecord* record) {
  Shard& s = shards_[shard_of(addr)];
  std::lock_guard lock(s.lock);
  auto it = s.records.find(addr);
  if (it == s.records.end()) return FreeAction::not_found;
  if (it->second.pending_free) return FreeAction::already_pending;
  if (it->second.streams.empty()) {
    *record = std::move(it->second);
    s.records.erase(it);
    return FreeAction::now;
  }
  it->second.pending_free = true;
  *record = it->second;
  return FreeAction::deferred;
}

bool BlockTable::add_stream(std::uintptr_t addr, alloc::StreamId stream, bool* pending) {
  Shard& s = shards_[shard_of(addr)];
  std::lock_guard lock(s.lock);
  *pending = false;
  auto it = s.records.find(addr);
  if (it == s.records.end()) return false;
  if (it->second.pending_free) {
    *pending = true;
    return false;
  }
  auto& streams = it->second.streams;
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  return true;
}

std::optional<BlockRecord> BlockTable::erase(std::uintptr_t addr) {
  Shard& s = shards_[shard_of(addr)];
  std::lock_guard lock(s.lock);
  auto it = s.records.find(addr);
  if (it == s.records.end()) return std::nullopt;
  BlockRecord out = std::move(it->second);
  s.records.erase(it);
  return out;
}

std::optional<std::pair<std::uintptr_t, BlockRecord>> BlockTable::find_containing(std::uintptr_t addr) const {
  {
    const Shard& s = shards_[shard_of(addr)];
    std::lock_guard lock(s.lock);
    if (auto it = s.records.find(addr); it != s.records.end()) return std::pair{addr, it->second};
  }
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.lock);
    for (const auto& [start, rec] : s.records)
      if (addr >= start && addr < start + rec.size_bytes) return std::pair{start, rec};
  }
  return std::nullopt;
}

std::vector<std::pair<std::uintptr_t, BlockRecord>> BlockTable::copy() const {
  std::vector<std::pair<std::uintptr_t, BlockRecord>> out;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.lock);
    out.insert(out.end(), s.records.begin(), s.records.end());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace gpumem::pinned::detail
