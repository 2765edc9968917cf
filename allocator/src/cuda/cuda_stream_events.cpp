#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "cuda_driver.h"
#include "gpumem/alloc/cuda_sources.h"

namespace gpumem::alloc {

using detail::DeviceGuard;

namespace {

// A failed event or stream call other than "not ready" means a bad stream handle (a caller bug)
// or a broken context (an earlier kernel faulted): nothing the engine can recover from.
[[noreturn]] void die(const char* call, int device, cudaError_t error) {
  std::fprintf(stderr, "gpumem: %s on device %d failed: %s. The CUDA context is unusable or the stream is invalid.\n",
               call, device, detail::runtime_error_words(error).c_str());
  std::abort();
}

cudaEvent_t as_event(EventToken token) { return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(token)); }

std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count());
}

}  // namespace

void CudaStreamEvents::AtomicCallTime::add(std::uint64_t ns) noexcept {
  calls.fetch_add(1, std::memory_order_relaxed);
  total_ns.fetch_add(ns, std::memory_order_relaxed);
  std::uint64_t seen = max_ns.load(std::memory_order_relaxed);
  while (ns > seen && !max_ns.compare_exchange_weak(seen, ns, std::memory_order_relaxed)) {
  }
}

CudaCallTime CudaStreamEvents::AtomicCallTime::load() const noexcept {
  CudaCallTime t;
  t.calls = calls.load(std::memory_order_relaxed);
  t.total_ns = total_ns.load(std::memory_order_relaxed);
  t.max_ns = max_ns.load(std::memory_order_relaxed);
  return t;
}

CudaStreamEvents::CudaStreamEvents(int device) : device_(device) {}

CudaStreamEvents::~CudaStreamEvents() {
  std::lock_guard lock(mutex_);
  if (pool_.empty()) return;
  DeviceGuard guard(device_, false);
  // At process exit the runtime may already be gone; then there is nothing left to destroy.
  for (void* e : pool_)
    if (cudaEventDestroy(static_cast<cudaEvent_t>(e)) != cudaSuccess) (void)cudaGetLastError();
}

EventToken CudaStreamEvents::record(StreamId stream) {
  const auto t0 = std::chrono::steady_clock::now();
  cudaEvent_t event = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (!pool_.empty()) {
      event = static_cast<cudaEvent_t>(pool_.back());
      pool_.pop_back();
    }
  }
  // Stream 0 means the legacy default stream of the current device: make it ours.
  DeviceGuard guard(device_, false);
  if (guard.status() != cudaSuccess) die("cudaSetDevice", device_, guard.status());
  if (event == nullptr) {
    const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) die("cudaEventCreateWithFlags", device_, err);
    std::lock_guard lock(mutex_);
    ++created_;
  }
  const cudaError_t err = cudaEventRecord(event, reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream)));
  if (err != cudaSuccess) die("cudaEventRecord", device_, err);
  record_time_.add(elapsed_ns(t0));
  return static_cast<EventToken>(reinterpret_cast<std::uintptr_t>(event));
}

bool CudaStreamEvents::query(EventToken token) {
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t err = cudaEventQuery(as_event(token));
  query_time_.add(elapsed_ns(t0));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error for the next caller
    return false;
  }
  die("cudaEventQuery", device_, err);
}

void CudaStreamEvents::synchronize(EventToken token) {
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t err = cudaEventSynchronize(as_event(token));
  sync_time_.add(elapsed_ns(t0));
  if (err != cudaSuccess) die("cudaEventSynchronize", device_, err);
}

void CudaStreamEvents::release(EventToken token) {
  std::lock_guard lock(mutex_);
  pool_.push_back(static_cast<void*>(as_event(token)));
}

void CudaStreamEvents::synchronize_stream(StreamId stream) {
  const auto t0 = std::chrono::steady_clock::now();
  DeviceGuard guard(device_, false);
  if (guard.status() != cudaSuccess) die("cudaSetDevice", device_, guard.status());
  const cudaError_t err = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream)));
  sync_stream_time_.add(elapsed_ns(t0));
  if (err != cudaSuccess) die("cudaStreamSynchronize", device_, err);
}

std::size_t CudaStreamEvents::events_created() const {
  std::lock_guard lock(mutex_);
  return created_;
}

CudaEventCallTimes CudaStreamEvents::call_times() const {
  CudaEventCallTimes t;
  t.record = record_time_.load();
  t.query = query_time_.load();
  t.synchronize = sync_time_.load();
  t.synchronize_stream = sync_stream_time_.load();
  return t;
}

std::size_t CudaStreamEvents::events_pooled() const {
  std::lock_guard lock(mutex_);
  return pool_.size();
}

}  // namespace gpumem::alloc
