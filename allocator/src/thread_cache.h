// ThreadCache: one thread's cache of blocks it freed recently, per engine, so that a thread that
// frees and allocates the same size again (the common case of a training step, and of a thread
// that allocates and frees its own buffers) needs neither the engine's lock nor its free index.
//
// A block enters the cache on free() only if its (stream, rounded size) is among the thread's 8
// most recent allocations, it has no record_stream uses, and the cache holds little (kPerBin blocks
// a size, kMaxCachedBytes in all). Cached blocks stay in the live-block table in state `cached`
// (so a second free is still caught as a double free); they were reported freed to observers
// (free_requested + free_completed) and are not counted as allocated.
//
// Invariants: every block in a bin is in state cached and has the bin's stream and size;
// cached_bytes == sum of the sizes in the bins.
//
// Thread-safety: the owning thread takes `lock` for each fast-path operation; the engine takes it
// (with its own lock held) to drain the cache: before it grows, and for every operation that must
// see all memory (empty_cache, the OOM retry, snapshots, totals, invariant checks). Lock order:
// engine mutex -> thread cache -> live-table shard.
#pragma once

#include <cstddef>
#include <cstdint>

#include "block.h"
#include "gpumem/alloc/spin_lock.h"

namespace gpumem::alloc::detail {

struct ThreadCache {
  static constexpr int kBins = 8;
  static constexpr int kPerBin = 4;
  static constexpr int kRecent = 8;
  static constexpr std::size_t kMaxCachedBytes = std::size_t{256} << 20;
  static constexpr std::size_t kMaxBlockBytes = std::size_t{128} << 20;

  struct Bin {
    StreamId stream = 0;
    std::size_t size_bytes = 0;
    int count = 0;
    Block* blocks[kPerBin] = {};
  };
  struct Recent {
    StreamId stream = 0;
    std::size_t size_bytes = 0;
  };

  SpinLock lock;
  Bin bins[kBins];
  Recent recent[kRecent];
  int recent_next = 0;
  std::size_t cached_bytes = 0;
  // Changes to the engine's allocated/requested byte counts made by fast paths, folded into the
  // engine's counters when the cache is drained.
  std::int64_t allocated_delta = 0;
  std::int64_t requested_delta = 0;

  void note_recent(StreamId stream, std::size_t size_bytes) noexcept {
    Recent& r = recent[recent_next];
    if (r.stream == stream && r.size_bytes == size_bytes) return;
    for (const Recent& x : recent)
      if (x.stream == stream && x.size_bytes == size_bytes) return;
    r = {stream, size_bytes};
    recent_next = (recent_next + 1) % kRecent;
  }
  bool is_recent(StreamId stream, std::size_t size_bytes) const noexcept {
    for (const Recent& x : recent)
      if (x.size_bytes == size_bytes && x.stream == stream) return true;
    return false;
  }
  // The bin a block of (stream, size) goes to, or null if every bin is busy with other sizes or
  // full.
  Bin* bin_for_push(StreamId stream, std::size_t size_bytes) noexcept {
    Bin* empty = nullptr;
    for (Bin& b : bins) {
      if (b.count > 0 && b.stream == stream && b.size_bytes == size_bytes) return b.count < kPerBin ? &b : nullptr;
      if (b.count == 0 && !empty) empty = &b;
    }
    if (empty) {
      empty->stream = stream;
      empty->size_bytes = size_bytes;
    }
    return empty;
  }
  // The lowest-addressed block of (stream, size): what best fit would pick among them, which keeps
  // regions compact.
  Block* pop(StreamId stream, std::size_t size_bytes) noexcept {
    for (Bin& b : bins) {
      if (b.count == 0 || b.size_bytes != size_bytes || b.stream != stream) continue;
      int low = 0;
      for (int i = 1; i < b.count; ++i)
        if (b.blocks[i]->addr < b.blocks[low]->addr) low = i;
      Block* out = b.blocks[low];
      b.blocks[low] = b.blocks[--b.count];
      return out;
    }
    return nullptr;
  }
  bool empty() const noexcept { return cached_bytes == 0; }
};

}  // namespace gpumem::alloc::detail
