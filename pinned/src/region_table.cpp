#include "region_table.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace gpumem::pinned::detail {
namespace {

[[noreturn]] void broken(const char* what, std::uintptr_t addr, std::size_t size) {
  std::fprintf(stderr, "gpumem pinned: region table invariant broken: %s (address %#lx, %zu bytes)\n", what,
               static_cast<unsigned long>(addr), size);
  std::abort();
}

std::uintptr_t align_up(std::uintptr_t v, std::size_t a) { return (v + a - 1) & ~(static_cast<std::uintptr_t>(a) - 1); }

}  // namespace

RegionTable::Regions::iterator RegionTable::find_locked(std::uintptr_t addr) {
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return regions_.end();
  --it;
  return addr < it->second.region.end() ? it : regions_.end();
}

RegionTable::Regions::const_iterator RegionTable::find_locked(std::uintptr_t addr) const {
  return const_cast<RegionTable*>(this)->find_locked(addr);
}

void RegionTable::add_free_locked(Record& rec, std::uintptr_t base, std::size_t size) {
  const bool was_idle = rec.idle();
  rec.free.emplace(base, size);
  by_size_.emplace(size, base);
  rec.free_bytes += size;
  totals_.free_bytes += size;
  if (!was_idle && rec.idle()) {
    totals_.idle_bytes += rec.region.size_bytes;
    ++totals_.idle_regions;
  }
}

void RegionTable::remove_free_locked(Record& rec, std::uintptr_t base) {
  auto it = rec.free.find(base);
  const std::size_t size = it->second;
  if (rec.idle()) {
    totals_.idle_bytes -= rec.region.size_bytes;
    --totals_.idle_regions;
  }
  by_size_.erase({size, base});
  rec.free.erase(it);
  rec.free_bytes -= size;
  totals_.free_bytes -= size;
}

void RegionTable::drop_region_locked(Regions::iterator it) {
  Record& rec = it->second;
  while (!rec.free.empty()) remove_free_locked(rec, rec.free.begin()->first);
  totals_.reserved_bytes -= rec.region.size_bytes;
  if (rec.region.locked) totals_.locked_bytes -= rec.region.size_bytes;
  --totals_.regions;
  regions_.erase(it);
}

std::uintptr_t RegionTable::take_free(alloc::PoolKind pool, std::size_t size_bytes, std::size_t alignment_bytes,
                                      std::size_t max_idle_split_bytes) {
  std::lock_guard lock(mutex_);
  const std::size_t align = alignment_bytes == 0 ? 1 : alignment_bytes;
  for (auto it = by_size_.lower_bound({size_bytes, 0}); it != by_size_.end(); ++it) {
    const auto [range_size, range_base] = *it;
    const std::uintptr_t at = align_up(range_base, align);
    if (at + size_bytes > range_base + range_size) continue;  // the alignment does not fit here
    Record& rec = find_locked(range_base)->second;
    if (rec.pool != pool || (rec.idle() && range_size > max_idle_split_bytes)) continue;
    remove_free_locked(rec, range_base);
    if (at > range_base) add_free_locked(rec, range_base, at - range_base);
    const std::uintptr_t end = range_base + range_size;
    if (at + size_bytes < end) add_free_locked(rec, at + size_bytes, end - (at + size_bytes));
    return at;
  }
  return 0;
}

void RegionTable::insert(const HostRegion& region, alloc::PoolKind pool, std::uint64_t created_seq) {
  std::lock_guard lock(mutex_);
  auto next = regions_.lower_bound(region.base);
  if ((next != regions_.end() && next->first < region.end()) || find_locked(region.base) != regions_.end())
    broken("a new region overlaps a live one", region.base, region.size_bytes);
  regions_.emplace(region.base, Record{region, pool, created_seq, {}, 0});
  totals_.reserved_bytes += region.size_bytes;
  if (region.locked) totals_.locked_bytes += region.size_bytes;
  ++totals_.regions;
}

void RegionTable::give_back(std::uintptr_t addr, std::size_t size_bytes) {
  std::lock_guard lock(mutex_);
  auto it = find_locked(addr);
  if (it == regions_.end() || size_bytes == 0 || addr + size_bytes > it->second.region.end())
    broken("a range was given back outside every region", addr, size_bytes);
  Record& rec = it->second;
  std::uintptr_t base = addr;
  std::size_t size = size_bytes;
  auto next = rec.free.lower_bound(addr);
  if (next != rec.free.end() && next->first < addr + size_bytes) broken("a range was given back twice", addr, size_bytes);
  if (next != rec.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > addr) broken("a range was given back twice", addr, size_bytes);
    if (prev->first + prev->second == addr) {
      base = prev->first;
      size += prev->second;
      remove_free_locked(rec, prev->first);
    }
  }
  next = rec.free.lower_bound(addr);
  if (next != rec.free.end() && next->first == addr + size_bytes) {
    size += next->second;
    remove_free_locked(rec, next->first);
  }
  add_free_locked(rec, base, size);
}

std::vector<PooledRegion> RegionTable::release_idle(std::size_t below_bytes) {
  std::lock_guard lock(mutex_);
  std::vector<PooledRegion> out;
  if (totals_.idle_regions == 0) return out;
  for (auto it = regions_.begin(); it != regions_.end();) {
    auto cur = it++;
    if (cur->second.idle() && cur->second.region.size_bytes < below_bytes) {
      out.push_back({cur->second.region, cur->second.pool});
      drop_region_locked(cur);
    }
  }
  return out;
}

std::vector<PooledRegion> RegionTable::take_all() {
  std::lock_guard lock(mutex_);
  std::vector<PooledRegion> out;
  out.reserve(regions_.size());
  for (const auto& [base, rec] : regions_) out.push_back({rec.region, rec.pool});
  regions_.clear();
  by_size_.clear();
  totals_ = {};
  return out;
}

bool RegionTable::same_region(std::uintptr_t a, std::uintptr_t b) const {
  std::lock_guard lock(mutex_);
  auto it = find_locked(a);
  return it != regions_.end() && b >= it->second.region.base && b < it->second.region.end();
}

std::optional<HostRegion> RegionTable::region_of(std::uintptr_t addr) const {
  std::lock_guard lock(mutex_);
  auto it = find_locked(addr);
  if (it == regions_.end()) return std::nullopt;
  return it->second.region;
}

RegionTotals RegionTable::totals() const {
  std::lock_guard lock(mutex_);
  return totals_;
}

std::vector<RegionCopy> RegionTable::copy() const {
  std::lock_guard lock(mutex_);
  std::vector<RegionCopy> out;
  out.reserve(regions_.size());
  for (const auto& [base, rec] : regions_)
    out.push_back(RegionCopy{rec.region, rec.pool, rec.created_seq, {rec.free.begin(), rec.free.end()}});
  return out;
}

void RegionTable::check_invariants() const {
  std::lock_guard lock(mutex_);
  RegionTotals sum;
  std::size_t ranges = 0;
  std::uintptr_t prev_end = 0;
  for (const auto& [base, rec] : regions_) {
    const HostRegion& r = rec.region;
    if (base != r.base || r.size_bytes == 0) broken("a region is keyed wrongly or empty", r.base, r.size_bytes);
    if (r.base < prev_end) broken("regions overlap", r.base, r.size_bytes);
    prev_end = r.end();
    std::size_t free = 0;
    std::uintptr_t free_end = 0;
    for (const auto& [fb, fs] : rec.free) {
      if (fs == 0 || fb < r.base || fb + fs > r.end()) broken("a free range lies outside its region", fb, fs);
      if (free_end != 0 && fb <= free_end) broken("free ranges overlap or are not coalesced", fb, fs);
      if (by_size_.count({fs, fb}) != 1) broken("a free range is missing from the size index", fb, fs);
      free_end = fb + fs;
      free += fs;
      ++ranges;
    }
    if (free != rec.free_bytes) broken("a region's free bytes disagree with its ranges", r.base, free);
    sum.reserved_bytes += r.size_bytes;
    if (r.locked) sum.locked_bytes += r.size_bytes;
    sum.free_bytes += free;
    if (rec.idle()) {
      sum.idle_bytes += r.size_bytes;
      ++sum.idle_regions;
    }
    ++sum.regions;
  }
  if (ranges != by_size_.size()) broken("the size index holds ranges that are not free", 0, by_size_.size());
  if (sum.reserved_bytes != totals_.reserved_bytes || sum.locked_bytes != totals_.locked_bytes ||
      sum.free_bytes != totals_.free_bytes || sum.idle_bytes != totals_.idle_bytes ||
      sum.regions != totals_.regions || sum.idle_regions != totals_.idle_regions)
    broken("the table's totals disagree with its regions", 0, sum.reserved_bytes);
}

}  // namespace gpumem::pinned::detail
