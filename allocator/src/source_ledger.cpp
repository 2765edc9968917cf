#include "source_ledger.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace gpumem::alloc::detail {

std::string SourceLedger::check_size(const char* op, std::size_t size_bytes) const {
  if (size_bytes == 0 || size_bytes % granularity_bytes_ != 0)
    return fmt::format("{}: size {} is not a positive multiple of the granularity ({} bytes); "
                       "round it up to a multiple of caps().granularity_bytes",
                       op, size_bytes, granularity_bytes_);
  return {};
}

std::string SourceLedger::check_release(VaRange range) const {
  auto it = ranges_.find(range.base);
  if (it == ranges_.end() || it->second != range.size_bytes)
    return fmt::format("release: [{:#x}, +{}) is not a range reserve() returned here", range.base,
                       range.size_bytes);
  auto m = mappings_.lower_bound(range.base);
  if (m != mappings_.end() && m->first < range.end())
    return fmt::format("release: a piece is still mapped at {:#x} inside [{:#x}, +{}); unmap it first",
                       m->first, range.base, range.size_bytes);
  return {};
}

std::string SourceLedger::check_destroy(PhysHandle handle) const {
  auto it = pieces_.find(handle);
  if (it == pieces_.end()) return fmt::format("destroy: unknown handle {:#x}", handle);
  if (it->second.mappings != 0)
    return fmt::format("destroy: handle {:#x} is still mapped ({} mapping{}); unmap it first", handle,
                       it->second.mappings, it->second.mappings == 1 ? "" : "s");
  return {};
}

std::string SourceLedger::check_map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) const {
  auto piece = pieces_.find(handle);
  if (piece == pieces_.end()) return fmt::format("map: unknown handle {:#x}", handle);
  if (piece->second.size_bytes != size_bytes)
    return fmt::format("map: size {} differs from the size of piece {:#x} ({}); map maps whole pieces",
                       size_bytes, handle, piece->second.size_bytes);
  if (va % granularity_bytes_ != 0)
    return fmt::format("map: address {:#x} is not a multiple of the granularity ({} bytes)", va,
                       granularity_bytes_);
  auto r = ranges_.upper_bound(va);
  if (r == ranges_.begin() || (--r, va + size_bytes > r->first + r->second || va + size_bytes < va))
    return fmt::format("map: [{:#x}, +{}) does not lie inside one reserved range", va, size_bytes);
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + size_bytes)
    return fmt::format("map: [{:#x}, +{}) overlaps the mapping at {:#x}", va, size_bytes, next->first);
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + pieces_.at(prev->second).size_bytes > va)
      return fmt::format("map: [{:#x}, +{}) overlaps the mapping at {:#x}", va, size_bytes, prev->first);
  }
  return {};
}

std::string SourceLedger::check_unmap(std::uintptr_t va, std::size_t size_bytes) const {
  auto it = mappings_.find(va);
  if (it == mappings_.end())
    return fmt::format("unmap: nothing is mapped at {:#x} (unmap takes exactly what one map() mapped)", va);
  const std::size_t mapped = pieces_.at(it->second).size_bytes;
  if (mapped != size_bytes)
    return fmt::format("unmap: size {} differs from the mapping at {:#x} ({} bytes)", size_bytes, va, mapped);
  return {};
}

void SourceLedger::add_range(VaRange range) { ranges_.emplace(range.base, range.size_bytes); }

void SourceLedger::remove_range(VaRange range) { ranges_.erase(range.base); }

void SourceLedger::add_piece(PhysHandle handle, std::size_t size_bytes, std::uint64_t native) {
  pieces_.emplace(handle, Piece{size_bytes, native, 0});
  physical_bytes_ += size_bytes;
}

void SourceLedger::remove_piece(PhysHandle handle) {
  auto it = pieces_.find(handle);
  physical_bytes_ -= it->second.size_bytes;
  pieces_.erase(it);
}

void SourceLedger::add_mapping(std::uintptr_t va, PhysHandle handle) {
  Piece& p = pieces_.at(handle);
  ++p.mappings;
  mappings_.emplace(va, handle);
  mapped_bytes_ += p.size_bytes;
}

PhysHandle SourceLedger::remove_mapping(std::uintptr_t va) {
  auto it = mappings_.find(va);
  const PhysHandle handle = it->second;
  Piece& p = pieces_.at(handle);
  --p.mappings;
  mapped_bytes_ -= p.size_bytes;
  mappings_.erase(it);
  return handle;
}

void SourceLedger::check_invariants() const {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "gpumem: SourceLedger invariant broken: %s\n", what.c_str());
    std::abort();
  };
  std::size_t physical = 0, mapped = 0;
  std::unordered_map<PhysHandle, std::uint32_t> counted;  // mappings per handle
  for (const auto& [va, handle] : mappings_) ++counted[handle];
  for (const auto& [handle, piece] : pieces_) {
    physical += piece.size_bytes;
    auto c = counted.find(handle);
    const std::uint32_t n = c == counted.end() ? 0 : c->second;
    if (n != piece.mappings)
      fail(fmt::format("piece {:#x} says it has {} mappings, the mappings name it {} times", handle, piece.mappings, n));
    mapped += piece.size_bytes * n;
  }
  if (physical != physical_bytes_) fail(fmt::format("physical_bytes {} != sum {}", physical_bytes_, physical));
  if (mapped != mapped_bytes_) fail(fmt::format("mapped_bytes {} != sum {}", mapped_bytes_, mapped));
  std::uintptr_t prev_end = 0;
  for (const auto& [va, handle] : mappings_) {
    auto p = pieces_.find(handle);
    if (p == pieces_.end())
      fail(fmt::format("mapping at {:#x} names handle {:#x}, which is not a piece", va, handle));
    if (va < prev_end) fail(fmt::format("mapping at {:#x} overlaps its predecessor", va));
    prev_end = va + p->second.size_bytes;
    auto r = ranges_.upper_bound(va);
    if (r == ranges_.begin() || (--r, prev_end > r->first + r->second))
      fail(fmt::format("mapping at {:#x} is not inside a reserved range", va));
  }
}

}  // namespace gpumem::alloc::detail
