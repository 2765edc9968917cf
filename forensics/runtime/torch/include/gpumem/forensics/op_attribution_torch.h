// Per-op attribution with libtorch: at::RecordFunction global callbacks that keep OpStack
// (op_attribution.h) current on every thread, so that gpumem's observers tag each allocator event
// with the innermost op (aten::mm, a C++ RECORD_FUNCTION block) and the innermost user scope
// (torch.profiler.record_function, RECORD_USER_SCOPE). Autograd nodes (BACKWARD_FUNCTION scope)
// are not recorded: they allocate through the aten ops they call, which are innermost.
//
// The callbacks take no lock and allocate nothing: start pushes the op's name pointer, end pops
// it (two stores each); a name is interned only when an allocation inside the op asks for it
// (OpStack). The rest of their cost is libtorch's: once any global callback is installed it builds
// a RecordFunction for every op (bench/op_attribution_overhead.cpp --on callbacks|observers|all measures them, and
// scripts/gpu/forensics.sh runs it on the GPU host).
//
// Thread-safety: install and set_record_function_attribution may run while other threads run
// ops (libtorch re-reads its versioned list of global callbacks on each thread; an op that began
// with the callback enabled still pops at its end). remove only during initialization or while
// no other thread runs ops (at::removeCallback's own rule). installed() is safe anywhere.
#pragma once

namespace gpumem::forensics {

// Installs the callbacks (FUNCTION and USER_SCOPE scopes), or re-enables them after
// set_record_function_attribution(false). A second call is a no-op. Returns true.
bool install_record_function_attribution();

// The run-time switch of op attribution (torch.ops.gpumem.record_ops, gpumem.record_ops):
// true installs or re-enables the callbacks, false disables them (libtorch then builds no
// RecordFunction for them, so ops cost what they cost without gpumem; events get no op until
// re-enabled). Returns whether they were enabled before. Takes effect on each thread at its next op.
bool set_record_function_attribution(bool enabled);

// Removes them; events are then attributed to nothing. No-op when not installed.
void remove_record_function_attribution();

// Whether the callbacks are installed and enabled.
bool record_function_attribution_installed() noexcept;

}  // namespace gpumem::forensics
