// gpumem's c10::cuda::CUDACachingAllocator::CUDAAllocator (see gpumem/torch/cuda_allocator.h),
// install(), and the C functions for CUDAPluggableAllocator.
//
// One DeviceSlot per CUDA device holds the device's engine (created on first use) and the stack
// contexts of live blocks when _record_memory_history asks for them. Frees arrive with a bare
// pointer: with one engine it is that engine's; with several the pointer registry says whose.
//
// Lock order: slots_mutex_ (engine creation only) -> engine's mutex; contexts_mutex is a leaf;
// hooks_mutex_ is a leaf. No lock of ours is held while calling the engine, a tracker or an OOM
// observer.
#include "gpumem/torch/cuda_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/ApproximateClock.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "c10_stats.h"
#include "cuda_ipc.h"
#include "format_size.h"
#include "device_engine.h"
#include "engines.h"
#include "gpumem/torch/c_api.h"
#include "gpumem/torch/install.h"
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

[[noreturn]] void unsupported(const char* feature, const char* call) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "gpumem does not support ", feature, " (", call,
                              " was called). Run this part of the program with PyTorch's native CUDA allocator "
                              "(do not install gpumem: unset GPUMEM_ALLOC_CONF / do not load libgpumem_torch.so).");
}

constexpr const char* kGraphPools =
    "CUDA-graph private memory pools (torch.cuda.graph capture, torch.cuda.MemPool, torch.compile "
    "mode=\"reduce-overhead\")";
constexpr const char* kCheckpoint = "CUDA-graph allocator checkpoint state (cudagraph trees in torch.compile)";

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
    const c10::DeviceIndex device = c10::cuda::current_device();
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
    if (mempool_id != c10::MempoolId_t{0, 0}) unsupported(kGraphPools, "emptyCache(mempool_id)");
    for_each_slot([](DeviceSlot& slot) {
      SlotDeviceGuard guard(slot);
      slot.de->engine->empty_cache();
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
    const c10::DeviceIndex device = c10::cuda::current_device();
    if (C10_UNLIKELY(!enabled_.load(std::memory_order_relaxed))) return uncached_allocate(nbytes, device);
    return malloc(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    const c10::DeviceIndex device = c10::cuda::current_device();
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
    slot_for(device).de->engine->set_memory_fraction(fraction);
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    check_device(device);
    std::vector<cca::StreamSegmentSize> sizes;
    if (DeviceSlot* slot = find_slot(device)) {
      for (const auto& region : slot->de->engine->expandable_region_sizes())
        sizes.emplace_back(static_cast<cudaStream_t>(stream_ptr(region.stream)), region.is_small_pool,
                           region.mapped_bytes);
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
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    DeviceSlot* slot = slot_of(ptr);
    std::optional<alloc::BlockLookup> found;
    if (slot) found = slot->de->engine->lookup(ptr);
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

  void beginAllocateToPool(c10::DeviceIndex, c10::MempoolId_t, std::function<bool(cudaStream_t)>) override {
    unsupported(kGraphPools, "beginAllocateToPool");
  }
  void endAllocateToPool(c10::DeviceIndex, c10::MempoolId_t) override { unsupported(kGraphPools, "endAllocateToPool"); }
  void releasePool(c10::DeviceIndex, c10::MempoolId_t) override { unsupported(kGraphPools, "releasePool"); }
  int getPoolUseCount(c10::DeviceIndex, c10::MempoolId_t) override { unsupported(kGraphPools, "getPoolUseCount"); }
  void createOrIncrefPool(c10::DeviceIndex, c10::MempoolId_t, std::shared_ptr<cca::CUDAAllocator>) override {
    unsupported(kGraphPools, "createOrIncrefPool");
  }
  void setUseOnOOM(c10::DeviceIndex, c10::MempoolId_t, bool) override { unsupported(kGraphPools, "setUseOnOOM"); }
  void setNoSplit(c10::DeviceIndex, c10::MempoolId_t) override { unsupported(kGraphPools, "setNoSplit"); }
  bool checkPoolLiveAllocations(c10::DeviceIndex, c10::MempoolId_t, const std::unordered_set<void*>&) override {
    unsupported(kGraphPools, "checkPoolLiveAllocations");
  }

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
    for_each_slot([&](DeviceSlot& slot) { slot.de->trace->configure(trace_settings_, clear); });
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
    for_each_slot([&](DeviceSlot& slot) { slot.de->trace->add_hook(tracker_hook(tracker)); });
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

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex, c10::MempoolId_t) override {
    unsupported(kCheckpoint, "getCheckpointState");
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex, std::shared_ptr<cca::AllocatorState>) override {
    unsupported(kCheckpoint, "setCheckpointPoolState");
  }

  std::string name() override { return "gpumem"; }

  // ---- gpumem ----
  void* malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream);
  void free(void* ptr);
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
  DeviceSlot* slot_of(const void* ptr) const {
    if (DeviceSlot* only = only_slot_.load(std::memory_order_acquire)) return only;
    const int owner = detail::pointer_registry().owner_of(ptr);
    return owner >= 0 ? find_slot(owner) : nullptr;
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

  [[noreturn]] void raise_oom(DeviceSlot& slot, size_t size, const alloc::OomInfo& oom, cudaStream_t stream);

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

DeviceSlot& GpumemCudaAllocator::create_slot(c10::DeviceIndex device) {
  std::lock_guard lock(slots_mutex_);
  if (DeviceSlot* slot = find_slot(device)) return *slot;
  std::string error;
  auto de = detail::make_cuda_engine(config_, device, detail::pointer_registry(), &error);
  TORCH_CHECK(de != nullptr, error);
  auto* slot = new DeviceSlot();  // never destroyed: deleters of live tensors point here
  slot->de = std::move(de);
  {
    std::lock_guard hooks(hooks_mutex_);
    slot->de->trace->configure(trace_settings_.capacity > 0 ? trace_settings_ : detail::trace_settings_from(config_),
                               /*clear=*/true);
    slot->de->trace->set_user_metadata(user_metadata_);
    for (const auto& context : compile_contexts_) slot->de->trace->push_compile_context(context);
    for (const auto& tracker : trackers_) slot->de->trace->add_hook(tracker_hook(tracker));
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
  // With _record_memory_history(context=...), the stack is gathered before the engine call (no
  // lock is held) and handed to the trace ring through the thread; blocks keep it while live.
  std::shared_ptr<c10::GatheredContext> context;
  const bool recording =
      record_context_.load(std::memory_order_relaxed) >= static_cast<int>(cda::RecordContext::STATE);
  if (C10_UNLIKELY(recording)) {
    if (auto recorder = context_recorder_.load()) context = recorder();
    forensics::TraceRing::set_thread_context(context);
  }
  alloc::AllocResult result = slot.de->engine->allocate(size, stream_id(stream));
  if (C10_UNLIKELY(recording)) {
    forensics::TraceRing::set_thread_context(nullptr);
    if (context != nullptr && result.ok()) {
      std::lock_guard lock(slot.contexts_mutex);
      slot.contexts[reinterpret_cast<std::uintptr_t>(result.ptr)] = std::move(context);
      slot.any_contexts.store(true, std::memory_order_relaxed);
    }
  }
  if (C10_UNLIKELY(!result.ok())) raise_oom(slot, size, *result.oom, stream);
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    const alloc::EngineTotals totals = slot.de->engine->totals();
    c10::reportMemoryUsageToProfiler(result.ptr, static_cast<int64_t>(result.size_bytes), totals.allocated_bytes,
                                     totals.reserved_bytes, c10::Device(c10::DeviceType::CUDA, device));
  }
  return result.ptr;
}

void GpumemCudaAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  DeviceSlot* slot = slot_of(ptr);
  TORCH_CHECK(slot != nullptr, "gpumem: free of ", ptr,
              ", which is not memory gpumem allocated (a tensor from another allocator was handed to gpumem's "
              "deleter, or the pointer is corrupt)");
  if (C10_UNLIKELY(slot->any_contexts.load(std::memory_order_relaxed))) {
    std::lock_guard lock(slot->contexts_mutex);
    slot->contexts.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  const bool profiling = c10::memoryProfilingEnabled();
  std::size_t block_bytes = 0;
  if (C10_UNLIKELY(profiling)) {
    if (auto found = slot->de->engine->lookup(ptr)) block_bytes = found->block_size_bytes;
  }
  alloc::FreeStatus status;
  if (C10_UNLIKELY(only_slot_.load(std::memory_order_relaxed) == nullptr)) {
    // Several devices: the engine may record events on this device's streams.
    SlotDeviceGuard guard(*slot);
    status = slot->de->engine->free(ptr);
  } else {
    status = slot->de->engine->free(ptr);
  }
  TORCH_CHECK(status == alloc::FreeStatus::ok, "gpumem: cannot free ", ptr, ": ", alloc::describe(status));
  if (C10_UNLIKELY(profiling)) {
    const alloc::EngineTotals totals = slot->de->engine->totals();
    c10::reportMemoryUsageToProfiler(ptr, -static_cast<int64_t>(block_bytes), totals.allocated_bytes,
                                     totals.reserved_bytes,
                                     c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(slot->de->device)));
  }
}

void GpumemCudaAllocator::record_stream(void* ptr, cudaStream_t stream) {
  DeviceSlot* slot = slot_of(ptr);
  TORCH_CHECK(slot != nullptr, "gpumem: record_stream on ", ptr, ", which is not memory gpumem allocated");
  const alloc::FreeStatus status = slot->de->engine->record_stream(ptr, stream_id(stream));
  TORCH_CHECK(status == alloc::FreeStatus::ok, "gpumem: record_stream on ", ptr, ": ", alloc::describe(status));
}

void GpumemCudaAllocator::raise_oom(DeviceSlot& slot, size_t size, const alloc::OomInfo& oom, cudaStream_t stream) {
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
  if (mempool_id != c10::MempoolId_t{0, 0}) unsupported(kGraphPools, "snapshot(mempool_id)");
  cca::SnapshotInfo info;
  int devices = device_count_.load();
  for (int d = 0; d < kMaxDevices; ++d)
    if (find_slot(d)) devices = std::max(devices, d + 1);
  info.device_traces.resize(static_cast<std::size_t>(devices));

  for_each_slot([&](DeviceSlot& slot) {
    const int device = slot.de->device;
    const alloc::EngineSnapshot snap = slot.de->engine->snapshot();
    std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> contexts;
    {
      std::lock_guard lock(slot.contexts_mutex);
      contexts = slot.contexts;
    }
    for (const auto& segment : snap.segments) {
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
        si.owner_private_pool_id = {0, 0};
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

void install_instance(GpumemCudaAllocator& ours) {
  std::lock_guard lock(install_mutex());
  cca::CUDAAllocator* current = cca::allocator.load();
  if (current == &ours) return;
  TORCH_CHECK(current == nullptr || !current->initialized(),
              "gpumem::torch::install: PyTorch's CUDA allocator ('", current ? current->name() : std::string("none"),
              "') is already initialized, so tensors made by it would be freed by the wrong allocator. Install gpumem "
              "before the first CUDA tensor and before torch.cuda is initialized: call install() at the start of main(), "
              "or in Python load libgpumem_torch.so (torch.ops.load_library, with GPUMEM_ALLOC_CONF set) right after "
              "`import torch`.");
  cca::allocator.store(&ours);
  c10::SetAllocator(c10::DeviceType::CUDA, &ours, kAllocatorPriority);
  g_installed.store(true);
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
  return gpumem::torch::instance(nullptr).malloc(static_cast<c10::DeviceIndex>(device), size, stream);
}

void gpumem_free(void* ptr, size_t /*size*/, int /*device*/, cudaStream_t /*stream*/) {
  gpumem::torch::instance(nullptr).free(ptr);
}

void gpumem_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr) gpumem::torch::instance(nullptr).record_stream(ptr, stream);
}

void gpumem_empty_cache(void) { gpumem::torch::instance(nullptr).emptyCache({0, 0}); }

void gpumem_set_memory_fraction(double fraction, int device) {
  gpumem::torch::instance(nullptr).setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
}

}  // extern "C"
