// RankCountingCpuAllocator: c10's CPU allocator wrapped so that every allocation is charged to
// the rank whose thread made it, for measuring per-rank memory of thread ranks in one process.
//
// A rank thread declares itself with RankTag; allocations made while no tag is set are charged
// to nobody. A free is charged back to the rank that allocated, whichever thread frees. The
// counts are the bytes requested (what tensors asked for), live and peak, per rank.
//
// This is the allocator-level cross-check of ShardedTrainer::model_state_bytes() in CI, where
// gpumem's own CPU allocator stats (install_cpu) are not available to this module yet; it
// measures what was allocated, not what the trainer says it holds.
//
// Thread-safety: allocate and free are thread-safe (atomics, one mutex for the charge table);
// install()/uninstall() are not and must not race with allocations from other threads (tests call
// them between runs).
#pragma once

#include <c10/core/Allocator.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace gpumem::zero::testing {

class RankCountingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr int kMaxRanks = 16;

  static RankCountingCpuAllocator& instance();

  // Makes this the CPU allocator of c10 (wrapping the one in place) / puts the previous back.
  // Memory allocated while installed is still freed through this allocator afterwards.
  void install();
  void uninstall();
  bool installed() const { return installed_; }

  // Live and peak bytes charged to `rank`; reset_peak() sets peaks to the live values.
  std::int64_t live_bytes(int rank) const;
  std::int64_t peak_bytes(int rank) const;
  void reset_peak(int rank);

  // While alive, allocations by this thread are charged to `rank`.
  class RankTag {
   public:
    explicit RankTag(int rank);
    ~RankTag();
    RankTag(const RankTag&) = delete;
    RankTag& operator=(const RankTag&) = delete;

   private:
    int previous_;
  };

  c10::DataPtr allocate(std::size_t bytes) override;
  // Some ATen kernels allocate scratch memory through raw_allocate(), which needs a deleter of
  // the data pointer alone: charges are therefore kept in a table keyed by data pointer.
  c10::DeleterFnPtr raw_deleter() const override { return &free_charged; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  RankCountingCpuAllocator() = default;
  static void free_charged(void* data);
  void charge(int rank, std::int64_t bytes);

  c10::Allocator* base_ = nullptr;
  c10::DeleterFnPtr base_deleter_ = nullptr;
  bool installed_ = false;
  std::array<std::atomic<std::int64_t>, kMaxRanks> live_{};
  std::array<std::atomic<std::int64_t>, kMaxRanks> peak_{};
  struct Charge {
    std::int64_t bytes;
    int rank;
  };
  std::mutex mutex_;
  std::unordered_map<void*, Charge> charges_;  // by data pointer
};

}  // namespace gpumem::zero::testing
