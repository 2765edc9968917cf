// format_size: bytes as PyTorch's OOM messages print them ("3.00 MiB", "139.80 GiB"), with
// snprintf. c10::CachingAllocator::format_size goes through an ostringstream, and iostream
// formatting of doubles crashed in a library built with one libstdc++ and loaded into a Python
// process running another (seen on the GPU machine: torch.ops.load_library, then an OOM).
#pragma once

#include <cstdio>
#include <cstdint>
#include <string>

namespace gpumem::torch::detail {

inline std::string format_size(std::uint64_t size) {
  char buf[64];
  if (size <= 1024) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(size));
  } else if (size <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(size) / 1024.0);
  } else if (size <= 1073741824ULL) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(size) / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(size) / 1073741824.0);
  }
  return buf;
}

}  // namespace gpumem::torch::detail
