// The C entry point of libgpumem_pinned_torch.so that libgpumem_torch.so's loader calls
// (torch/src/pinned_loader.h), so that neither library needs the other's C++ symbols. Plain C.
//
// Growth: new fields go at the end; `size_bytes` says how many bytes of the struct the caller
// filled, and fields beyond it take their defaults.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

struct GpumemPinnedSettings {
  unsigned long size_bytes;            // sizeof(struct GpumemPinnedSettings) of the caller
  unsigned background_period_us;       // pinned_use_background_threads: 100, else 0 (no thread)
  unsigned touch_threads;              // pinned_num_register_threads (1..128)
  unsigned long long trace_entries;    // trace_entries: the pinned allocator's event ring (0 = none)
};

// Installs gpumem's pinned allocator as libtorch's CUDA host allocator (once per process; later
// calls keep the first one's settings). Returns 0, or 1 with one sentence in error (NUL-terminated,
// truncated to error_len).
int gpumem_install_pinned_with(const struct GpumemPinnedSettings* settings, char* error, unsigned long error_len);

#ifdef __cplusplus
}
#endif
