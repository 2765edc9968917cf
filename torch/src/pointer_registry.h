// PointerRegistry: which engine owns an address, for frees that arrive with a bare pointer
// (c10's deleters get only the pointer) when several engines exist (one per CUDA device).
//
// Every range a memory source reserves for an engine is registered under the engine's index
// while it is reserved; RegisteringSource does that by wrapping the engine's source. Ranges never
// overlap (they come from one address space), so a lookup is a search for the last range starting
// at or below the address.
//
// Thread-safety: all members are safe to call concurrently (a shared mutex: lookups share it,
// reserve/release take it exclusively; those are rare and slow anyway).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>

#include "gpumem/alloc/forwarding_source.h"
#include "gpumem/alloc/memory_source.h"

namespace gpumem::torch::detail {

class PointerRegistry {
 public:
  void add(alloc::VaRange range, int owner);
  void remove(alloc::VaRange range);
  // The owner of the range holding addr, or -1.
  int owner_of(const void* addr) const;
  std::size_t ranges() const;

 private:
  struct Entry {
    std::size_t size_bytes;
    int owner;
  };
  mutable std::shared_mutex mutex_;
  std::map<std::uintptr_t, Entry> ranges_;  // base -> (size, owner)
};

// A MemorySource that forwards every call to inner, which it owns, and records its reserved ranges
// in registry under owner. registry must outlive it.
class RegisteringSource final : public alloc::ForwardingSource {
 public:
  RegisteringSource(std::unique_ptr<alloc::MemorySource> inner, PointerRegistry& registry, int owner);

  alloc::SourceResult<alloc::VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override;
  alloc::SourceStatus release(alloc::VaRange range) override;
  // The steady clock (MemorySource's), not the inner source's: the engines of the adapter run on
  // it whatever the device, a simulated one's SimSource (whose clock stands still) included.
  std::int64_t now_ns() const override { return MemorySource::now_ns(); }

  alloc::MemorySource& inner() noexcept { return *inner_; }

 private:
  std::unique_ptr<alloc::MemorySource> inner_;
  PointerRegistry& registry_;
  int owner_;
};

}  // namespace gpumem::torch::detail
