// MemorySource: the only code in gpumem that talks to a memory provider.
//
// A source hands out two kinds of things:
//   * virtual address ranges (reserve / release), and
//   * physical pieces (create / destroy) that are mapped into, and unmapped from, reserved ranges
//     (map / unmap). A physical piece keeps its contents while unmapped and can be mapped again at
//     any other address: that is what physical page recycling builds on.
// This is the shape of the CUDA driver's virtual memory API (cuMemAddressReserve, cuMemCreate,
// cuMemMap + cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree).
//
// Sources without virtual memory (SourceCaps::virtual_memory == false, e.g. cudaMalloc) back the
// range at reserve() time; create/map/unmap then answer SourceStatus::unsupported and the engine
// treats every reserved range as one mapped segment.
//
// Contract:
//   * Sizes passed to reserve/create/map/unmap are multiples of caps().granularity_bytes, and
//     addresses passed to map/unmap lie inside a range returned by reserve().
//   * map() maps the whole piece (size_bytes == the piece's size) and makes it read/write
//     accessible; unmap() takes exactly what one map() mapped.
//   * A piece may be mapped at several addresses at once (aliases of the same physical memory; the
//     engine keeps a moved piece's old mapping instead of unmapping it). Each mapping is unmapped on
//     its own; destroy() needs every mapping of the piece gone.
//   * Failure is a value (SourceStatus); nothing throws. last_error() describes the most recent
//     failure in words (driver error names and the call that failed).
//
// Thread-safety: every implementation is safe to call from several threads. The engine calls a
// source without its engine lock held; the calls of one engine are serialized by its growth mutex
// (docs/notes/engine-locking.md), but several engines may share a source.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::alloc {

enum class SourceStatus : std::uint8_t {
  ok,
  out_of_memory,     // the provider has no physical memory (or address space) left
  fault_injected,    // a test asked for this call to fail (SimSource, HostVmmSource)
  unsupported,       // the source cannot do this (e.g. map on cudaMalloc, no driver present)
  invalid_argument,  // misaligned size/address, unknown handle, range not reserved here
  driver_error,      // any other provider failure; last_error() says which
};

const char* to_string(SourceStatus status) noexcept;

struct VaRange {
  std::uintptr_t base = 0;
  std::size_t size_bytes = 0;
  std::uintptr_t end() const noexcept { return base + size_bytes; }
  bool contains(std::uintptr_t addr) const noexcept { return addr >= base && addr < end(); }
};

// Opaque physical piece handle (CUmemGenericAllocationHandle on CUDA).
using PhysHandle = std::uint64_t;

template <class T>
struct SourceResult {
  SourceStatus status = SourceStatus::ok;
  T value{};
  bool ok() const noexcept { return status == SourceStatus::ok; }
};

struct SourceCaps {
  const char* name = "";               // "sim", "host_vmm", "cuda_vmm", "cuda_malloc"
  std::size_t granularity_bytes = 0;   // reserve/create/map sizes are multiples of this
  bool virtual_memory = false;         // reserve gives address space only; create+map back it
  bool host_accessible = false;        // the CPU may read and write mapped memory
  bool device_memory = false;          // memory lives on a GPU (needs stream ordering)
};

// Memory the provider reports (cudaMemGetInfo on CUDA; capacity accounting elsewhere).
struct ProviderMemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

class MemorySource {
 public:
  virtual ~MemorySource() = default;

  virtual SourceCaps caps() const noexcept = 0;

  // Reserves size_bytes of address space aligned to alignment_bytes (0 = granularity; otherwise a
  // power of two, else invalid_argument). On a
  // non-virtual-memory source the range is also backed and ready to use.
  virtual SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) = 0;
  // Returns a range from reserve(). Every piece mapped inside it must have been unmapped.
  virtual SourceStatus release(VaRange range) = 0;

  // Creates a physical piece of size_bytes (a multiple of the granularity).
  virtual SourceResult<PhysHandle> create(std::size_t size_bytes) = 0;
  // Destroys a piece that is not mapped anywhere.
  virtual SourceStatus destroy(PhysHandle handle) = 0;

  // Maps the whole piece at va (inside a reserved range) and makes it read/write accessible. The
  // piece may already be mapped elsewhere: this adds an alias.
  virtual SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) = 0;
  // Unmaps what one map() mapped at va. The piece stays alive and can be mapped again elsewhere.
  virtual SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) = 0;

  virtual ProviderMemInfo mem_info() const = 0;

  // Words for the most recent failure of this source (empty if none).
  virtual std::string last_error() const = 0;

  // The source's clock, in nanoseconds from an arbitrary origin; never goes backwards. The engine
  // times its calls with it (the recycle budget, docs/notes/allocation-policy.md). Default: the
  // steady clock. A simulated source may return simulated time (the replay: traced time plus the
  // modelled cost of the calls made), which keeps decisions that depend on time deterministic.
  virtual std::int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace gpumem::alloc
