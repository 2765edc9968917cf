// NativeHistoryRecorder: records the allocation history of libtorch's native CUDA caching
// allocator from a C++ program, the way torch.cuda.memory._record_memory_history does from
// Python, and writes it as the pickled snapshot torch.cuda.memory._dump_snapshot writes (read by
// `gpumem replay`, PyTorch's memory_viz and scripts/gpu/corpus/snapshot_csv.py), plus
// FILE.stats.json with the allocator's statistics.
//
// Used by the examples' --record-native-history FILE option (the corpus of real workloads,
// scripts/gpu/corpus/). Construct it before the model touches the device; call write() at the
// end. No stacks are recorded: a C++ program has no Python frames, and symbolizing C++ stacks
// for every entry costs minutes, so the trace's `where` column stays empty.
//
// Peaks: the statistics' peaks cover the whole run only if nothing resets them. A program that
// resets peak statistics calls note_peaks_before_reset() just before each reset; write() reports
// the largest peak seen, so FILE.stats.json still holds the whole run's peaks.
//
// Invariants: at most one recorder per process (the allocator's history is global); history is
// recorded from construction until write(). Not thread-safe: construct, note and write from one
// thread. Throws std::runtime_error when libtorch has no CUDA, no device is visible, or the
// active CUDA allocator is not the native one (gpumem installed, or
// PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#if GPUMEM_EXAMPLES_HAVE_CUDA_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#endif

namespace gpumem::examples {

class NativeHistoryRecorder {
 public:
  // A ring of this many entries never wraps in the examples' runs (a few hundred thousand
  // entries); the converter checks the trace holds fewer than this, i.e. nothing was dropped.
  static constexpr std::size_t kMaxEntries = 20'000'000;

  // Statistics are read from CUDA device `device` (the snapshot holds every device's trace).
  explicit NativeHistoryRecorder(std::string path, int device = 0)
      : path_(std::move(path)), device_(device) {
#if GPUMEM_EXAMPLES_HAVE_CUDA_TORCH
    namespace alloc = c10::cuda::CUDACachingAllocator;
    if (alloc::get() == nullptr || alloc::name() != "native") {
      throw std::runtime_error(
          "--record-native-history records PyTorch's native CUDA caching allocator, but the "
          "active CUDA allocator is '" +
          (alloc::get() == nullptr ? std::string("none") : alloc::name()) +
          "'; run with the native allocator (no gpumem install, no "
          "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)");
    }
    std::ofstream probe(path_, std::ios::binary | std::ios::trunc);
    if (!probe) {
      throw std::runtime_error("--record-native-history: cannot write '" + path_ +
                               "'; give a path in a writable directory");
    }
    // enabled "all": keep every entry; context nullopt: no stacks (see above).
    ::torch::cuda::_record_memory_history(std::optional<std::string>("all"),
                                        /*context=*/std::nullopt, /*stacks=*/"python", kMaxEntries);
#else
    throw std::runtime_error(
        "--record-native-history needs libtorch with CUDA; this example was built against a "
        "libtorch without it (or without the CUDA toolkit)");
#endif
  }

  NativeHistoryRecorder(const NativeHistoryRecorder&) = delete;
  NativeHistoryRecorder& operator=(const NativeHistoryRecorder&) = delete;

  const std::string& path() const { return path_; }

  // Remembers the device's current peaks before the program resets them.
  void note_peaks_before_reset() {
#if GPUMEM_EXAMPLES_HAVE_CUDA_TORCH
    const Peaks now = read_peaks();
    noted_.allocated = std::max(noted_.allocated, now.allocated);
    noted_.reserved = std::max(noted_.reserved, now.reserved);
    noted_.requested = std::max(noted_.requested, now.requested);
    ++resets_;
#endif
  }

  // Stops recording and writes the snapshot pickle to path() and the statistics to
  // path() + ".stats.json". Throws std::runtime_error if a file cannot be written.
  void write() {
#if GPUMEM_EXAMPLES_HAVE_CUDA_TORCH
    namespace alloc = c10::cuda::CUDACachingAllocator;
    using c10::CachingAllocator::StatType;
    const auto all = static_cast<std::size_t>(StatType::AGGREGATE);
    const std::string pickled = ::torch::cuda::_memory_snapshot_pickled();
    ::torch::cuda::_record_memory_history(/*enabled=*/std::optional<std::string>());  // stop
    write_file(path_, pickled);

    const c10::CachingDeviceAllocator::DeviceStats s =
        alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
    const Peaks now = read_peaks();
    char json[1024];
    std::snprintf(
        json, sizeof json,
        "{\n \"peak_allocated\": %lld,\n \"peak_reserved\": %lld,\n \"peak_requested\": %lld,\n"
        " \"num_alloc_retries\": %lld,\n \"num_ooms\": %lld,\n \"allocated_end\": %lld,\n"
        " \"reserved_end\": %lld,\n \"peak_resets_noted\": %d,\n \"max_entries\": %lld,\n"
        " \"device\": %d\n}\n",
        static_cast<long long>(std::max(noted_.allocated, now.allocated)),
        static_cast<long long>(std::max(noted_.reserved, now.reserved)),
        static_cast<long long>(std::max(noted_.requested, now.requested)),
        static_cast<long long>(s.num_alloc_retries), static_cast<long long>(s.num_ooms),
        static_cast<long long>(s.allocated_bytes[all].current),
        static_cast<long long>(s.reserved_bytes[all].current), resets_,
        static_cast<long long>(kMaxEntries), device_);
    write_file(path_ + ".stats.json", json);
#endif
  }

 private:
#if GPUMEM_EXAMPLES_HAVE_CUDA_TORCH
  struct Peaks {
    std::int64_t allocated = 0, reserved = 0, requested = 0;
  };
  Peaks read_peaks() const {
    using c10::CachingAllocator::StatType;
    const auto all = static_cast<std::size_t>(StatType::AGGREGATE);
    const auto s =
        c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
    return {s.allocated_bytes[all].peak, s.reserved_bytes[all].peak, s.requested_bytes[all].peak};
  }
  static void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("--record-native-history: writing '" + path + "' failed");
  }
  Peaks noted_;
  int resets_ = 0;
#endif
  std::string path_;
  int device_ = 0;
};

}  // namespace gpumem::examples
