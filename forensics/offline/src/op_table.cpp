#include "gpumem/forensics/op_table.h"

#include <algorithm>

namespace gpumem::forensics {

std::uint32_t OpTableBuilder::intern(std::string_view key) {
  auto it = index_.find(std::string(key));
  if (it != index_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(rows_.size());
  OpRow row;
  row.name = std::string(key);
  rows_.push_back(std::move(row));
  index_.emplace(std::string(key), id);
  return id;
}

void OpTableBuilder::add(TraceAction action, std::string_view key, std::uint64_t addr, std::uint64_t size_bytes) {
  add_id(action, intern(key), addr, size_bytes);
}

void OpTableBuilder::end_call() {
  if (call_key_ >= rows_.size()) return;
  auto& row = rows_[call_key_];
  const std::int64_t after = static_cast<std::int64_t>(reserved_) - static_cast<std::int64_t>(live_total_);
  const std::int64_t delta = after - call_frag_before_;
  row.frag_delta_bytes += delta;
  if (delta > row.worst_call_frag_after_bytes - row.worst_call_frag_before_bytes) {
    row.worst_call_frag_before_bytes = call_frag_before_;
    row.worst_call_frag_after_bytes = after;
  }
}

void OpTableBuilder::capture_peak() {
  peak_live_.resize(rows_.size());
  for (std::size_t i = 0; i < rows_.size(); ++i) peak_live_[i] = rows_[i].live_bytes;
  peak_dirty_ = false;
}

void OpTableBuilder::add_id(TraceAction action, std::uint32_t key, std::uint64_t addr, std::uint64_t size_bytes) {
  if (key != call_key_) {
    end_call();
    call_key_ = key;
    call_frag_before_ = static_cast<std::int64_t>(reserved_) - static_cast<std::int64_t>(live_total_);
    ++rows_[key].calls;
  }
  auto release = [&](std::uint64_t a) {
    auto it = live_.find(a);
    if (it == live_.end()) return;
    if (peak_dirty_) capture_peak();
    rows_[it->second.key].live_bytes -= it->second.size_bytes;
    live_total_ -= it->second.size_bytes;
    live_.erase(it);
  };
  switch (action) {
    case TraceAction::alloc: {
      release(addr);  // an alloc over a live address: its free was not recorded
      live_.emplace(addr, Live{key, size_bytes});
      auto& row = rows_[key];
      ++row.allocs;
      row.allocated_bytes += size_bytes;
      row.live_bytes += size_bytes;
      live_total_ += size_bytes;
      if (live_total_ > peak_total_) {
        peak_total_ = live_total_;
        peak_dirty_ = true;
      }
      break;
    }
    case TraceAction::free_completed:
      release(addr);
      break;
    case TraceAction::segment_alloc:
    case TraceAction::segment_map:
      reserved_ += size_bytes;
      rows_[key].reserved_growth_bytes += size_bytes;
      break;
    case TraceAction::segment_free:
    case TraceAction::segment_unmap:
      reserved_ -= std::min(reserved_, size_bytes);
      break;
    default:
      break;
  }
}

std::vector<OpRow> OpTableBuilder::rows() const {
  std::vector<OpRow> out = rows_;
  // The call in progress: account for it as if it ended now.
  if (call_key_ < out.size()) {
    auto& row = out[call_key_];
    const std::int64_t after = static_cast<std::int64_t>(reserved_) - static_cast<std::int64_t>(live_total_);
    const std::int64_t delta = after - call_frag_before_;
    row.frag_delta_bytes += delta;
    if (delta > row.worst_call_frag_after_bytes - row.worst_call_frag_before_bytes) {
      row.worst_call_frag_before_bytes = call_frag_before_;
      row.worst_call_frag_after_bytes = after;
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (peak_dirty_) {
      out[i].peak_contribution_bytes = out[i].live_bytes;
    } else {
      out[i].peak_contribution_bytes = i < peak_live_.size() ? peak_live_[i] : 0;
    }
  }
  std::erase_if(out, [](const OpRow& r) { return r.allocs == 0 && r.reserved_growth_bytes == 0; });
  std::stable_sort(out.begin(), out.end(),
                   [](const OpRow& a, const OpRow& b) { return a.allocated_bytes > b.allocated_bytes; });
  return out;
}

}  // namespace gpumem::forensics
