// The CUDA memory sources and stream events. Built only with the CUDA toolkit (GPUMEM_HAVE_CUDA).
//
// CudaVmmSource: the driver's virtual memory API.
//   reserve = cuMemAddressReserve        release = cuMemAddressFree
//   create  = cuMemCreate (pinned device memory on the source's device)      destroy = cuMemRelease
//   map     = cuMemMap + cuMemSetAccess (read/write for the owning device)   unmap   = cuMemUnmap
//   granularity = cuMemGetAllocationGranularity (2 MiB on current GPUs)
// libcuda is never linked: every driver entry point is looked up at run time through cudart's
// cudaGetDriverEntryPointByVersion, so binaries load on machines without a driver. If the driver,
// a device, an entry point or virtual memory support is missing, construction still succeeds:
// init_status() says unsupported and every call answers that, with last_error() saying why.
// The source does not synchronize: the engine waits for the streams that touched a piece
// (StreamEvents::synchronize_stream) before it unmaps it.
//
// Exportable pieces (IPC, CudaVmmOptions::exportable, on by default as in PyTorch's expandable
// segments): pieces are created with a POSIX file descriptor handle type when the device supports
// it, and export_pieces() hands out their descriptors so another process can map them (see
// Note [IPC of pieces] in gpumem/alloc/cuda_ipc.h). If the driver refuses such pieces, the source
// creates plain ones and only export_pieces() fails, saying why.
//
// CudaMallocSource: classic cudaMalloc segments (caps().virtual_memory == false). reserve() backs
// the whole range with cudaMalloc, release() is cudaFree; create/map/unmap/destroy are unsupported.
// Granularity is 2 MiB, the size PyTorch rounds its cudaMalloc segments to.
//
// Both: CUDA_ERROR_OUT_OF_MEMORY / cudaErrorMemoryAllocation answer out_of_memory (the sticky
// runtime error is cleared); other failures answer driver_error with the error's name and the call.
// Misuse (unknown handle or range, unmapped va, destroy while mapped, misaligned sizes) answers
// invalid_argument without reaching the driver. Every call makes the source's device current and
// restores the caller's device afterwards.
//
// CudaStreamEvents: StreamEvents on cudaEvents created with cudaEventDisableTiming on one device,
// kept in a pool so record() does not create and release() does not destroy. The calls that can
// wait or cost (record, query, synchronize, synchronize_stream) are timed like the VMM source's
// driver calls (call_times(): host wall time of each call, steady_clock around it; the waits are
// the time the calling thread was blocked). A CUDA error in these
// calls (other than "not ready") means the context is broken or the caller passed a bad stream:
// it is reported on stderr and the process aborts.
//
// Thread-safety: all members of all three are safe to call concurrently (one mutex per object;
// the sources hold it across driver calls so their bookkeeping and the driver never disagree).
#pragma once

#if !defined(GPUMEM_HAVE_CUDA)
#error "gpumem/alloc/cuda_sources.h needs the CUDA build of gpumem_alloc (GPUMEM_HAVE_CUDA)"
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpumem/alloc/memory_source.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc {

// Time spent in one driver entry point (all calls, failed ones included).
struct CudaCallTime {
  std::uint64_t calls = 0;
  std::uint64_t total_ns = 0;
  std::uint64_t max_ns = 0;
  double mean_ns() const noexcept { return calls ? static_cast<double>(total_ns) / static_cast<double>(calls) : 0.0; }
};

struct CudaVmmCallTimes {
  CudaCallTime address_reserve, address_free, create, release, map, set_access, unmap;
};

// Time spent in the calls of CudaStreamEvents that can wait or cost.
struct CudaEventCallTimes {
  CudaCallTime record;              // cudaEventRecord (and cudaEventCreateWithFlags when the pool is empty)
  CudaCallTime query;               // cudaEventQuery
  CudaCallTime synchronize;         // cudaEventSynchronize: waits for one recorded event
  CudaCallTime synchronize_stream;  // cudaStreamSynchronize: waits for all work queued on a stream
};

struct CudaVmmOptions {
  // Create pieces exportable to other processes (POSIX file descriptors) where the device allows.
  bool exportable = true;
};

// A piece mapped in a CudaVmmSource, exported for another process.
struct ExportedPiece {
  std::uintptr_t va = 0;       // where it is mapped in this process
  std::size_t size_bytes = 0;  // the whole piece
  int fd = -1;                 // its exported descriptor; owned by the source, open until the piece is destroyed
};

class CudaVmmSource final : public MemorySource {
 public:
  explicit CudaVmmSource(int device, CudaVmmOptions options = {});
  // Unmaps, releases and frees whatever is still live (best effort; errors are ignored).
  ~CudaVmmSource() override;
  CudaVmmSource(const CudaVmmSource&) = delete;
  CudaVmmSource& operator=(const CudaVmmSource&) = delete;

  SourceCaps caps() const noexcept override;
  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override;
  SourceStatus release(VaRange range) override;
  SourceResult<PhysHandle> create(std::size_t size_bytes) override;
  SourceStatus destroy(PhysHandle handle) override;
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override;
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override;
  ProviderMemInfo mem_info() const override;  // cudaMemGetInfo on the device; zeros if unavailable
  std::string last_error() const override;

  // ok when the driver, the device and its virtual memory support were found.
  SourceStatus init_status() const noexcept;
  int device() const noexcept;
  CudaVmmCallTimes call_times() const;
  std::size_t physical_bytes() const;
  std::size_t mapped_bytes() const;

  // Whether the pieces created so far (and from now on) can be exported.
  bool exportable() const;
  // The pieces mapped over [va, va + size_bytes), in address order, each with its exported file
  // descriptor (exported on first request, kept open by the source until the piece is destroyed).
  // unsupported (with the reason in last_error) if pieces are not exportable; invalid_argument if
  // a byte of the range is not mapped by this source.
  SourceResult<std::vector<ExportedPiece>> export_pieces(std::uintptr_t va, std::size_t size_bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A cudaMalloc allocation shared through cudaIpcGetMemHandle.
struct CudaIpcMemHandle {
  std::uintptr_t allocation_base = 0;  // what cudaMalloc returned: the opened handle maps this address
  char bytes[64] = {};                 // cudaIpcMemHandle_t
};

class CudaMallocSource final : public MemorySource {
 public:
  explicit CudaMallocSource(int device);
  ~CudaMallocSource() override;  // cudaFree of every live range (best effort)
  CudaMallocSource(const CudaMallocSource&) = delete;
  CudaMallocSource& operator=(const CudaMallocSource&) = delete;

  SourceCaps caps() const noexcept override;
  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override;
  SourceStatus release(VaRange range) override;
  SourceResult<PhysHandle> create(std::size_t size_bytes) override;
  SourceStatus destroy(PhysHandle handle) override;
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override;
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override;
  ProviderMemInfo mem_info() const override;
  std::string last_error() const override;

  SourceStatus init_status() const noexcept;
  int device() const noexcept;
  std::size_t physical_bytes() const;  // bytes of live ranges

  // cudaIpcGetMemHandle of the allocation holding addr (a live range of this source);
  // invalid_argument if there is none.
  SourceResult<CudaIpcMemHandle> ipc_mem_handle(std::uintptr_t addr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class CudaStreamEvents final : public StreamEvents {
 public:
  explicit CudaStreamEvents(int device);
  ~CudaStreamEvents() override;  // destroys the pooled events (markers not released leak)
  CudaStreamEvents(const CudaStreamEvents&) = delete;
  CudaStreamEvents& operator=(const CudaStreamEvents&) = delete;

  EventToken record(StreamId stream) override;
  bool query(EventToken token) override;
  void synchronize(EventToken token) override;
  void release(EventToken token) override;
  void synchronize_stream(StreamId stream) override;

  std::size_t events_created() const;  // cudaEventCreate calls so far
  std::size_t events_pooled() const;   // created, not in use
  // Calls, total and longest host time of each timed call so far (each counter is read on its
  // own: a snapshot taken while calls run may mix a call's count with the previous total).
  CudaEventCallTimes call_times() const;

 private:
  // One timed call's counters; lock-free so that query() and synchronize() take no lock.
  struct AtomicCallTime {
    std::atomic<std::uint64_t> calls{0}, total_ns{0}, max_ns{0};
    void add(std::uint64_t ns) noexcept;
    CudaCallTime load() const noexcept;
  };

  int device_;
  AtomicCallTime record_time_, query_time_, sync_time_, sync_stream_time_;
  mutable std::mutex mutex_;
  std::vector<void*> pool_;  // cudaEvent_t ready for reuse
  std::size_t created_ = 0;
};

// Number of CUDA devices; 0 when there is no driver or no device (never fails).
int cuda_device_count() noexcept;

// A CudaVmmSource (vmm) or CudaMallocSource on device; never null. Without a usable driver or
// device its calls answer unsupported and last_error() says why.
std::unique_ptr<MemorySource> make_cuda_source(bool vmm, int device, CudaVmmOptions options = {});

}  // namespace gpumem::alloc
