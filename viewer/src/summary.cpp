#include "gpumem/view/summary.h"

#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "gpumem/forensics/vocabulary.h"

namespace gpumem::view {

// One number format for every command (forensics/vocabulary.h).
std::string format_bytes(std::uint64_t bytes) { return forensics::format_bytes(bytes); }

std::string format_delta_bytes(std::int64_t bytes) { return forensics::format_signed_bytes(bytes); }

std::string format_us(std::int64_t us) {
  if (std::llabs(us) >= 1'000'000) return fmt::format("{:.3f} s", static_cast<double>(us) / 1e6);
  return fmt::format("{:.1f} ms", static_cast<double>(us) / 1e3);
}

Summary summarize(const ViewerModel& model, const MemoryState& state, std::size_t cursor) {
  Summary s;
  s.cursor = cursor;
  s.t_us = model.time_us_at(cursor) - model.time_us_at(0);
  s.allocated_bytes = state.allocated_bytes;
  s.reserved_bytes = state.reserved_bytes;
  s.reserved_unallocated_bytes = state.reserved_bytes > state.allocated_bytes ? state.reserved_bytes - state.allocated_bytes : 0;
  s.largest_free_extent_bytes = largest_free_extent(state);
  s.segment_count = state.segments.size();
  s.live_block_count = state.blocks.size();
  for (const auto& [addr, block] : state.blocks) {
    if (state.segment_of(addr) != state.segments.end()) continue;
    ++s.outside_segment_block_count;
    s.outside_segment_bytes += block.size_bytes;
  }
  s.peak_allocated_bytes = model.allocated_at(model.peak_allocated_cursor());
  s.peak_reserved_bytes = model.reserved_at(model.peak_reserved_cursor());
  if (const auto oc = model.oom_cursor()) {
    OomFacts f;
    f.cursor = *oc;
    f.requested_bytes = model.trace().entries[*oc - 1].size_bytes;
    f.device_free_bytes = model.oom_device_free_bytes();
    s.oom = f;
    s.verdict_source = model.oom_report_pending()
                           ? "viewer estimate; the forensics OOM report is still being computed"
                           : "viewer estimate (no forensics OOM report for this model)";
    const std::uint64_t r = f.requested_bytes;
    if (cursor != *oc) {
      s.verdict = fmt::format("OOM at entry {} requesting {} (press o to go there)", *oc, format_bytes(r));
    } else if (const auto& rep = model.oom_report()) {
      std::string v = rep->verdict;
      for (char& c : v) c = c == '_' ? ' ' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      s.verdict = fmt::format("{}: {} request, largest usable free extent {}, {} reserved-unallocated", v,
                              format_bytes(rep->request_bytes), format_bytes(rep->largest_usable_extent_bytes),
                              format_bytes(s.reserved_unallocated_bytes));
      s.advice = rep->advice;
      s.evidence = rep->evidence;
      s.verdict_source = "forensics OOM report at the OOM moment (gpumem report FILE prints all of it)";
    } else if (s.largest_free_extent_bytes >= r) {
      s.verdict = fmt::format("OOM requesting {}, yet a free extent of {} would hold it", format_bytes(r),
                              format_bytes(s.largest_free_extent_bytes));
      s.verdict_detail = "block sizes in a trace are estimates (requests rounded to 512 B); the snapshot's "
                         "segments are exact";
    } else if (s.reserved_unallocated_bytes >= r) {
      s.verdict = fmt::format("FRAGMENTATION: {} reserved-unallocated >= the {} request, largest free extent {}",
                              format_bytes(s.reserved_unallocated_bytes), format_bytes(r),
                              format_bytes(s.largest_free_extent_bytes));
      s.verdict_detail = "the cached memory is there but in pieces: try expandable_segments:True, or "
                         "max_split_size_mb to stop large blocks being split";
    } else if (f.device_free_bytes && s.reserved_unallocated_bytes + *f.device_free_bytes >= r) {
      s.verdict = fmt::format("FRAGMENTATION: {} cached + {} free on the device >= the {} request, but no "
                              "contiguous range holds it",
                              format_bytes(s.reserved_unallocated_bytes), format_bytes(*f.device_free_bytes),
                              format_bytes(r));
      s.verdict_detail = "try expandable_segments:True so segments grow in place";
    } else {
      const std::uint64_t have = s.reserved_unallocated_bytes + f.device_free_bytes.value_or(0);
      s.verdict = fmt::format("CAPACITY: the {} request exceeds all free memory ({}) by {}", format_bytes(r),
                              format_bytes(have), format_bytes(r - have));
      s.verdict_detail = "the live tensors need more than the device has: smaller batch, activation "
                         "checkpointing, or free tensors earlier (see the Live view)";
    }
  }
  return s;
}

}  // namespace gpumem::view
