// PytorchPolicy: a model of PyTorch 2.11's native DeviceCachingAllocator (c10/cuda/
// CUDACachingAllocator.cpp, namespace Native), classic and with expandable_segments:True, written
// from that code's algorithm (docs/notes/pytorch-allocator-model.md).
// It predicts what PyTorch would reserve for a trace's requests without a GPU.
//
// What it models:
//   * Sizes: requests < 512 B -> 512; otherwise 512-byte multiples, or the next
//     1/N power-of-two step when roundup_power2_divisions sets N > 1 for the size's bucket.
//   * Pools: rounded size <= 1 MiB -> small pool, else large; free blocks ordered by
//     (stream, size, address); best fit = the first block at or after (stream, size, 0) on the
//     same stream. Blocks never move between streams.
//   * Classic segments (cudaMalloc): 2 MiB for small requests, large_segment_size (20 MiB) for
//     rounded sizes below 10 MiB, else the size rounded up to 2 MiB.
//   * Oversize: with max_split_size set, blocks >= it are never split, serve no request below it,
//     and serve a request >= it only if smaller than request + max_non_split_rounding.
//   * Split: small pool or expandable mode -> if the remainder is >= 512 B; large pool -> if the
//     request is below max_split_size and the remainder is > 1 MiB. The block keeps the front.
//   * Free: merge with free neighbours of the same segment (same mapped state).
//   * When no cached block fits: garbage collection (only with a cap and a threshold),
//     allocate a new segment, else free cached oversize blocks and retry, else free every
//     unsplit cached block (unmap free pages of expandable segments) and retry; else OOM.
//   * Expandable segments: one virtual range of 1.125 x device memory per (stream, pool),
//     mapped in pages of 2 MiB (small pool) or large_segment_size (large pool) at the lowest
//     address with enough free+unmapped room; best fit values a block that borders unmapped
//     space at its size plus that space.
//   * Addresses: best fit breaks ties between equal sizes by address, so which address cudaMalloc
//     returns matters. With use_trace_segment_addresses, prepare(trace) collects the trace's
//     segment_alloc entries and each new classic segment takes the address cudaMalloc gave the
//     next recorded segment of the same size (when it is free in the model); other segments get
//     addresses from a private range.
//   * The cap: per_process_memory_fraction x device memory (or an absolute limit) checked
//     against reserved + the segment size before each growth, as PyTorch does.
// Not modelled: CUDA graph pools, record_stream / events (the replay has none), IPC.
// See Note [PyTorch allocator model] in docs/notes/pytorch-allocator-model.md for why it is exact
// on the real traces and how that is checked.
//
// Thread-safety: single-threaded, like every ReplayPolicy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/forensics/replay_policy.h"
#include "gpumem/forensics/trace.h"

namespace gpumem::forensics {

// Device memory of an H200 as PyTorch reports it (139.80 GiB), rounded to 2 MiB.
inline constexpr std::size_t kH200TotalBytes = std::size_t{71578} * (std::size_t{2} << 20);

struct PytorchModelOptions {
  bool expandable_segments = false;
  std::size_t max_split_size_bytes = std::numeric_limits<std::size_t>::max();  // max = unlimited
  std::size_t max_non_split_rounding_bytes = std::size_t{20} << 20;
  std::size_t large_segment_size_bytes = std::size_t{20} << 20;
  std::array<std::uint32_t, 16> roundup_power2_divisions{};  // bucket i = [2^i MiB, 2^(i+1) MiB)
  double garbage_collection_threshold = 0.0;                 // active only with a cap
  std::size_t device_total_bytes = kH200TotalBytes;
  std::size_t cap_bytes = std::numeric_limits<std::size_t>::max();  // max = no cap
  bool use_trace_segment_addresses = true;
};

// A change to the model's device memory, in the trace's vocabulary (segment_alloc / segment_free
// for classic segments, segment_map / segment_unmap for expandable pages): what a trace's own
// segment_* entries record, so the two can be compared line by line.
struct ModelSegmentEvent {
  TraceAction action = TraceAction::segment_alloc;
  std::uint64_t addr = 0;
  std::size_t size_bytes = 0;
};

class PytorchPolicy final : public ReplayPolicy {
 public:
  PytorchPolicy(std::string name, PytorchModelOptions options);
  ~PytorchPolicy() override;

  const std::string& name() const noexcept override;
  std::optional<std::uint64_t> allocate(std::size_t requested_bytes, std::uint64_t stream) override;
  void free(std::uint64_t addr) override;
  std::size_t allocated_bytes() const noexcept override;
  std::size_t reserved_bytes() const noexcept override;
  PolicyCounters counters() const override;
  WasteBreakdown breakdown() const override;
  CallCosts call_costs() const noexcept override;
  void prepare(const Trace& trace) override;

  // Releases every unsplit cached block (torch.cuda.empty_cache()).
  void empty_cache();
  // The rounded size PyTorch gives a request.
  std::size_t round_size(std::size_t requested_bytes) const noexcept;
  const PytorchModelOptions& options() const noexcept;
  // Starts (or stops) recording segment events; recording clears the log.
  void record_segment_events(bool on);
  const std::vector<ModelSegmentEvent>& segment_events() const noexcept;
  // Aborts with a message if the model's structures are inconsistent (tests).
  void check_invariants() const;

  struct Model;

 private:
  std::string name_;
  std::unique_ptr<Model> model_;
};

}  // namespace gpumem::forensics
