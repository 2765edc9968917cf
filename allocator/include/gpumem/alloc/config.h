// Config: one immutable value, parsed once, validated, passed to constructors. Nothing reads
// configuration mid-algorithm.
//
// Syntax (the same as PYTORCH_CUDA_ALLOC_CONF): `key:value,key2:value2,key3:[a:b,c:d]`; white
// space is ignored. GPUMEM_ALLOC_CONF accepts every PYTORCH_CUDA_ALLOC_CONF key with PyTorch
// 2.11's meaning plus gpumem's own keys (documented in docs/config.md). from_environment() reads
// GPUMEM_ALLOC_CONF; when that is unset it falls back to PYTORCH_CUDA_ALLOC_CONF, then
// PYTORCH_ALLOC_CONF (PyTorch's own precedence).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gpumem::alloc {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max();

enum class SourceKind : std::uint8_t { cuda_vmm, cuda_malloc, host_vmm, sim };

struct Config {
  // ---- PyTorch 2.11 keys ----
  // expandable_segments:True|False. gpumem defaults to True: one growing virtual region per
  // (stream, pool), physical pieces mapped on demand and recycled.
  bool expandable_segments = true;
  // max_split_size_mb: blocks at least this large are never split (classic segments only).
  std::size_t max_split_size_bytes = kNoLimit;
  // max_non_split_rounding_mb: an oversize cached block serves a request only if it is smaller
  // than request + this. Default = large_segment_size_bytes.
  std::size_t max_non_split_rounding_bytes = 20 * kMiB;
  // large_segment_size_mb: segment size for 1-10 MiB requests in classic mode, and the physical
  // piece size of the large pool in expandable mode. > 10 MiB.
  std::size_t large_segment_size_bytes = 20 * kMiB;
  // roundup_power2_divisions: per power-of-two bucket [2^i MiB, 2^(i+1) MiB), i = 0..15; 0 = off.
  std::array<std::uint32_t, 16> roundup_power2_divisions{};
  // garbage_collection_threshold: in (0,1); 0 = off. Active only with a memory cap.
  double garbage_collection_threshold = 0.0;
  // per_process_memory_fraction: [0,1]; 1 = no cap (unless memory_limit_bytes is set).
  double per_process_memory_fraction = 1.0;
  // Accepted for compatibility; kept and reported in snapshots' allocator_settings.
  bool release_lock_on_cudamalloc = false;
  bool pinned_use_cuda_host_register = false;
  std::uint32_t pinned_num_register_threads = 1;
  std::size_t pinned_reserve_segment_size_bytes = 0;
  bool pinned_use_background_threads = false;
  bool graph_capture_record_stream_reuse = false;

  // ---- gpumem's own keys ----
  // source:cuda_vmm|cuda_malloc|host_vmm|sim. Which MemorySource the installer builds.
  SourceKind source = SourceKind::cuda_vmm;
  // memory_limit_mb: absolute cap on reserved bytes (0 = none). With a fraction too, the smaller
  // of the two applies.
  std::size_t memory_limit_bytes = 0;
  // small_piece_size_mb: physical piece size of the small pool (a multiple of the granularity).
  std::size_t small_piece_bytes = 2 * kMiB;
  // recycle:True|False: physical page recycling (map wholly free pieces where a request lands
  // instead of creating new memory).
  bool recycle = true;
  // thread_cache:True|False: per-thread caches of recently freed small blocks.
  bool thread_cache = true;
  // va_reserve_mb: address space reserved per expandable region (0 = 1.125 x device memory).
  std::size_t va_reserve_bytes = 0;
  // check_invariants:True|False: run check_invariants() after every mutation (slow; tests).
  bool check_invariants = false;
  // Forensics: trace_entries (ring size, 0 = off), oom_report_dir (postmortem on OOM; empty =
  // off), record_ops:True|False (per-op attribution through at::RecordFunction).
  std::size_t trace_entries = 0;
  std::string oom_report_dir;
  bool record_ops = false;

  // The string this config was parsed from (reported in snapshots).
  std::string source_string;

  // The cap on reserved bytes for a device of total_bytes memory (kNoLimit if none). A
  // device_total_bytes of 0 means "unknown": the fraction cap is then not applied.
  std::size_t cap_bytes(std::size_t device_total_bytes) const noexcept;

  // Same settings: every field except source_string (two spellings of one configuration are
  // equal). parse_config(to_string(c)) == c for every Config parse_config produces.
  friend bool operator==(const Config& a, const Config& b) noexcept;
};

struct ConfigError {
  std::string message;  // names the key, the bad value and the accepted forms
};

// Parses a config string. Never throws.
std::variant<Config, ConfigError> parse_config(std::string_view text);

// Reads GPUMEM_ALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF; keys those
// variables carry that gpumem does not use, such as backend:native, are accepted and ignored;
// backend:cudaMallocAsync is an error, since gpumem replaces that allocator). The first variable
// that is set wins, even if it is empty. Error messages name the variable they came from.
std::variant<Config, ConfigError> config_from_environment();

// A canonical `key:value,...` string of every key (for snapshots and logs).
std::string to_string(const Config& config);

const char* to_string(SourceKind kind) noexcept;

// Every key parse_config accepts (canonical names, then aliases), for docs, tests and messages.
std::vector<std::string_view> config_keys();

}  // namespace gpumem::alloc
