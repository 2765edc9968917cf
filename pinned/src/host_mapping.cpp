#include "host_mapping.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>
#include <system_error>

namespace gpumem::pinned::detail {

std::size_t system_page_bytes() noexcept {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<std::size_t>(page) : 4096;
}

std::string check_region_request(std::size_t size_bytes, std::size_t alignment_bytes, std::size_t page_bytes) {
  if (size_bytes == 0 || size_bytes % page_bytes != 0)
    return fmt::format("size_bytes = {} is not a positive multiple of the page size ({} bytes)", size_bytes,
                       page_bytes);
  if (alignment_bytes != 0 && (alignment_bytes & (alignment_bytes - 1)) != 0)
    return fmt::format("alignment_bytes = {} is not a power of two", alignment_bytes);
  return {};
}

Mapping map_aligned(std::size_t size_bytes, std::size_t alignment_bytes, std::size_t page_bytes) {
  const std::size_t align = alignment_bytes > page_bytes ? alignment_bytes : page_bytes;
  const std::size_t span = size_bytes + align - page_bytes;
  if (span < size_bytes) return {0, fmt::format("{} bytes aligned to {} overflow the address space", size_bytes, align)};
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return {0, fmt::format("mmap of {} bytes failed: {} (errno {})", span, std::generic_category().message(err), err)};
  }
  const auto raw = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t base = (raw + align - 1) & ~(static_cast<std::uintptr_t>(align) - 1);
  if (base > raw) ::munmap(p, base - raw);
  const std::uintptr_t end = base + size_bytes;
  if (raw + span > end) ::munmap(reinterpret_cast<void*>(end), raw + span - end);
  return {base, {}};
}

void touch_pages(std::uintptr_t base, std::size_t size_bytes, std::size_t page_bytes, unsigned threads) {
  const std::size_t pages = size_bytes / page_bytes;
  const std::size_t per_thread = (pages + threads - 1) / threads;
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    const std::size_t first = t * per_thread;
    const std::size_t last = std::min(pages, first + per_thread);
    if (first >= last) break;
    workers.emplace_back([=] {
      for (std::size_t p = first; p < last; ++p) *reinterpret_cast<volatile char*>(base + p * page_bytes) = 0;
    });
  }
  for (auto& w : workers) w.join();
}

}  // namespace gpumem::pinned::detail
