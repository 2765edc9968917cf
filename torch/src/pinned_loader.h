// Loads gpumem's pinned host allocator (libgpumem_pinned_torch.so) for pinned_allocator:gpumem.
//
// The pinned allocator is a library of its own, never linked into libgpumem_torch.so: it carries
// gpumem's private jemalloc, whose load-time constructor initializes jemalloc, and which (when built
// from Debian's binary package rather than by scripts/stage_jemalloc.sh) needs static TLS that a
// library loaded late (Python) only gets with GLIBC_TUNABLES (pinned/README.md). So processes that
// do not ask for it never load it, and the device allocator loads whatever jemalloc the build found.
//
// Two steps, so that install() can refuse before it changes anything: open() finds and loads the
// library and its entry point (no allocator is touched); install() makes it libtorch's CUDA host
// allocator with the adapter's pinned_* settings. No torch header.
//
// Thread-safety: call from the installer, under its mutex. Loading twice returns the same library.
#pragma once

#include <string>

#include "gpumem/forensics/config.h"
#include "gpumem/torch/adapter_config.h"
#include "gpumem/torch/pinned_abi.h"

namespace gpumem::torch::detail {

class PinnedLibrary {
 public:
  // dlopens GPUMEM_PINNED_LIBRARY if set, else libgpumem_pinned_torch.so beside the library this
  // code is in (libgpumem_torch.so), else by name through the loader's search path.
  static PinnedLibrary open();

  bool ok() const noexcept { return install_ != nullptr; }
  // Why open() failed: one sentence naming the library, dlerror() and the fix.
  const std::string& error() const noexcept { return error_; }
  const std::string& path() const noexcept { return path_; }

  // Installs the pinned allocator (once per process; later calls keep the first one's settings).
  // pinned_use_background_threads -> a thread returning completed frees every 100 us (PyTorch's
  // background thread polls as often); pinned_num_register_threads -> threads that touch a new
  // region's pages before cudaHostRegister; trace_entries -> its event ring, for snapshots
  // (torch.ops.gpumem_pinned.dump_snapshot). Returns "" or one sentence.
  std::string install(const AdapterConfig& adapter, const forensics::Config& forensics) const;

 private:
  using InstallFn = int (*)(const GpumemPinnedSettings* settings, char* error, unsigned long error_len);
  InstallFn install_ = nullptr;
  std::string path_;
  std::string error_;
};

}  // namespace gpumem::torch::detail
