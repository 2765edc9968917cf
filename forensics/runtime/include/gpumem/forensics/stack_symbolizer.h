// StackSymbolizer: turns the opaque stack contexts that records carry (AllocContext: the torch
// adapter's torch::CapturedTraceback objects) into frames, innermost first, when a snapshot is
// made. The runtime never looks inside a context; whoever gathers them provides the symbolizer
// (python_stacks.h in gpumem_forensics_torch).
//
// Contract: the result has one frame list per context, in order (empty where a context has no
// frames or is not of the gatherer's type). Called on the thread that takes the snapshot, with no
// lock of the forensics held; it may take the Python GIL.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

using StackSymbolizer =
    std::function<std::vector<std::vector<SnapshotFrame>>(std::span<const std::shared_ptr<void>> contexts)>;

}  // namespace gpumem::forensics
