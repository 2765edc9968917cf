// BlockTable: the pinned allocator's live blocks (handed out, or freed and pending), by address.
//
// A record holds what jemalloc does not: the user's request, the streams that used the block
// (record_stream) and whether it is pending. 64 shards, each a hash map under a spin lock, so
// threads that allocate and free different blocks rarely meet.
//
// Invariants: a record's address is the start of a block jemalloc handed out and has not been
// given back; a pending record has been freed by the user exactly once.
// Thread-safety: all members may be called concurrently; copy() and find_containing() lock the
// shards one at a time (a consistent picture needs callers that are quiescent).
#pragma once

#include <array>
#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpumem/alloc/spin_lock.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::pinned::detail {

using StreamList = boost::container::small_vector<alloc::StreamId, 2>;

struct BlockRecord {
  std::size_t size_bytes = 0;       // jemalloc's size class, or the page-rounded size of a direct block
  std::size_t requested_bytes = 0;
  std::uint64_t alloc_seq = 0;      // seq of the alloc event (0 when nothing was recording)
  bool pending_free = false;
  bool direct = false;              // carved from the region table, not from the jemalloc arena
  StreamList streams;               // streams recorded with record_stream
};

enum class FreeAction : std::uint8_t {
  not_found,   // no record starts at the address
  already_pending,
  now,         // no stream used it: the record is gone, give the block back now
  deferred,    // streams used it: the record is pending until their markers complete
};

class BlockTable {
 public:
  void insert(std::uintptr_t addr, BlockRecord record);
  // The user frees addr: see FreeAction. *record receives the record (for now and deferred).
  FreeAction begin_free(std::uintptr_t addr, BlockRecord* record);
  // Adds stream to the record's uses; false if no live (non-pending) record starts at addr.
  // *pending is set when a pending record starts there.
  bool add_stream(std::uintptr_t addr, alloc::StreamId stream, bool* pending);
  // Removes the record starting at addr (a pending block whose markers completed).
  std::optional<BlockRecord> erase(std::uintptr_t addr);
  // The record whose block holds addr (its start or inside it). The start is one lookup; an
  // interior address scans every shard.
  std::optional<std::pair<std::uintptr_t, BlockRecord>> find_containing(std::uintptr_t addr) const;
  std::vector<std::pair<std::uintptr_t, BlockRecord>> copy() const;

 private:
  static constexpr std::size_t kShards = 64;
  struct alignas(64) Shard {
    mutable alloc::detail::SpinLock lock;
    std::unordered_map<std::uintptr_t, BlockRecord> records;
  };
  static std::size_t shard_of(std::uintptr_t addr) noexcept {
    return static_cast<std::size_t>(((addr >> 6) * 0x9E3779B97F4A7C15ull) >> 58);  // top 6 bits: 64 shards
  }
  std::array<Shard, kShards> shards_;
};

}  // namespace gpumem::pinned::detail
