// libgpumem_pinned_torch.so: gpumem's pinned allocator as libtorch's CUDA host allocator. Without a
// device, install refuses with a sentence and leaves PyTorch's allocator in place; the [gpu] cases
// check pin_memory, non_blocking copies (record_event), host_memory_stats and empty_cache.
#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "catch.h"
#include "gpumem/torch/pinned_host_allocator.h"

using namespace gpumem;

namespace {
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
}  // namespace

TEST_CASE("without a CUDA device, install_pinned refuses and PyTorch's host allocator stays", "[pinned][torch]") {
  if (device_count() != 0) GPUMEM_SKIP("a CUDA device is present: the [gpu] cases run instead");
  at::HostAllocator* before = at::getHostAllocator(at::kCUDA);
  std::string message;
  try {
    gpumem::torch::install_pinned();
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  CHECK(message.find("needs a CUDA device") != std::string::npos);
  CHECK(gpumem::torch::installed_pinned() == nullptr);
  CHECK(at::getHostAllocator(at::kCUDA) == before);
  // The C entry point libgpumem_torch.so's loader calls.
  char error[256] = {};
  GpumemPinnedSettings settings{};
  settings.size_bytes = sizeof settings;
  settings.touch_threads = 1;
  CHECK(gpumem_install_pinned_with(&settings, error, sizeof error) == 1);
  CHECK(std::string(error).find("needs a CUDA device") != std::string::npos);
  settings.background_period_us = 100;
  settings.touch_threads = 0;
  CHECK(gpumem_install_pinned_with(&settings, error, sizeof error) == 1);  // a bad option is named first
  CHECK(std::string(error).find("touch_threads = 0") != std::string::npos);
  // An older caller's shorter struct: the fields it lacks keep their defaults (touch_threads 1).
  settings.size_bytes = offsetof(GpumemPinnedSettings, touch_threads);
  CHECK(gpumem_install_pinned_with(&settings, error, sizeof error) == 1);
  CHECK(std::string(error).find("needs a CUDA device") != std::string::npos);
  std::string snapshot_error;
  try {
    gpumem::torch::pinned_snapshot();
  } catch (const c10::Error& e) {
    snapshot_error = e.what_without_backtrace();
  }
  CHECK(snapshot_error.find("not installed") != std::string::npos);
}

TEST_CASE("pinned tensors, non_blocking copies and host_memory_stats go through gpumem", "[pinned][torch][gpu]") {
  if (device_count() == 0) GPUMEM_SKIP("no CUDA device");
  // A pinned block of PyTorch's own, made before the swap: it must keep working afterwards.
  at::Tensor old = at::empty({1 << 20}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  pinned::PinnedAllocator& pa = gpumem::torch::install_pinned();
  CHECK(&gpumem::torch::install_pinned() == &pa);  // once
  CHECK(gpumem::torch::installed_pinned() == &pa);
  CHECK_FALSE(pa.owns(old.data_ptr()));

  const auto before = at::getHostAllocator(at::kCUDA)->get_stats();
  at::Tensor host = at::empty({64 << 20}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  CHECK(host.is_pinned());
  CHECK(pa.owns(host.data_ptr()));
  host.fill_(7);
  at::Tensor cpu = at::ones({1000}, at::kFloat);
  at::Tensor pinned_copy = cpu.pin_memory();
  CHECK(pa.owns(pinned_copy.data_ptr()));
  CHECK(pinned_copy.equal(cpu));

  // A non_blocking copy records an event on the block; dropping the tensor leaves it pending until
  // the copy completes.
  auto stream = c10::cuda::getStreamFromPool();
  at::Tensor dev;
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    dev = host.to(at::kCUDA, /*non_blocking=*/true);
    at::Tensor copy_old = old.to(at::kCUDA, /*non_blocking=*/true);  // record_event passed to PyTorch's
  }
  void* block = host.data_ptr();
  host.reset();
  CHECK(pa.lookup(block).has_value());  // freed by the user; pending or already returned
  stream.synchronize();
  pa.process_events();
  CHECK_FALSE(pa.lookup(block).has_value());
  CHECK(dev.to(at::kCPU).eq(7).all().item<bool>());

  const auto stats = at::getHostAllocator(at::kCUDA)->get_stats();
  CHECK(stats.allocated_bytes.current > 0);            // page-locked bytes held
  CHECK(stats.allocated_bytes.peak >= (64 << 20));
  CHECK(stats.num_host_alloc >= 1);
  CHECK(stats.active_requests.current == 1);           // pinned_copy
  CHECK(before.allocated_bytes.current == 0);
  // The snapshot: regions as segments of pinned host memory (device -1), pinned_copy's block live.
  const forensics::Snapshot snap = gpumem::torch::pinned_snapshot();
  REQUIRE_FALSE(snap.segments.empty());
  bool live = false;
  for (const auto& seg : snap.segments) {
    CHECK(seg.device == forensics::kPinnedHostDevice);
    for (const auto& b : seg.blocks) live |= b.address == reinterpret_cast<std::uintptr_t>(pinned_copy.data_ptr());
  }
  CHECK(live);
  pinned_copy.reset();
  at::getHostAllocator(at::kCUDA)->empty_cache();
  CHECK(at::getHostAllocator(at::kCUDA)->get_stats().allocated_bytes.current == 0);
  pa.check_invariants();
}
