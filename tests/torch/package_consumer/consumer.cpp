// Links gpumem::torch from an installed gpumem package: installs gpumem as the CPU allocator,
// allocates through c10 and reads the statistics back. Exit status 0 if they agree.
#include <c10/core/CPUAllocator.h>

#include <cstdio>

#include "gpumem/torch/config.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"

int main() {
  auto parsed = gpumem::torch::parse_config("expandable_segments:True,trace_entries:16");
  if (!std::holds_alternative<gpumem::torch::Config>(parsed)) return 1;
  gpumem::torch::install_cpu(std::get<gpumem::torch::Config>(parsed));
  const auto before = gpumem::torch::cpu_stats().requested_bytes[0].current;
  {
    c10::DataPtr p = c10::GetCPUAllocator()->allocate(1 << 20);
    const auto during = gpumem::torch::cpu_stats().requested_bytes[0].current;
    std::printf("consumer: requested bytes %lld -> %lld\n", static_cast<long long>(before),
                static_cast<long long>(during));
    if (during - before != (1 << 20)) return 1;
  }
  return gpumem::torch::cpu_stats().requested_bytes[0].current == before ? 0 : 1;
}
