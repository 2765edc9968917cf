#include "region_table.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>

namespace gpumem::pinned::detail {
namespace {

[[noreturn]] void broken(const char* what, std::uintptr_t addr, std::size_t size) {
  std::fprintf(stderr, "gpumem pinned: region table invariant broken: %s (address %#lx, %zu bytes)\n", what,
               static_cast<unsigned long>(addr), size);
  std::abort();
}

std::uintptr_t align_up(std::uintptr_t v, std::size_t a) { return (v + a - 1) & ~(static_cast<std::uintptr_t>(a) - 1); }

}  // namespace

std::map<std::uintptr_t, RegionTable::Record>::const_iterator RegionTable::find_locked(std::uintptr_t addr) const {
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return regions_.end();
  --it;
  return addr < it->second.region.end() ? it : regions_.end();
}

std::uintptr_t RegionTable::take_returned(std::size_t size_bytes, std::size_t alignment_bytes) {
  std::lock_guard lock(mutex_);
  if (totals_.returned_bytes < size_bytes) return 0;
  const std::size_t align = alignment_bytes == 0 ? 1 : alignment_bytes;
  Record* best_rec = nullptr;
  std::uintptr_t best_base = 0;
  std::size_t best_size = std::numeric_limits<std::size_t>::max();
  for (auto& [base, rec] : regions_) {
    for (const auto& [r_base, r_size] : rec.returned) {
      const std::uintptr_t at = align_up(r_base, align);
      if (at + size_bytes <= r_base + r_size && r_size < best_size) {
        best_rec = &rec;
        best_base = r_base;
        best_size = r_size;
      }
    }
  }
  if (best_rec == nullptr) return 0;
  const std::uintptr_t at = align_up(best_base, align);
  const std::uintptr_t range_end = best_base + best_size;
  best_rec->returned.erase(best_base);
  if (at > best_base) best_rec->returned.emplace(best_base, at - best_base);
  if (at + size_bytes < range_end) best_rec->returned.emplace(at + size_bytes, range_end - (at + size_bytes));
  best_rec->returned_bytes -= size_bytes;
  totals_.returned_bytes -= size_bytes;
  return at;
}

void RegionTable::insert(const HostRegion& region, std::uint64_t created_seq) {
  std::lock_guard lock(mutex_);
  if (find_locked(region.base) != regions_.end() || find_locked(region.end() - 1) != regions_.end())
    broken("a new region overlaps a live one", region.base, region.size_bytes);
  auto next = regions_.lower_bound(region.base);
  if (next != regions_.end() && next->first < region.end())
    broken("a new region overlaps a live one", region.base, region.size_bytes);
  regions_.emplace(region.base, Record{region, created_seq, {}, 0});
  totals_.reserved_bytes += region.size_bytes;
  if (region.locked) totals_.locked_bytes += region.size_bytes;
  ++totals_.regions;
}

std::optional<HostRegion> RegionTable::give_back(std::uintptr_t addr, std::size_t size_bytes) {
  std::lock_guard lock(mutex_);
  auto cit = find_locked(addr);
  if (cit == regions_.end() || addr + size_bytes > cit->second.region.end())
    broken("jemalloc gave back a range outside every region", addr, size_bytes);
  auto it = regions_.find(cit->first);
  Record& rec = it->second;
  auto& ret = rec.returned;
  // Coalesce with the returned ranges on either side; overlap means jemalloc gave a range back twice.
  std::uintptr_t base = addr;
  std::size_t size = size_bytes;
  auto next = ret.lower_bound(addr);
  if (next != ret.end() && next->first < addr + size_bytes) broken("a range was given back twice", addr, size_bytes);
  if (next != ret.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > addr) broken("a range was given back twice", addr, size_bytes);
    if (prev->first + prev->second == addr) {
      base = prev->first;
      size += prev->second;
      ret.erase(prev);
    }
  }
  if (next != ret.end() && next->first == addr + size_bytes) {
    size += next->second;
    ret.erase(next);
  }
  ret.emplace(base, size);
  rec.returned_bytes += size_bytes;
  totals_.returned_bytes += size_bytes;
  if (rec.returned_bytes < rec.region.size_bytes) return std::nullopt;
  const HostRegion whole = rec.region;
  totals_.returned_bytes -= rec.returned_bytes;
  totals_.reserved_bytes -= whole.size_bytes;
  if (whole.locked) totals_.locked_bytes -= whole.size_bytes;
  --totals_.regions;
  regions_.erase(it);
  return whole;
}

std::vector<HostRegion> RegionTable::take_all() {
  std::lock_guard lock(mutex_);
  std::vector<HostRegion> out;
  out.reserve(regions_.size());
  for (const auto& [base, rec] : regions_) out.push_back(rec.region);
  regions_.clear();
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
    out.push_back(RegionCopy{rec.region, rec.created_seq, {rec.returned.begin(), rec.returned.end()}});
  return out;
}

void RegionTable::check_invariants() const {
  std::lock_guard lock(mutex_);
  RegionTotals sum;
  std::uintptr_t prev_end = 0;
  for (const auto& [base, rec] : regions_) {
    const HostRegion& r = rec.region;
    if (base != r.base || r.size_bytes == 0) broken("a region is keyed wrongly or empty", r.base, r.size_bytes);
    if (r.base < prev_end) broken("regions overlap", r.base, r.size_bytes);
    prev_end = r.end();
    std::size_t returned = 0;
    std::uintptr_t ret_end = 0;
    for (const auto& [rb, rs] : rec.returned) {
      if (rs == 0 || rb < r.base || rb + rs > r.end()) broken("a returned range lies outside its region", rb, rs);
      if (ret_end != 0 && rb <= ret_end) broken("returned ranges overlap or are not coalesced", rb, rs);
      ret_end = rb + rs;
      returned += rs;
    }
    if (returned != rec.returned_bytes) broken("a region's returned bytes disagree with its ranges", r.base, returned);
    if (returned >= r.size_bytes) broken("a wholly returned region is still in the table", r.base, r.size_bytes);
    sum.reserved_bytes += r.size_bytes;
    if (r.locked) sum.locked_bytes += r.size_bytes;
    sum.returned_bytes += returned;
    ++sum.regions;
  }
  if (sum.reserved_bytes != totals_.reserved_bytes || sum.locked_bytes != totals_.locked_bytes ||
      sum.returned_bytes != totals_.returned_bytes || sum.regions != totals_.regions)
    broken("the table's totals disagree with its regions", 0, sum.reserved_bytes);
}

}  // namespace gpumem::pinned::detail
