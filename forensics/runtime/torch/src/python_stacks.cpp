// The translation unit of gpumem's forensics that includes torch's traceback headers
// (gpumem_forensics_torch).
#include "gpumem/forensics/python_stacks.h"

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <vector>

#include <torch/csrc/profiler/combined_traceback.h>

namespace gpumem::forensics {
namespace {

// Whether this process runs a Python interpreter: Python's C API is in the global symbol table
// (the python executable, or libpython loaded for embedding) and the interpreter is initialized.
// The symbol is looked up once it is found (dlsym walks every loaded library: about a microsecond);
// while it is missing (a libtorch C++ program), the lookup is repeated only every kRecheckCalls
// calls, since an embedding program may load and start Python after gpumem.
bool python_running() {
  using IsInitialized = int (*)();
  static std::atomic<bool> seen{false};
  static std::atomic<IsInitialized> found{nullptr};
  static std::atomic<unsigned> calls_since_lookup{0};
  constexpr unsigned kRecheckCalls = 4096;
  if (seen.load(std::memory_order_relaxed)) return true;
  IsInitialized is_initialized = found.load(std::memory_order_acquire);
  if (is_initialized == nullptr) {
    if (calls_since_lookup.fetch_add(1, std::memory_order_relaxed) % kRecheckCalls != 0) return false;
    is_initialized = reinterpret_cast<IsInitialized>(::dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    if (is_initialized == nullptr) return false;
    found.store(is_initialized, std::memory_order_release);
  }
  if (is_initialized() == 0) return false;
  seen.store(true, std::memory_order_relaxed);
  return true;
}

std::vector<std::vector<SnapshotFrame>> symbolize(std::span<const std::shared_ptr<void>> contexts) {
  std::vector<std::vector<SnapshotFrame>> out(contexts.size());
  std::vector<torch::CapturedTraceback*> tracebacks;
  std::vector<std::size_t> owner;  // tracebacks[j] belongs to out[owner[j]]
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    auto* gathered = static_cast<c10::GatheredContext*>(contexts[i].get());
    if (auto* tb = dynamic_cast<torch::CapturedTraceback*>(gathered)) {
      tracebacks.push_back(tb);
      owner.push_back(i);
    }
  }
  if (tracebacks.empty()) return out;
  const torch::SymbolizedTracebacks symbolized = torch::symbolize(tracebacks);
  for (std::size_t j = 0; j < symbolized.tracebacks.size() && j < owner.size(); ++j) {
    auto& frames = out[owner[j]];
    frames.reserve(symbolized.tracebacks[j].size());
    for (const std::uint64_t index : symbolized.tracebacks[j]) {
      const torch::unwind::Frame& f = symbolized.all_frames.at(index);
      frames.push_back(SnapshotFrame{f.funcname, f.filename, static_cast<std::int64_t>(f.lineno)});
    }
  }
  return out;
}

}  // namespace

std::shared_ptr<c10::GatheredContext> gather_python_stack() {
  if (!python_running()) return nullptr;
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/false);
}

StackSymbolizer python_stack_symbolizer() { return &symbolize; }

}  // namespace gpumem::forensics
