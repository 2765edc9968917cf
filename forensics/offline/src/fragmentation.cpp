#include "gpumem/forensics/fragmentation.h"

#include <algorithm>
#include <unordered_map>

namespace gpumem::forensics {
namespace {

constexpr std::uint64_t kGranuleBytes = 2ull << 20;

bool is_inactive(const SnapshotBlock& b) { return b.state == "inactive"; }

struct AllocFacts {
  std::int64_t time_us = 0;
  const SnapshotTraceEntry* entry = nullptr;
};

}  // namespace

Fragmentation analyze_fragmentation(const std::vector<SnapshotSegment>& segments, const FragmentationOptions& options) {
  Fragmentation f;
  std::unordered_map<std::uint64_t, AllocFacts> last_alloc;
  if (options.trace) {
    const std::size_t n = std::min(options.trace_entries, options.trace->size());
    for (std::size_t i = 0; i < n; ++i) {
      const auto& e = (*options.trace)[i];
      if (e.action == TraceAction::alloc) last_alloc[e.addr] = AllocFacts{e.time_us, &e};
    }
  }
  for (const auto& seg : segments) {
    ++f.segments;
    std::uint64_t seg_total = 0, seg_active = 0, seg_free = 0;
    std::vector<const SnapshotBlock*> active;
    for (const auto& b : seg.blocks) {
      seg_total += b.size_bytes;
      if (is_inactive(b)) {
        seg_free += b.size_bytes;
        f.largest_free_extent_bytes = std::max(f.largest_free_extent_bytes, b.size_bytes);
        continue;
      }
      seg_active += b.size_bytes;
      active.push_back(&b);
      if (b.state == "active_pending_free") {
        f.pending_free_bytes += b.size_bytes;
      } else {
        f.allocated_bytes += b.size_bytes;
        f.requested_bytes += std::min(b.requested_bytes, b.size_bytes);
        ++f.live_blocks;
      }
    }
    f.reserved_bytes += seg_total;
    f.free_bytes += seg_free;
    if (active.empty()) {
      f.cached_free_bytes += seg_free;
    } else if (!seg.is_expandable) {
      f.inactive_split_bytes += seg_free;
    } else {
      // Per 2 MiB page: free bytes in pages that also hold active bytes are inactive split.
      std::unordered_map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> pages;  // idx -> (free, active)
      for (const auto& b : seg.blocks) {
        std::uint64_t a = b.address;
        const std::uint64_t end = b.address + b.size_bytes;
        while (a < end) {
          const std::uint64_t idx = (a - seg.address) / kGranuleBytes;
          const std::uint64_t pend = std::min(end, seg.address + (idx + 1) * kGranuleBytes);
          auto& p = pages[idx];
          (is_inactive(b) ? p.first : p.second) += pend - a;
          a = pend;
          if (pend == end) break;
          // Whole pages inside one block: skip them in one step.
          if (end - a >= kGranuleBytes) {
            const std::uint64_t whole = (end - a) / kGranuleBytes;
            for (std::uint64_t k = 0; k < whole; ++k) {
              auto& q = pages[idx + 1 + k];
              (is_inactive(b) ? q.first : q.second) += kGranuleBytes;
            }
            a += whole * kGranuleBytes;
          }
        }
      }
      for (const auto& [idx, p] : pages) (p.second > 0 ? f.inactive_split_bytes : f.cached_free_bytes) += p.first;
    }
    if (!active.empty() && active.size() <= options.max_pinned_blocks && seg_active * 8 <= seg_total &&
        seg_free >= kGranuleBytes) {
      PinnedSegment p;
      p.address = seg.address;
      p.total_size_bytes = seg_total;
      p.active_bytes = seg_active;
      p.free_bytes = seg_free;
      p.expandable = seg.is_expandable;
      for (const SnapshotBlock* b : active) {
        PinningBlock pb;
        pb.address = b->address;
        pb.size_bytes = b->size_bytes;
        pb.requested_bytes = b->requested_bytes;
        pb.op = b->op;
        pb.site = call_site(b->frames);
        if (auto it = last_alloc.find(b->address); it != last_alloc.end()) {
          if (pb.op.empty()) pb.op = it->second.entry->op;
          if (pb.site.empty()) pb.site = call_site(it->second.entry->frames);
          if (options.moment_us != 0) pb.age_us = options.moment_us - it->second.time_us;
        }
        p.blocks.push_back(std::move(pb));
      }
      f.pinned.push_back(std::move(p));
    }
  }
  f.rounding_bytes = f.allocated_bytes - f.requested_bytes;
  f.external_fragmentation =
      f.free_bytes == 0 ? 0.0
                        : 1.0 - static_cast<double>(f.largest_free_extent_bytes) / static_cast<double>(f.free_bytes);
  std::stable_sort(f.pinned.begin(), f.pinned.end(),
                   [](const PinnedSegment& a, const PinnedSegment& b) { return a.free_bytes > b.free_bytes; });
  if (f.pinned.size() > options.max_pinned_segments) f.pinned.resize(options.max_pinned_segments);
  return f;
}

std::uint64_t largest_usable_extent(const std::vector<SnapshotSegment>& segments, std::uint64_t stream,
                                    std::uint64_t rounded_bytes) {
  const bool small = rounded_bytes <= (1u << 20);
  std::uint64_t best = 0;
  for (const auto& seg : segments) {
    if (seg.stream != stream) continue;
    // A private pool's memory (a CUDA graph's, a MemPool's) serves only its own requests; an OOM
    // record does not say its pool, and is read as the default pool's.
    if (seg.pool_id != std::pair<std::int64_t, std::int64_t>{0, 0}) continue;
    const bool seg_small = seg.segment_type == "small";
    if (seg_small != small) continue;
    for (const auto& b : seg.blocks) {
      if (is_inactive(b)) best = std::max(best, b.size_bytes);
    }
  }
  return best;
}

}  // namespace gpumem::forensics
