// gpumem's c10::cuda::CUDACachingAllocator::CUDAAllocator (see gpumem/torch/cuda_allocator.h),
// install(), and the C functions for CUDAPluggableAllocator.
//
// One DeviceSlot per CUDA device holds the device's engine (created on first use), its private
// pools (graph_pools.h: CUDA graphs, MemPool) and the stack contexts of live blocks when
// _record_memory_history asks for them. Frees arrive with a bare pointer: with one engine and no
// pool it is that engine's; otherwise the pointer registry says whose (a device or a pool).
//
// Lock order: slots_mutex_ (engine creation only) -> engine's mutex; a device's pools mutex ->
// engines' locks (set_capturing / set_holding only); contexts_mutex is a leaf; hooks_mutex_ ->
// a DeviceEngine's trace_attach_mutex_ -> engine's mutex (sync_trace_observer), nothing else.
// No other lock of ours is held while calling the engine, a tracker or an OOM observer.
#include "gpumem/torch/cuda_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/ApproximateClock.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "c10_stats.h"
#include "cuda_ipc.h"
#include "current_device.h"
#include "format_size.h"
#include "device_engine.h"
#include "engines.h"
#include "graph_pools.h"
#include "gpumem/forensics/alloc_context.h"
#include "gpumem/forensics/python_stacks.h"
#include "gpumem/torch/c_api.h"
#include "gpumem/torch/install.h"
#include "pinned_loader.h"
#include "snapshot_ranges.h"

namespace gpumem::torch {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;

constexpr int kMaxDevices = 64;
constexpr std::size_t kOneExaByte = std::size_t{1} << 60;
// c10::SetAllocator replaces an entry only at a priority >= the current one; the native CUDA
// allocator registers at 0.
constexpr std::uint8_t kAllocatorPriority = 1;

alloc::StreamId stream_id(cudaStream_t stream) { return reinterpret_cast<alloc::StreamId>(stream); }
void* stream_ptr(alloc::StreamId stream) { return reinterpret_cast<void*>(stream); }

std::uint64_t steady_now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// Converts engine times (steady clock, ns) into the Unix microseconds PyTorch's snapshots carry.
struct UnixClock {
  std::int64_t offset_ns;
  UnixClock()
      : offset_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count() -
                  static_cast<std::int64_t>(steady_now_ns())) {}
  time_t unix_us(std::uint64_t steady_ns) const {
    return static_cast<time_t>((static_cast<std::int64_t>(steady_ns) + offset_ns) / 1000);
  }
};

constexpr const char* kCustomPoolAllocator =
    "torch.cuda.MemPool(allocator=...): a private pool whose memory comes from another allocator (for example "
    "ncclMemAlloc through a CUDAPluggableAllocator)";
constexpr const char* kPoolUseOnOom = "torch.cuda.MemPool(use_on_oom=True): a pool used as the last resort of an OOM";
constexpr const char* kPoolNoSplit = "torch.cuda.MemPool(no_split=True): a pool that never splits a segment";

cda::TraceEntry::Action to_action(alloc::EventKind kind, bool* known) {
  *known = true;
  switch (kind) {
    case alloc::EventKind::alloc: return cda::TraceEntry::ALLOC;
    case alloc::EventKind::free_requested: return cda::TraceEntry::FREE_REQUESTED;
    case alloc::EventKind::free_completed: return cda::TraceEntry::FREE_COMPLETED;
    case alloc::EventKind::segment_alloc: return cda::TraceEntry::SEGMENT_ALLOC;
    case alloc::EventKind::segment_free: return cda::TraceEntry::SEGMENT_FREE;
    case alloc::EventKind::segment_map: return cda::TraceEntry::SEGMENT_MAP;
    case alloc::EventKind::segment_unmap: return cda::TraceEntry::SEGMENT_UNMAP;
    case alloc::EventKind::snapshot: return cda::TraceEntry::SNAPSHOT;
    case alloc::EventKind::oom: return cda::TraceEntry::OOM;
    case alloc::EventKind::empty_cache: break;  // PyTorch's trace has no such action
  }
  *known = false;
  return cda::TraceEntry::SNAPSHOT;
}

// PyTorch's skip_actions names -> the trace ring's skip mask.
std::uint32_t skip_mask_from(const std::vector<std::string>& skip_actions) {
  std::uint32_t mask = 0;
  for (const auto& name : skip_actions) {
    static const std::pair<const char*, alloc::EventKind> kNames[] = {
        {"alloc", alloc::EventKind::alloc},
        {"free_requested", alloc::EventKind::free_requested},
        {"free_completed", alloc::EventKind::free_completed},
        {"segment_alloc", alloc::EventKind::segment_alloc},
        {"segment_free", alloc::EventKind::segment_free},
        {"segment_map", alloc::EventKind::segment_map},
        {"segment_unmap", alloc::EventKind::segment_unmap},
        {"snapshot", alloc::EventKind::snapshot},
        {"oom", alloc::EventKind::oom},
    };
    bool found = false;
    for (const auto& [text, kind] : kNames) {
      if (name == text) {
        mask |= forensics::skip_bit(kind);
        found = true;
      }
    }
    TORCH_CHECK(found, "gpumem: unknown skip_actions entry '", name,
                "'; valid entries: alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, "
                "segment_unmap, snapshot, oom");
  }
  return mask;
}

void raw_delete_fn(void* ptr);
void uncached_delete_fn(void* ptr);

struct DeviceSlot {
  std::unique_ptr<detail::DeviceEngine> de;
  std::unique_ptr<detail::GraphPools> pools;  // CUDA graphs' and MemPools' private pools
  std::atomic<bool> any_contexts{false};  // once true, frees look in contexts
  std::mutex contexts_mutex;
  std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> contexts;  // live blocks
};

// Makes the slot's device current for the scope (nothing for a simulated device).
struct SlotDeviceGuard {
  std::optional<c10::cuda::CUDAGuard> guard;
  explicit SlotDeviceGuard(const DeviceSlot& slot) {
    if (!slot.de->simulated) guard.emplace(static_cast<c10::DeviceIndex>(slot.de->device));
  }
};

class GpumemCudaAllocator final : public cca::CUDAAllocator {
 public:
  explicit GpumemCudaAllocator(Config config)
      : config_(std::move(config)), ipc_imports_(std::make_shared<detail::IpcImports>(detail::cuda_ipc_opener())) {}

  const Config& config() const noexcept { return config_; }

  // ---- c10::Allocator ----
  c10::DataPtr allocate(size_t n) override {
    const c10::DeviceIndex device = current_device();
    const c10::Device where(c10::DeviceType::CUDA, device);
    if (C10_UNLIKELY(!enabled_.load(std::memory_order_relaxed))) {
      void* p = uncached_allocate(n, device);
      return {p, p, &uncached_delete_fn, where};
    }
    void* p = n == 0 ? nullptr : malloc(device, n, c10::cuda::getCurrentCUDAStream(device).stream());
    return {p, p, &raw_delete_fn, where};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return enabled_.load(std::memory_order_relaxed) ? &raw_delete_fn : &uncached_delete_fn;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---- c10::DeviceAllocator ----
  bool initialized() override { return initialized_.load(); }

  void emptyCache(c10::MempoolId_t mempool_id) override {
    // PyTorch's release_cached_blocks: {0, 0} gives back the default pool's free memory and every
    // freeable private pool's; a pool's id only that pool's, if it is freeable. During a capture
    // nothing can be given back (the engines and pools do nothing then).
    const bool all = mempool_id == c10::MempoolId_t{0, 0};
    for_each_slot([&](DeviceSlot& slot) {
      SlotDeviceGuard guard(slot);
      if (all) slot.de->engine->empty_cache();
      slot.pools->empty_cache(mempool_id);
    });
  }

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device(device);
    if (DeviceSlot* slot = find_slot(device)) return detail::to_c10_stats(*slot->de);
    return detail::empty_c10_stats(config_.engine);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device(device);
    if (DeviceSlot* slot = find_slot(device)) slot->de->stats->reset_accumulated();
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device);
    if (DeviceSlot* slot = find_slot(device)) slot->de->stats->reset_peak();
  }

  // ---- CUDAAllocator ----
  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const c10::DeviceIndex device = current_device();
    if (C10_UNLIKELY(!enabled_.load(std::memory_order_relaxed))) return uncached_allocate(nbytes, device);
    return malloc(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    const c10::DeviceIndex device = current_device();
    if (C10_UNLIKELY(!enabled_.load(std::memory_order_relaxed))) return uncached_allocate(nbytes, device);
    return malloc(device, nbytes, stream);
  }

  void raw_delete(void* ptr) override {
    // While caching is disabled, pointers no engine owns came from cudaMalloc (uncached_allocate).
    if (C10_UNLIKELY(!enabled_.load(std::memory_order_relaxed)) && detail::pointer_registry().owner_of(ptr) < 0) {
      uncached_delete_fn(ptr);
      return;
    }
    free(ptr);
  }

  void init(int device_count) override {
    TORCH_CHECK(device_count >= 0 && device_count <= kMaxDevices, "gpumem supports up to ", kMaxDevices,
                " CUDA devices; this process sees ", device_count, ". Limit them with CUDA_VISIBLE_DEVICES.");
    device_count_.store(device_count);
    initialized_.store(true);
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    check_device(device);
    if (DeviceSlot* slot = find_slot(device)) return slot->de->engine->memory_fraction();
    return config_.engine.per_process_memory_fraction;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "gpumem: invalid memory fraction ", fraction,
                "; set a value within [0, 1]");
    check_device(device);
    DeviceSlot& slot = slot_for(device);
    slot.de->engine->set_memory_fraction(fraction);
    for (const auto& entry : slot.pools->pools()) entry.pool->engine->set_memory_fraction(fraction);
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    check_device(device);
    std::vector<cca::StreamSegmentSize> sizes;
    if (DeviceSlot* slot = find_slot(device)) {
      auto add = [&](const alloc::CachingAllocator& engine) {
        for (const auto& region : engine.expandable_region_sizes())
          sizes.emplace_back(static_cast<cudaStream_t>(stream_ptr(region.stream)), region.is_small_pool,
                             region.mapped_bytes);
      };
      add(*slot->de->engine);
      for (const auto& entry : slot->pools->pools()) add(*entry.pool->engine);  // PyTorch lists pools' too
    }
    return sizes;
  }

  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    check_device(device);
    DeviceSlot& slot = slot_for(device);
    size_t guess = *largestBlock;
    if (guess == 0) {
      // PyTorch's meaning: with no hint, the device's free memory is the first guess (it is
      // what growing could still get).
      guess = slot.de->source->mem_info().free_bytes;
      const alloc::EngineTotals totals = slot.de->engine->totals();
      if (totals.cap_bytes != alloc::kNoLimit)
        guess = std::min(guess, totals.cap_bytes > totals.reserved_bytes ? totals.cap_bytes - totals.reserved_bytes : 0);
    }
    *largestBlock = std::max(guess, slot.de->engine->largest_free_block_bytes());
    for (const auto& entry : slot.pools->pools())  // as PyTorch, the private pools' cached blocks count
      *largestBlock = std::max(*largestBlock, entry.pool->engine->largest_free_block_bytes());
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    const Owner owner = owner_of(ptr);
    std::optional<alloc::BlockLookup> found;
    if (owner.engine) found = owner.engine->lookup(ptr);
    TORCH_CHECK(found.has_value(), "gpumem: getBaseAllocation: ", ptr,
                " is not the start of a live gpumem allocation (was the tensor made by another allocator?)");
    if (size) *size = found->segment_size_bytes;
    return reinterpret_cast<void*>(found->segment_base);
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // PyTorch's allocator ignores pointers it did not make (from_blob, other allocators).
    if (!ptr.get() || ptr.get_deleter() != &raw_delete_fn) return;
    record_stream(ptr.get(), stream.stream());
  }

  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;

  // ---- private pools (graph_pools.h; defined below)
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected_live_allocations) override;

  // CUDA IPC (torch.multiprocessing): see Note [IPC of pieces] in docs/notes/cuda-ipc.md.
  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    DeviceSlot* slot = slot_of(ptr);
    TORCH_CHECK(slot != nullptr, "gpumem: shareIpcHandle: ", ptr,
                " is not memory gpumem allocated (a tensor from another allocator?)");
    auto shared = detail::share_block(*slot->de, ptr);
    if (auto* why = std::get_if<std::string>(&shared))
      TORCH_CHECK(false, "gpumem: cannot share the CUDA tensor at ", ptr, " with another process: ", *why);
    auto& share = std::get<detail::IpcShare>(shared);
    return {share.offset_bytes, std::move(share.handle)};
  }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    const std::string malformed = detail::check_ipc_handle(handle);
    TORCH_CHECK(malformed.empty(), malformed);
    auto opened = ipc_imports_->get(handle, c10::cuda::current_device());
    if (auto* why = std::get_if<std::string>(&opened)) TORCH_CHECK(false, *why);
    return std::get<std::shared_ptr<void>>(std::move(opened));
  }

  bool isHistoryEnabled() override { return record_history_.load(); }

  void recordHistory(bool enabled, cda::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cda::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
    const std::uint32_t mask = skip_mask_from(skip_actions);
    std::lock_guard lock(hooks_mutex_);
    record_history_.store(enabled);
    record_context_.store(enabled ? static_cast<int>(when) : static_cast<int>(cda::RecordContext::NEVER));
    context_recorder_.store(enabled ? context_recorder : nullptr);
    trace_settings_.capacity = enabled ? alloc_trace_max_entries : 0;
    trace_settings_.skip_mask = mask;
    trace_settings_.contexts = enabled && when >= cda::RecordContext::ALLOC;
    const bool clear = !enabled || clearHistory;
    if (clear) annotations_.clear();
    for_each_slot([&](DeviceSlot& slot) {
      slot.de->trace->configure(trace_settings_, clear);
      slot.de->sync_trace_observer();
    });
  }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    if (!record_history_.load()) return;
    Annotation annotation;
    annotation.device = c10::cuda::device_count() > 0 ? c10::cuda::current_device() : 0;
    annotation.t_ns = steady_now_ns();
    annotation.metadata = md;
    std::lock_guard lock(hooks_mutex_);
    annotations_.push_back(std::move(annotation));
  }

  void pushCompileContext(std::string& md) override {
    if (!record_history_.load()) return;
    std::lock_guard lock(hooks_mutex_);
    compile_contexts_.push_back(md);
    for_each_slot([&](DeviceSlot& slot) { slot.de->trace->push_compile_context(md); });
  }

  void popCompileContext() override {
    if (!record_history_.load()) return;
    std::lock_guard lock(hooks_mutex_);
    if (!compile_contexts_.empty()) compile_contexts_.pop_back();
    for_each_slot([](DeviceSlot& slot) { slot.de->trace->pop_compile_context(); });
  }

  void setUserMetadata(const std::string& metadata) override {
    std::lock_guard lock(hooks_mutex_);
    user_metadata_ = metadata;
    for_each_slot([&](DeviceSlot& slot) { slot.de->trace->set_user_metadata(metadata); });
  }

  std::string getUserMetadata() override {
    std::lock_guard lock(hooks_mutex_);
    return user_metadata_;
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard lock(hooks_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) override {
    std::lock_guard lock(hooks_mutex_);
    trackers_.push_back(tracker);
    for_each_slot([&](DeviceSlot& slot) {
      slot.de->trace->add_hook(tracker_hook(tracker));
      slot.de->sync_trace_observer();
    });
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    check_device(dev);
    check_device(dev_to_access);
    c10::cuda::CUDAGuard guard(dev);
    const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();  // clear the sticky error
    } else {
      C10_CUDA_CHECK(err);
    }
    if (config_.adapter.source == SourceKind::cuda_vmm) {
      TORCH_WARN_ONCE("gpumem: peer access from device ", static_cast<int>(dev), " to device ",
                      static_cast<int>(dev_to_access),
                      " is enabled for cudaMalloc memory only; memory gpumem maps with the driver's virtual memory API "
                      "(source:cuda_vmm) stays private to its device. Cross-device copies still work "
                      "(cudaMemcpyPeerAsync); kernels that read another device's tensors directly need "
                      "source:cuda_malloc in GPUMEM_ALLOC_CONF.");
    }
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool /*p2p_enabled*/) override {
    // Memory mapped with cuMemMap is not covered by cudaDeviceEnablePeerAccess, so plain
    // cudaMemcpyAsync across devices can fail even with P2P on; the peer copy always works.
    if (dstDevice == srcDevice) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> state) override;

  std::string name() override { return "gpumem"; }

  // ---- gpumem ----
  void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream);
  // malloc's other calls: a stack context to record, a capture underway, a refused request (the
  // main engine's result in `failed`), all of which the common call leaves to it.
  void* malloc_attached(DeviceSlot& slot, c10::DeviceIndex device, size_t size, cudaStream_t stream,
                        std::optional<alloc::AllocResult> failed);
  // Whether an allocation of `size` on slot's device gathers a stack context first.
  bool records_context(const DeviceSlot& slot, size_t size) const noexcept {
    return record_context_.load(std::memory_order_relaxed) >= static_cast<int>(cda::RecordContext::STATE) ||
           slot.de->wants_python_stack(size);
  }
  static void report_alloc_to_profiler(DeviceSlot& slot, const alloc::AllocResult& result, c10::DeviceIndex device);
  alloc::AllocResult allocate_during_capture(DeviceSlot& slot, size_t size, cudaStream_t stream,
                                             std::shared_ptr<detail::PrivatePool>& pool);
  // The device's allocated and reserved bytes, its private pools included (for the profiler).
  static std::pair<std::size_t, std::size_t> device_totals(DeviceSlot& slot);
  void free(void* ptr);
  // free's other calls: several devices, private pools, stack contexts, the profiler.
  void free_attached(void* ptr);
  [[noreturn]] static void raise_bad_free(void* ptr, alloc::FreeStatus status);
  void record_stream(void* ptr, cudaStream_t stream);
  DeviceSlot* find_slot(int device) const noexcept {
    return device >= 0 && device < kMaxDevices ? slots_[device].load(std::memory_order_acquire) : nullptr;
  }

 private:
  struct Annotation {
    int device = 0;
    std::uint64_t t_ns = 0;
    std::vector<std::pair<std::string, std::string>> metadata;
  };

  // The calling thread's current CUDA device, as c10::cuda::current_device() answers, without
  // asking when one device is visible (current_device.h: the question costs microseconds when
  // threads ask at once).
  c10::DeviceIndex current_device() const {
    return detail::current_device_of(device_count_.load(std::memory_order_relaxed),
                                     [] { return c10::cuda::current_device(); });
  }

  void check_device(c10::DeviceIndex device) const {
    const int count = device_count_.load();
    TORCH_CHECK(device >= 0 && device < kMaxDevices && (count == 0 || device < count), "gpumem: invalid CUDA device ",
                static_cast<int>(device), " (this process sees ", count, " devices)");
  }

  DeviceSlot& slot_for(c10::DeviceIndex device) {
    DeviceSlot* slot = find_slot(device);
    return C10_LIKELY(slot != nullptr) ? *slot : create_slot(device);
  }
  DeviceSlot& create_slot(c10::DeviceIndex device);

  // The slot whose engine owns ptr, or null.
  DeviceSlot* slot_of(const void* ptr) const { return owner_of(ptr).slot; }

  // Who owns ptr: a device's main engine (pool null) or one of its private pools; slot null if
  // nobody. The pool, if any, stays alive while the Owner does.
  struct Owner {
    DeviceSlot* slot = nullptr;
    std::shared_ptr<detail::PrivatePool> pool;
    alloc::CachingAllocator* engine = nullptr;
  };
  Owner owner_of(const void* ptr) const {
    Owner o;
    DeviceSlot* only = only_slot_.load(std::memory_order_acquire);
    if (only != nullptr && C10_LIKELY(detail::pool_count() == 0)) {
      o.slot = only;
    } else {
      const int owner = detail::pointer_registry().owner_of(ptr);
      if (owner >= detail::kFirstPoolOwner) {
        o.pool = detail::find_pool(owner);
        if (o.pool) o.slot = find_slot(o.pool->device);
      } else if (owner >= 0) {
        o.slot = find_slot(owner);
      }
    }
    if (o.slot) o.engine = o.pool ? o.pool->engine.get() : o.slot->de->engine.get();
    return o;
  }
  detail::GraphPools& pools_of(c10::DeviceIndex device) {
    check_device(device);
    return *slot_for(device).pools;
  }

  template <class F>
  void for_each_slot(F&& f) {
    for (int d = 0; d < kMaxDevices; ++d)
      if (DeviceSlot* slot = find_slot(d)) f(*slot);
  }

  forensics::TraceRing::Hook tracker_hook(cda::AllocatorTraceTracker tracker) {
    return [tracker = std::move(tracker)](const forensics::TraceRecord& record) {
      bool known = false;
      const auto action = to_action(record.event.kind, &known);
      if (!known) return;
      cda::TraceEntry entry(action, static_cast<c10::DeviceIndex>(record.event.device),
                            action == cda::TraceEntry::OOM ? record.device_free_bytes() : record.event.addr,
                            record.event.size_bytes, stream_ptr(record.event.stream), c10::MempoolId_t{0, 0},
                            c10::getApproximateTime(),
                            std::static_pointer_cast<c10::GatheredContext>(record.stack_context()),
                            record.compile_context(), record.user_metadata());
      tracker(entry);
    };
  }

  void* uncached_allocate(size_t n, c10::DeviceIndex device) {
    if (n == 0) return nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, n < kOneExaByte, "CUDA out of memory. Tried to allocate more than 1EB memory.");
    c10::cuda::CUDAGuard guard(device);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, n);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ",
                       detail::format_size(n), " on GPU ", static_cast<int>(device),
                       " with caching disabled (torch.cuda.memory.caching_allocator_enable(False)).");
    }
    C10_CUDA_CHECK(err);
    return p;
  }

  [[noreturn]] void raise_oom(DeviceSlot& slot, size_t size, const alloc::OomInfo& oom, cudaStream_t stream,
                              const detail::PrivatePool* pool);

  const Config config_;
  // Memory of other processes this one opened (getIpcDevPtr), shared by handle.
  const std::shared_ptr<detail::IpcImports> ipc_imports_;
  std::array<std::atomic<DeviceSlot*>, kMaxDevices> slots_{};
  std::atomic<DeviceSlot*> only_slot_{nullptr};  // set while exactly one slot exists
  std::mutex slots_mutex_;
  std::atomic<int> device_count_{0};
  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};

  std::atomic<bool> record_history_{false};
  std::atomic<int> record_context_{static_cast<int>(cda::RecordContext::NEVER)};
  std::atomic<cda::CreateContextFn> context_recorder_{nullptr};

  mutable std::mutex hooks_mutex_;  // guards everything below
  forensics::TraceSettings trace_settings_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cda::AllocatorTraceTracker> trackers_;
  std::vector<Annotation> annotations_;
  std::vector<std::string> compile_contexts_;
  std::string user_metadata_;
  UnixClock clock_;
};

std::atomic<GpumemCudaAllocator*> g_allocator{nullptr};
std::atomic<bool> g_installed{false};

std::mutex& install_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

void raw_delete_fn(void* ptr) { g_allocator.load(std::memory_order_acquire)->free(ptr); }

void uncached_delete_fn(void* ptr) {
  if (ptr) C10_CUDA_CHECK(cudaFree(ptr));
}

// Waits for all work on a device (a private pool's pieces are unmapped only once no replay, on
// any stream, can still use them). Called by the engine without its locks; a failure means the
// CUDA context is unusable, as in CudaStreamEvents.
void synchronize_device(int device) {
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != device) err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (current >= 0 && current != device) (void)cudaSetDevice(current);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gpumem: cudaDeviceSynchronize on device %d failed before releasing a private pool: %s. "
                 "The CUDA context is unusable.\n", device, cudaGetErrorString(err));
    std::abort();
  }
}

DeviceSlot& GpumemCudaAllocator::create_slot(c10::DeviceIndex device) {
  std::lock_guard lock(slots_mutex_);
  if (DeviceSlot* slot = find_slot(device)) return *slot;
  std::string error;
  auto de = detail::make_cuda_engine(config_, device, detail::pointer_registry(), &error);
  TORCH_CHECK(de != nullptr, error);
  auto* slot = new DeviceSlot();  // never destroyed: deleters of live tensors point here
  slot->de = std::move(de);
  std::function<void()> sync_device;
  if (!slot->de->simulated) sync_device = [d = slot->de->device] { synchronize_device(d); };
  slot->pools = std::make_unique<detail::GraphPools>(*slot->de, detail::pointer_registry(), std::move(sync_device));
  // gpumem's own snapshots and OOM postmortems hold the private pools' segments too, tagged.
  slot->de->pool_engines = [pools = slot->pools.get()] { return pools->engine_views(); };
  if (slot->de->forensics) slot->de->forensics->set_pool_engines(slot->de->pool_engines);
  {
    std::lock_guard hooks(hooks_mutex_);
    slot->de->trace->configure(trace_settings_.capacity > 0 ? trace_settings_ : detail::trace_settings_from(config_),
                               /*clear=*/true);
    slot->de->trace->set_user_metadata(user_metadata_);
    for (const auto& context : compile_contexts_) slot->de->trace->push_compile_context(context);
    for (const auto& tracker : trackers_) slot->de->trace->add_hook(tracker_hook(tracker));
    slot->de->sync_trace_observer();
  }
  int existing = 0;
  for (int d = 0; d < kMaxDevices; ++d) existing += find_slot(d) != nullptr;
  slots_[device].store(slot, std::memory_order_release);
  only_slot_.store(existing == 0 ? slot : nullptr, std::memory_order_release);
  return *slot;
}

void* GpumemCudaAllocator::malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
  TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte, "CUDA out of memory. Tried to allocate more than 1EB memory.");
  DeviceSlot& slot = slot_for(device);
  // The common call: nothing records stacks, no capture, the engine serves it, no profiler.
  // Everything else goes to malloc_attached; a refused request goes there with the engine's
  // answer (the retry and the OOM), so the engine is not asked twice.
  if (C10_LIKELY(!records_context(slot, size) && !slot.pools->capturing())) {
    alloc::AllocResult result = slot.de->engine->allocate(size, stream_id(stream));
    if (C10_LIKELY(result.ok())) {
      if (C10_UNLIKELY(c10::memoryProfilingEnabled())) report_alloc_to_profiler(slot, result, device);
      return result.ptr;
    }
    return malloc_attached(slot, device, size, stream, std::move(result));
  }
  return malloc_attached(slot, device, size, stream, std::nullopt);
}

void* GpumemCudaAllocator::malloc_attached(DeviceSlot& slot, c10::DeviceIndex device, size_t size, cudaStream_t stream,
                                           std::optional<alloc::AllocResult> failed) {
  // With _record_memory_history(context=...), or python_stacks for an allocation of at least
  // python_stacks_min_kb, the stack is gathered before the engine call (no lock is held) and
  // handed to the trace ring and gpumem's forensics through the thread (the OOM record too); blocks
  // keep it while live.
  std::shared_ptr<c10::GatheredContext> context;
  std::optional<forensics::AllocContext::Scope> context_scope;
  const bool recording = !failed.has_value() && records_context(slot, size);
  if (recording) {
    if (auto recorder = context_recorder_.load()) context = recorder();
    if (context == nullptr && slot.de->wants_python_stack(size)) context = forensics::gather_python_stack();
    context_scope.emplace(context);
  }
  alloc::AllocResult result;
  std::shared_ptr<detail::PrivatePool> pool;
  const bool during_capture = !failed.has_value() && slot.pools->capturing();
  if (during_capture) {
    result = allocate_during_capture(slot, size, stream, pool);
  } else {
    // The main engine; malloc's common call already asked it once.
    result = failed.has_value() ? std::move(*failed) : slot.de->engine->allocate(size, stream_id(stream));
    // PyTorch's last retry also gives back the free memory of released private pools.
    if (C10_UNLIKELY(!result.ok()) && slot.pools->empty_cache({0, 0}) > 0)
      result = slot.de->engine->allocate(size, stream_id(stream));
  }
  if (recording && context != nullptr && result.ok()) {
    std::lock_guard lock(slot.contexts_mutex);
    slot.contexts[reinterpret_cast<std::uintptr_t>(result.ptr)] = std::move(context);
    slot.any_contexts.store(true, std::memory_order_relaxed);
  }
  if (C10_UNLIKELY(!result.ok())) raise_oom(slot, size, *result.oom, stream, pool.get());
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) report_alloc_to_profiler(slot, result, device);
  return result.ptr;
}

void GpumemCudaAllocator::report_alloc_to_profiler(DeviceSlot& slot, const alloc::AllocResult& result,
                                                   c10::DeviceIndex device) {
  const auto [allocated, reserved] = device_totals(slot);
  c10::reportMemoryUsageToProfiler(result.ptr, static_cast<int64_t>(result.size_bytes), allocated, reserved,
                                   c10::Device(c10::DeviceType::CUDA, device));
}

alloc::AllocResult GpumemCudaAllocator::allocate_during_capture(DeviceSlot& slot, size_t size, cudaStream_t stream,
                                                                std::shared_ptr<detail::PrivatePool>& pool) {
  // Captures (or use_mem_pool contexts) are underway on this device: the first filter that accepts
  // the stream names the pool. Growth maps memory with the driver (or cudaMalloc's) calls, which a
  // capture in "global" mode forbids on every thread; PyTorch relaxes the mode around cudaMalloc
  // the same way.
  pool = slot.pools->route(stream_id(stream));
  alloc::CachingAllocator& engine = pool ? *pool->engine : *slot.de->engine;
  std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed;
  if (!slot.de->simulated) relaxed.emplace(cudaStreamCaptureModeRelaxed);
  return engine.allocate(size, stream_id(stream));
}

std::pair<std::size_t, std::size_t> GpumemCudaAllocator::device_totals(DeviceSlot& slot) {
  const alloc::EngineTotals main = slot.de->engine->totals();
  std::pair<std::size_t, std::size_t> sum{main.allocated_bytes, main.reserved_bytes};
  if (detail::pool_count() != 0)
    for (const auto& entry : slot.pools->pools()) {
      const alloc::EngineTotals t = entry.pool->engine->totals();
      sum.first += t.allocated_bytes;
      sum.second += t.reserved_bytes;
    }
  return sum;
}

void GpumemCudaAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  // The common call: one device, no private pool, no stack contexts, no profiler.
  DeviceSlot* only = only_slot_.load(std::memory_order_acquire);
  if (C10_LIKELY(only != nullptr && detail::pool_count() == 0 && !only->any_contexts.load(std::memory_order_relaxed) &&
                 !c10::memoryProfilingEnabled())) {
    const alloc::FreeStatus status = only->de->engine->free(ptr);
    if (C10_LIKELY(status == alloc::FreeStatus::ok)) return;
    raise_bad_free(ptr, status);
  }
  free_attached(ptr);
}

void GpumemCudaAllocator::raise_bad_free(void* ptr, alloc::FreeStatus status) {
  TORCH_CHECK(false, "gpumem: cannot free ", ptr, ": ", alloc::describe(status));
}

void GpumemCudaAllocator::free_attached(void* ptr) {
  const Owner owner = owner_of(ptr);  // a device's engine or one of its private pools
  DeviceSlot* slot = owner.slot;
  TORCH_CHECK(slot != nullptr, "gpumem: free of ", ptr,
              ", which is not memory gpumem allocated (a tensor from another allocator was handed to gpumem's "
              "deleter, or the pointer is corrupt)");
  alloc::CachingAllocator& engine = *owner.engine;
  if (C10_UNLIKELY(slot->any_contexts.load(std::memory_order_relaxed))) {
    std::lock_guard lock(slot->contexts_mutex);
    slot->contexts.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  const bool profiling = c10::memoryProfilingEnabled();
  std::size_t block_bytes = 0;
  if (C10_UNLIKELY(profiling)) {
    if (auto found = engine.lookup(ptr)) block_bytes = found->block_size_bytes;
  }
  alloc::FreeStatus status;
  if (C10_UNLIKELY(only_slot_.load(std::memory_order_relaxed) == nullptr)) {
    // Several devices: the engine may record events on this device's streams.
    SlotDeviceGuard guard(*slot);
    status = engine.free(ptr);
  } else {
    status = engine.free(ptr);
  }
  if (C10_UNLIKELY(status != alloc::FreeStatus::ok)) raise_bad_free(ptr, status);
  if (C10_UNLIKELY(profiling)) {
    const auto [allocated, reserved] = device_totals(*slot);
    c10::reportMemoryUsageToProfiler(ptr, -static_cast<int64_t>(block_bytes), allocated, reserved,
                                     c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(slot->de->device)));
  }
}

void GpumemCudaAllocator::record_stream(void* ptr, cudaStream_t stream) {
  const Owner owner = owner_of(ptr);
  TORCH_CHECK(owner.slot != nullptr, "gpumem: record_stream on ", ptr, ", which is not memory gpumem allocated");
  const alloc::FreeStatus status = owner.engine->record_stream(ptr, stream_id(stream));
  TORCH_CHECK(status == alloc::FreeStatus::ok, "gpumem: record_stream on ", ptr, ": ", alloc::describe(status));
}

void GpumemCudaAllocator::raise_oom(DeviceSlot& slot, size_t size, const alloc::OomInfo& oom, cudaStream_t stream,
                                    const detail::PrivatePool* pool) {
  const int device = slot.de->device;
  const std::size_t device_free = oom.provider.free_bytes;
  const std::size_t device_total = oom.provider.total_bytes;

  // The OOM trace entry: the engine's oom event with the provider's free bytes (PyTorch's entry).
  alloc::AllocEvent event;
  event.kind = alloc::EventKind::oom;
  event.pool = oom.pool;
  event.device = static_cast<std::int8_t>(device);
  event.size_bytes = oom.rounded_bytes;
  event.requested_bytes = size;
  event.stream = stream_id(stream);
  event.t_ns = steady_now_ns();
  slot.de->trace->record_oom(event, device_free);

  const c10::Device where(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), oom.allocated_bytes, oom.reserved_bytes, where);

  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard lock(hooks_mutex_);
    observers = oom_observers_;
  }
  const std::size_t allowed = oom.cap_bytes != alloc::kNoLimit ? oom.cap_bytes : device_total;
  for (const auto& observer : observers) observer(device, oom.rounded_bytes, allowed, device_free);

  using detail::format_size;
  std::string message = "CUDA out of memory. Tried to allocate " + format_size(oom.rounded_bytes) + ". GPU " +
                        std::to_string(device) + " has a total capacity of " + format_size(device_total) +
                        " of which " + format_size(device_free) + " is free. ";
  if (device_total >= device_free)
    message += "Including non-PyTorch memory, this process has " + format_size(device_total - device_free) +
               " memory in use. ";
  if (oom.cap_bytes != alloc::kNoLimit) message += format_size(oom.cap_bytes) + " allowed; ";
  const std::size_t unallocated = oom.reserved_bytes > oom.allocated_bytes ? oom.reserved_bytes - oom.allocated_bytes : 0;
  message += "Of the allocated memory " + format_size(oom.allocated_bytes) + " is allocated by PyTorch, and " +
             format_size(unallocated) + " is reserved by PyTorch but unallocated. ";
  std::string reason = alloc::describe(oom);
  if (!reason.empty() && reason.back() != '.') reason += '.';
  message += "gpumem: " + reason + " ";
  if (pool != nullptr)
    message += "The request was made during a CUDA graph capture or a use_mem_pool context and went to private "
               "pool " + detail::to_string(pool->id) + ", which cannot use the memory other pools cache; memory "
               "cannot be given back while a capture is underway. ";
  if (oom.cap_reached)
    message += "The cap comes from torch.cuda.set_per_process_memory_fraction or the per_process_memory_fraction / "
               "memory_limit_mb settings in GPUMEM_ALLOC_CONF: raise it, or free tensors. ";
  // The postmortem (oom_report_dir): snapshot and report of this moment, named in the message.
  if (slot.de->forensics)
    if (auto files = slot.de->forensics->on_oom(oom)) message += files->message + " ";
  message +=
      "See documentation for Memory Management "
      "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";
  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
}

cca::SnapshotInfo GpumemCudaAllocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  // {0, 0}: every segment of every device, each tagged with its pool ({0, 0} for the default pool,
  // as PyTorch tags them); a pool's id: that pool's segments only. Traces are the devices' (pools
  // share their device's trace).
  const bool all_pools = mempool_id == c10::MempoolId_t{0, 0};
  cca::SnapshotInfo info;
  int devices = device_count_.load();
  for (int d = 0; d < kMaxDevices; ++d)
    if (find_slot(d)) devices = std::max(devices, d + 1);
  info.device_traces.resize(static_cast<std::size_t>(devices));

  for_each_slot([&](DeviceSlot& slot) {
    const int device = slot.de->device;
    std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> contexts;
    {
      std::lock_guard lock(slot.contexts_mutex);
      contexts = slot.contexts;
    }
    std::vector<std::pair<c10::MempoolId_t, alloc::CachingAllocator*>> engines;
    if (all_pools) engines.emplace_back(c10::MempoolId_t{0, 0}, slot.de->engine.get());
    const auto pools = slot.pools->pools();  // keeps them alive while they are read
    for (const auto& entry : pools)
      if (all_pools || entry.id == mempool_id) engines.emplace_back(entry.id, entry.pool->engine.get());
    for (const auto& [pool_id, engine] : engines) {
      for (const auto& segment : engine->snapshot().segments) {
        for (const auto& run : detail::mapped_runs(segment)) {
          cda::SegmentInfo& si = info.segments.emplace_back();
          si.device = static_cast<c10::DeviceIndex>(device);
          si.address = run.base;
          si.total_size = run.size_bytes;
          si.requested_size = run.requested_bytes;
          si.allocated_size = run.allocated_bytes;
          si.active_size = run.active_bytes;
          si.stream = stream_ptr(segment.stream);
          si.is_large = segment.pool == alloc::PoolKind::large;
          si.is_expandable = segment.expandable;
          si.owner_private_pool_id = pool_id;
          for (const auto& block : run.blocks) {
            cda::BlockInfo& bi = si.blocks.emplace_back();
            bi.size = block.size_bytes;
            bi.requested_size = block.requested_bytes;
            bi.allocated = block.state == alloc::BlockState::allocated;
            bi.active = bi.allocated || block.state == alloc::BlockState::pending_free;
            if (bi.active) {
              auto it = contexts.find(block.addr);
              if (it != contexts.end()) bi.context_when_allocated = it->second;
            }
          }
        }
      }
    }
    if (!include_traces) return;
    auto& trace = info.device_traces[static_cast<std::size_t>(device)];
    for (const auto& record : slot.de->trace->history()) {
      bool known = false;
      const auto action = to_action(record.event.kind, &known);
      if (!known) continue;
      cda::TraceEntry entry(action, static_cast<c10::DeviceIndex>(device),
                            action == cda::TraceEntry::OOM ? record.device_free_bytes() : record.event.addr,
                            record.event.size_bytes, stream_ptr(record.event.stream), c10::MempoolId_t{0, 0}, 0,
                            std::static_pointer_cast<c10::GatheredContext>(record.stack_context()),
                            record.compile_context().empty() ? std::string("N/A") : record.compile_context(),
                            record.user_metadata());
      entry.time_.t_ = clock_.unix_us(record.event.t_ns);
      trace.push_back(std::move(entry));
    }
  });
  std::sort(info.segments.begin(), info.segments.end(),
            [](const cda::SegmentInfo& a, const cda::SegmentInfo& b) { return a.address < b.address; });

  {
    std::lock_guard lock(hooks_mutex_);
    for (const auto& annotation : annotations_) {
      cda::AnnotationEntry entry(static_cast<c10::DeviceIndex>(annotation.device), 0);
      entry.time_.t_ = clock_.unix_us(annotation.t_ns);
      for (const auto& [key, value] : annotation.metadata) entry.recordUserMetadata(key, value);
      info.external_annotations.push_back(std::move(entry));
    }
  }

  auto& meta = info.config_metadata;
  const alloc::Config& engine = config_.engine;
  const AdapterConfig& adapter = config_.adapter;
  meta.garbage_collection_threshold = engine.garbage_collection_threshold;
  meta.max_split_size = engine.max_split_size_bytes;
  meta.pinned_num_register_threads = adapter.pinned_num_register_threads;
  meta.expandable_segments = engine.expandable_segments;
  meta.release_lock_on_malloc = adapter.release_lock_on_cudamalloc;
  meta.pinned_use_host_register = adapter.pinned_use_cuda_host_register;
  meta.graph_capture_record_stream_reuse = adapter.graph_capture_record_stream_reuse;
  meta.last_allocator_settings = config_.source_string.empty() ? to_string(config_) : config_.source_string;
  meta.roundup_power2_divisions.assign(engine.roundup_power2_divisions.begin(), engine.roundup_power2_divisions.end());
  return info;
}

// ---- private pools: CUDA graphs, MemPool, cudagraph trees' checkpoints (graph_pools.h)

// Runs f, raising a PoolError as the c10::Error PyTorch's allocator raises for the same misuse.
template <class F>
auto pool_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const detail::PoolError& e) {
    TORCH_CHECK(false, e.what());
  }
}

void GpumemCudaAllocator::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                                              std::function<bool(cudaStream_t)> filter) {
  detail::GraphPools& pools = pools_of(device);
  pool_call([&] {
    pools.begin_allocate_to_pool(id, [f = std::move(filter)](alloc::StreamId s) {
      return f(static_cast<cudaStream_t>(stream_ptr(s)));
    });
  });
}

void GpumemCudaAllocator::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) {
  detail::GraphPools& pools = pools_of(device);
  pool_call([&] { pools.end_allocate_to_pool(id); });
}

void GpumemCudaAllocator::releasePool(c10::DeviceIndex device, c10::MempoolId_t id) {
  detail::GraphPools& pools = pools_of(device);
  pool_call([&] { pools.release(id); });
}

int GpumemCudaAllocator::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) {
  detail::GraphPools& pools = pools_of(device);
  return pool_call([&] { return pools.use_count(id); });
}

void GpumemCudaAllocator::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                                             std::shared_ptr<cca::CUDAAllocator> allocator) {
  if (allocator != nullptr)
    TORCH_CHECK_NOT_IMPLEMENTED(false, "gpumem does not support ", kCustomPoolAllocator,
                                ". gpumem's pools take their memory from gpumem's own source; use torch.cuda.MemPool() "
                                "without an allocator, or run this part of the program with PyTorch's native CUDA "
                                "allocator.");
  detail::GraphPools& pools = pools_of(device);
  pool_call([&] { pools.create_or_incref(id); });
}

void GpumemCudaAllocator::setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) {
  // MemPool's destructor turns it off: that must always work.
  TORCH_CHECK_NOT_IMPLEMENTED(!use_on_oom, "gpumem does not support ", kPoolUseOnOom,
                              " (pool ", detail::to_string(id), " on device ", static_cast<int>(device),
                              "). Create the MemPool without use_on_oom.");
}

void GpumemCudaAllocator::setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "gpumem does not support ", kPoolNoSplit, " (pool ", detail::to_string(id),
                              " on device ", static_cast<int>(device), "). Create the MemPool without no_split.");
}

bool GpumemCudaAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                                   const std::unordered_set<void*>& expected_live_allocations) {
  detail::GraphPools& pools = pools_of(device);
  return pool_call([&] { return pools.check_live_allocations(id, expected_live_allocations); });
}

// A private pool's checkpoint, as the opaque state cudagraph trees keep and hand back.
struct GpumemPoolState final : cca::AllocatorState {
  explicit GpumemPoolState(detail::PoolCheckpoint c) : checkpoint(std::move(c)) {}
  detail::PoolCheckpoint checkpoint;
};

std::shared_ptr<cca::AllocatorState> GpumemCudaAllocator::getCheckpointState(c10::DeviceIndex device,
                                                                              c10::MempoolId_t id) {
  detail::GraphPools& pools = pools_of(device);
  return std::make_shared<GpumemPoolState>(pool_call([&] { return pools.checkpoint(id); }));
}

cca::CheckpointDelta GpumemCudaAllocator::setCheckpointPoolState(c10::DeviceIndex device,
                                                                 std::shared_ptr<cca::AllocatorState> state) {
  auto* ours = dynamic_cast<GpumemPoolState*>(state.get());
  TORCH_CHECK(ours != nullptr, "gpumem: setCheckpointPoolState was given an allocator state gpumem did not make "
              "(a checkpoint taken under another CUDA allocator cannot be restored by gpumem)");
  TORCH_CHECK(ours->checkpoint.device == device, "gpumem: setCheckpointPoolState: the checkpoint of private pool ",
              detail::to_string(ours->checkpoint.id), " was taken on device ", ours->checkpoint.device,
              ", not device ", static_cast<int>(device));
  DeviceSlot& slot = slot_for(device);
  detail::GraphPools& pools = pools_of(device);
  detail::PoolRestore restored = pool_call([&] { return pools.restore(ours->checkpoint); });
  if (slot.any_contexts.load(std::memory_order_relaxed)) {
    std::lock_guard lock(slot.contexts_mutex);
    for (void* p : restored.freed) slot.contexts.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  cca::CheckpointDelta delta;
  delta.ptrs_freed = std::move(restored.freed);
  const c10::Device where(c10::DeviceType::CUDA, device);
  for (void* p : restored.allocated) delta.dataptrs_allocd.emplace_back(p, p, &raw_delete_fn, where);
  return delta;
}

GpumemCudaAllocator& instance(const Config* config) {
  if (GpumemCudaAllocator* existing = g_allocator.load(std::memory_order_acquire)) {
    TORCH_CHECK(config == nullptr || *config == existing->config(),
                "gpumem: the CUDA allocator already exists with configuration '", to_string(existing->config()),
                "'; it cannot be re-created with '", to_string(*config),
                "'. Configure gpumem once, before its first use (GPUMEM_ALLOC_CONF or the first install() call).");
    return *existing;
  }
  std::lock_guard lock(install_mutex());
  if (g_allocator.load(std::memory_order_acquire) != nullptr) return instance(config);
  Config chosen;
  if (config) {
    chosen = *config;
  } else {
    auto parsed = config_from_environment();
    if (auto* error = std::get_if<ConfigError>(&parsed)) TORCH_CHECK(false, error->message);
    chosen = std::get<Config>(std::move(parsed));
  }
  // (source:sim is accepted here and checked when a device's engine is made: see make_cuda_engine.)
  TORCH_CHECK(chosen.adapter.source != SourceKind::host_vmm, "gpumem: source:host_vmm cannot serve CUDA tensors; use "
              "source:cuda_vmm (the default) or source:cuda_malloc (host memory is for install_cpu)");
  auto* created = new GpumemCudaAllocator(std::move(chosen));  // lives until the process ends
  g_allocator.store(created, std::memory_order_release);
  return *created;
}

// The allocator the C functions serve: one load once it exists (instance() makes it on first use).
inline GpumemCudaAllocator& c_api_instance() {
  GpumemCudaAllocator* existing = g_allocator.load(std::memory_order_acquire);
  return C10_LIKELY(existing != nullptr) ? *existing : instance(nullptr);
}

void install_instance(GpumemCudaAllocator& ours) {
  std::lock_guard lock(install_mutex());
  cca::CUDAAllocator* current = cca::allocator.load();
  if (current == &ours) return;
  // pinned_allocator:gpumem: the library is loaded before anything is installed, so a missing or
  // unloadable one refuses the whole install (pinned_loader.h).
  const AdapterConfig& adapter = ours.config().adapter;
  std::optional<detail::PinnedLibrary> pinned;
  if (adapter.pinned_allocator == PinnedAllocatorKind::gpumem) {
    pinned = detail::PinnedLibrary::open();
    TORCH_CHECK(pinned->ok(), "gpumem::torch::install: ", pinned->error(), ". Nothing was installed.");
  }
  TORCH_CHECK(current == nullptr || !current->initialized(),
              "gpumem::torch::install: PyTorch's CUDA allocator ('", current ? current->name() : std::string("none"),
              "') is already initialized, so tensors made by it would be freed by the wrong allocator. Install gpumem "
              "before the first CUDA tensor and before torch.cuda is initialized: call install() at the start of main(), "
              "or in Python load libgpumem_torch.so (torch.ops.load_library, with GPUMEM_ALLOC_CONF set) right after "
              "`import torch`.");
  cca::allocator.store(&ours);
  c10::SetAllocator(c10::DeviceType::CUDA, &ours, kAllocatorPriority);
  g_installed.store(true);
  if (pinned) {
    const std::string error = pinned->install(adapter, ours.config().forensics);
    TORCH_CHECK(error.empty(), "gpumem::torch::install: ", error,
                ". gpumem's CUDA allocator is installed; pinned host memory stays PyTorch's.");
  }
}

}  // namespace

namespace detail {
DeviceEngine* cuda_engine(int index) noexcept {
  GpumemCudaAllocator* a = g_allocator.load(std::memory_order_acquire);
  if (a == nullptr) return nullptr;
  DeviceSlot* slot = a->find_slot(index);
  return slot ? slot->de.get() : nullptr;
}
}  // namespace detail

CUDAAllocator& cuda_allocator() { return instance(nullptr); }
CUDAAllocator& cuda_allocator(const Config& config) { return instance(&config); }

void install(const Config& config) { install_instance(instance(&config)); }

void install_from_environment() { install_instance(instance(nullptr)); }

bool installed() noexcept { return g_installed.load(); }

}  // namespace gpumem::torch

// ---- C functions for torch.cuda.memory.CUDAPluggableAllocator ----

extern "C" {

void* gpumem_malloc(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  return gpumem::torch::c_api_instance().malloc(static_cast<c10::DeviceIndex>(device), size, stream);
}

void gpumem_free(void* ptr, size_t /*size*/, int /*device*/, cudaStream_t /*stream*/) {
  gpumem::torch::c_api_instance().free(ptr);
}

void gpumem_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr) gpumem::torch::c_api_instance().record_stream(ptr, stream);
}

void gpumem_empty_cache(void) { gpumem::torch::instance(nullptr).emptyCache({0, 0}); }

void gpumem_set_memory_fraction(double fraction, int device) {
  gpumem::torch::instance(nullptr).setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
}

}  // extern "C"
