// Built instead of cuda_allocator.cpp when there is no CUDA toolkit or no CUDA libtorch.
#include <c10/util/Exception.h>

#include "engines.h"
#include "gpumem/torch/install.h"

namespace gpumem::torch {

namespace detail {
DeviceEngine* cuda_engine(int) noexcept { return nullptr; }
}  // namespace detail

void install(const Config&) {
  TORCH_CHECK(false, "gpumem::torch::install: this libgpumem_torch was built without CUDA (no CUDA toolkit or a "
                     "CPU-only libtorch); rebuild gpumem against a CUDA build of libtorch, or use install_cpu()");
}

void install_from_environment() { install({}); }

bool installed() noexcept { return false; }

}  // namespace gpumem::torch
