// Python stacks for allocations, through torch's captured-traceback machinery (the same objects
// PyTorch's _record_memory_history(stacks="python") keeps): gather_python_stack() takes the calling
// thread's Python (and TorchScript) stack as a torch::CapturedTraceback, which holds code-object
// references and instruction offsets only; python_stack_symbolizer() turns such contexts into
// file:line:function frames when a snapshot or an OOM postmortem is written, never before.
//
// torch installs its Python unwinder when `import torch` runs; in a process without a Python
// interpreter (a libtorch C++ program) gather_python_stack() returns null at the cost of one
// atomic increment (the interpreter's symbol is looked up again every 4096th call, for programs
// that embed Python later), so python_stacks:auto costs such programs next to nothing.
//
// Cost: gathering walks the thread's Python frames and takes the GIL (torch's unwinder does, as
// for _record_memory_history), a few microseconds per allocation; the torch adapter gathers only
// for allocations of at least python_stacks_min_kb (forensics::Config). Symbolizing takes the GIL
// too (inside torch::symbolize): call the symbolizer holding no lock a GIL holder may wait for.
//
// Thread-safety: both may be called from any thread.
#pragma once

#include <memory>

#include "gpumem/forensics/stack_symbolizer.h"

namespace c10 {
struct GatheredContext;
}

namespace gpumem::forensics {

// The calling thread's Python stack, or null when this process runs no Python interpreter.
std::shared_ptr<c10::GatheredContext> gather_python_stack();

// Frames of contexts that are c10::GatheredContext objects made by torch::CapturedTraceback (ours
// above, or PyTorch's own history contexts); other contexts get no frames. Frames are innermost
// first, as SnapshotFrame lists are.
StackSymbolizer python_stack_symbolizer();

}  // namespace gpumem::forensics
