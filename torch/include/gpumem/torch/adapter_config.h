// AdapterConfig: the keys the torch adapter owns: which memory source it builds for each device,
// which pinned host allocator libtorch uses, and PyTorch 2.11's keys gpumem accepts for
// compatibility (it reports them in snapshots' allocator settings, as PyTorch does, and validates
// them as PyTorch does; none changes what the engine does; pinned_num_register_threads and
// pinned_use_background_threads configure gpumem's pinned allocator when it is chosen). The engine's keys are alloc::Config's, the forensics keys forensics::Config's;
// gpumem::torch::Config (config.h) joins the three.
//
// Thread-safety: a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpumem/alloc/config_syntax.h"

namespace gpumem::torch {

// Which MemorySource the installer builds (source:...).
enum class SourceKind : std::uint8_t { cuda_vmm, cuda_malloc, host_vmm, sim };

const char* to_string(SourceKind kind) noexcept;

// Which allocator serves libtorch's pinned host memory (pinned_allocator:...): PyTorch's own
// (power-of-two blocks) or gpumem's (gpumem::pinned, a jemalloc arena over page-locked regions,
// loaded from libgpumem_pinned_torch.so when the CUDA allocator is installed).
enum class PinnedAllocatorKind : std::uint8_t { native, gpumem };

const char* to_string(PinnedAllocatorKind kind) noexcept;

struct AdapterConfig {
  // source:cuda_vmm|cuda_malloc|host_vmm|sim. install_cpu always uses host_vmm.
  SourceKind source = SourceKind::cuda_vmm;
  // pinned_allocator:native|gpumem.
  PinnedAllocatorKind pinned_allocator = PinnedAllocatorKind::native;
  // ipc_handles:True|False. source:cuda_vmm creates its pieces exportable to other processes, so
  // torch.multiprocessing can send CUDA tensors (CUDA IPC). PyTorch's expandable segments do the
  // same by default (TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC). False creates plain pieces; sharing a
  // tensor then raises, naming this key.
  bool ipc_handles = true;
  // Accepted for compatibility (PyTorch 2.11's keys); kept and reported in snapshots'
  // allocator_settings.
  bool release_lock_on_cudamalloc = false;
  bool pinned_use_cuda_host_register = false;
  std::uint32_t pinned_num_register_threads = 1;
  std::size_t pinned_reserve_segment_size_bytes = 0;
  bool pinned_use_background_threads = false;
  bool graph_capture_record_stream_reuse = false;

  friend bool operator==(const AdapterConfig& a, const AdapterConfig& b) noexcept = default;
};

// A canonical `key:value,...` string of the adapter's keys (backend, which is not a setting, is
// left out).
std::string to_string(const AdapterConfig& config);

// The adapter's keys (backend included) bound to target, for the parse that joins every layer's
// keys.
alloc::config_syntax::KeyTable adapter_key_table(AdapterConfig& target);

}  // namespace gpumem::torch
