// The torch adapter's keys (gpumem/torch/adapter_config.h): source, pinned_allocator, and PyTorch
// 2.11's keys gpumem
// accepts for compatibility (backend, release_lock_on_cudamalloc, the pinned allocator's keys,
// graph_capture_record_stream_reuse), validated as PyTorch validates them. docs/config.md
// documents them; keep the table below and that page in step.
//
// Where gpumem is looser than PyTorch: pinned_reserve_segment_size_mb:0 means "off" (PyTorch
// refuses 0), so that to_string can spell every setting.
#include "gpumem/torch/adapter_config.h"

#include <iterator>

#include <fmt/format.h>

namespace gpumem::torch {
namespace {

using alloc::config_syntax::Entry;
using alloc::config_syntax::fail;
using alloc::config_syntax::fail_value;
using alloc::config_syntax::Key;
using alloc::config_syntax::KeyInfo;
using alloc::config_syntax::want_bool;

constexpr std::uint64_t kMaxRegisterThreads = 128;  // PyTorch's limit

void apply_backend(const Entry& e, const KeyInfo& k, AdapterConfig&) {
  const std::string& v = alloc::config_syntax::want_scalar(e, k);
  if (v == "native") return;  // PyTorch's default allocator: gpumem stands in for it
  if (v == "cudaMallocAsync")
    fail(fmt::format("{} selects PyTorch's cudaMallocAsync allocator, but gpumem replaces "
                     "PyTorch's CUDA allocator; remove backend:cudaMallocAsync (or write "
                     "backend:native) to use gpumem, or do not load gpumem to use cudaMallocAsync",
                     e.shown()));
  fail_value(e, k, "is not a known backend");
}

void apply_release_lock_on_cudamalloc(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  c.release_lock_on_cudamalloc = want_bool(e, k);
}

void apply_pinned_use_cuda_host_register(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  c.pinned_use_cuda_host_register = want_bool(e, k);
}

void apply_pinned_num_register_threads(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  std::uint64_t v = alloc::config_syntax::want_uint(e, k);
  if (!alloc::config_syntax::is_pow2(v)) fail_value(e, k, "is not a power of 2");
  if (v > kMaxRegisterThreads) fail_value(e, k, "is too large");
  c.pinned_num_register_threads = static_cast<std::uint32_t>(v);
}

void apply_pinned_reserve_segment_size(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  c.pinned_reserve_segment_size_bytes = alloc::config_syntax::want_mib(e, k);
}

void apply_pinned_use_background_threads(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  c.pinned_use_background_threads = want_bool(e, k);
}

void apply_graph_capture_record_stream_reuse(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  c.graph_capture_record_stream_reuse = want_bool(e, k);
}

void apply_ipc_handles(const Entry& e, const KeyInfo& k, AdapterConfig& c) { c.ipc_handles = want_bool(e, k); }

void apply_source(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  const std::string& v = alloc::config_syntax::want_scalar(e, k);
  for (SourceKind s : {SourceKind::cuda_vmm, SourceKind::cuda_malloc, SourceKind::host_vmm, SourceKind::sim}) {
    if (v == to_string(s)) {
      c.source = s;
      return;
    }
  }
  fail_value(e, k, "is not a known memory source");
}

void apply_pinned_allocator(const Entry& e, const KeyInfo& k, AdapterConfig& c) {
  const std::string& v = alloc::config_syntax::want_scalar(e, k);
  for (PinnedAllocatorKind p : {PinnedAllocatorKind::native, PinnedAllocatorKind::gpumem}) {
    if (v == to_string(p)) {
      c.pinned_allocator = p;
      return;
    }
  }
  fail_value(e, k, "is not a known pinned host allocator");
}

// In to_string's order.
constexpr Key<AdapterConfig> kKeys[] = {
    {{"backend", "", "native (gpumem replaces PyTorch's allocators, so cudaMallocAsync is refused)",
      "backend:native"},
     apply_backend},
    {{"release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "True or False", "release_lock_on_cudamalloc:False"},
     apply_release_lock_on_cudamalloc},
    {{"pinned_use_cuda_host_register", "pinned_use_hip_host_register", "True or False",
      "pinned_use_cuda_host_register:True"},
     apply_pinned_use_cuda_host_register},
    {{"pinned_num_register_threads", "", "a power of 2 from 1 to 128", "pinned_num_register_threads:8"},
     apply_pinned_num_register_threads},
    {{"pinned_reserve_segment_size_mb", "", "a whole number of MiB (0 = off)", "pinned_reserve_segment_size_mb:256"},
     apply_pinned_reserve_segment_size},
    {{"pinned_use_background_threads", "", "True or False", "pinned_use_background_threads:True"},
     apply_pinned_use_background_threads},
    {{"graph_capture_record_stream_reuse", "", "True or False", "graph_capture_record_stream_reuse:True"},
     apply_graph_capture_record_stream_reuse},
    {{"source", "", "cuda_vmm, cuda_malloc, host_vmm or sim", "source:cuda_vmm"}, apply_source},
    {{"pinned_allocator", "", "native (PyTorch's) or gpumem", "pinned_allocator:gpumem"}, apply_pinned_allocator},
    {{"ipc_handles", "", "True or False", "ipc_handles:False"}, apply_ipc_handles},
};

}  // namespace

const char* to_string(SourceKind kind) noexcept {
  switch (kind) {
    case SourceKind::cuda_vmm: return "cuda_vmm";
    case SourceKind::cuda_malloc: return "cuda_malloc";
    case SourceKind::host_vmm: return "host_vmm";
    case SourceKind::sim: return "sim";
  }
  return "unknown";
}

const char* to_string(PinnedAllocatorKind kind) noexcept {
  switch (kind) {
    case PinnedAllocatorKind::native: return "native";
    case PinnedAllocatorKind::gpumem: return "gpumem";
  }
  return "unknown";
}

alloc::config_syntax::KeyTable adapter_key_table(AdapterConfig& target) {
  return alloc::config_syntax::KeyTable(kKeys, target);
}

std::string to_string(const AdapterConfig& c) {
  using alloc::config_syntax::bool_text;
  return fmt::format(
      "release_lock_on_cudamalloc:{},pinned_use_cuda_host_register:{},pinned_num_register_threads:{},"
      "pinned_reserve_segment_size_mb:{},pinned_use_background_threads:{},graph_capture_record_stream_reuse:{},"
      "source:{},pinned_allocator:{},ipc_handles:{}",
      bool_text(c.release_lock_on_cudamalloc), bool_text(c.pinned_use_cuda_host_register),
      c.pinned_num_register_threads, c.pinned_reserve_segment_size_bytes >> 20,
      bool_text(c.pinned_use_background_threads), bool_text(c.graph_capture_record_stream_reuse), to_string(c.source),
      to_string(c.pinned_allocator), bool_text(c.ipc_handles));
}

}  // namespace gpumem::torch
