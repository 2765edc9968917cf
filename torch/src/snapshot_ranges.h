// Mapped runs: how an engine segment is shown to PyTorch's snapshot readers.
//
// PyTorch's snapshot lists one segment per contiguous *mapped* range (an expandable segment with
// holes shows as several), and memory_viz recomputes block addresses as segment address + sizes
// of the blocks before, so each shown segment must be tiled exactly by its blocks. A classic
// segment is one run; an expandable region gives one run per maximal sequence of blocks that are
// not unmapped. Runs are in address order; blocks keep theirs.
//
// Pure functions of plain data; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpumem/alloc/introspection.h"

namespace gpumem::torch::detail {

struct MappedRun {
  std::uintptr_t base = 0;
  std::size_t size_bytes = 0;
  std::size_t allocated_bytes = 0;   // blocks in state allocated
  std::size_t active_bytes = 0;      // allocated + pending_free
  std::size_t requested_bytes = 0;   // requested bytes of allocated blocks
  std::vector<alloc::BlockView> blocks;
};

std::vector<MappedRun> mapped_runs(const alloc::SegmentView& segment);

}  // namespace gpumem::torch::detail
