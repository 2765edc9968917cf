// Helpers of the torch adapter's tests on a simulated device (source:sim, GPUMEM_ALLOW_SIM=1).
// One allocator per process: the first call installs it with its config, later calls return it.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <variant>

#include "catch.h"
#include "gpumem/torch/cuda_allocator.h"
#include "gpumem/torch/install.h"

namespace gpumem::test {

// gpumem installed on a simulated device with `config` (e.g. "source:sim,memory_limit_mb:1024").
inline c10::cuda::CUDACachingAllocator::CUDAAllocator& sim_allocator(const char* config) {
  static c10::cuda::CUDACachingAllocator::CUDAAllocator* a = [config] {
    setenv("GPUMEM_ALLOW_SIM", "1", 1);
    auto parsed = gpumem::torch::parse_config(config);
    REQUIRE(std::holds_alternative<gpumem::torch::Config>(parsed));
    gpumem::torch::install(std::get<gpumem::torch::Config>(parsed));
    return &gpumem::torch::cuda_allocator();
  }();
  return *a;
}

// The message of the c10::Error f throws, or "" if it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace gpumem::test
