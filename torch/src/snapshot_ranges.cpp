#include "snapshot_ranges.h"

namespace gpumem::torch::detail {

std::vector<MappedRun> mapped_runs(const alloc::SegmentView& segment) {
  std::vector<MappedRun> runs;
  MappedRun* open = nullptr;
  for (const auto& block : segment.blocks) {
    if (block.state == alloc::BlockState::unmapped) {
      open = nullptr;
      continue;
    }
    if (open == nullptr || open->base + open->size_bytes != block.addr) {
      runs.emplace_back();
      open = &runs.back();
      open->base = block.addr;
    }
    open->size_bytes += block.size_bytes;
    if (block.state == alloc::BlockState::allocated) {
      open->allocated_bytes += block.size_bytes;
      open->requested_bytes += block.requested_bytes;
    }
    if (block.state == alloc::BlockState::allocated || block.state == alloc::BlockState::pending_free)
      open->active_bytes += block.size_bytes;
    open->blocks.push_back(block);
  }
  return runs;
}

}  // namespace gpumem::torch::detail
