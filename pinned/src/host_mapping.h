// Page-aligned anonymous mappings for the host sources (LockedHostSource, CudaHostSource): the
// part both do before they lock (mlock / cudaHostRegister) and after they unlock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::pinned::detail {

std::size_t system_page_bytes() noexcept;

// Empty when size_bytes (a positive multiple of page_bytes) and alignment_bytes (0 or a power of
// two) are acceptable, else one sentence naming the problem.
std::string check_region_request(std::size_t size_bytes, std::size_t alignment_bytes, std::size_t page_bytes);

struct Mapping {
  std::uintptr_t base = 0;
  std::string error;  // set iff base == 0
  bool ok() const noexcept { return base != 0; }
};

// mmap(PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS) of size_bytes at an address aligned to
// max(alignment_bytes, page_bytes): maps size + alignment - page and unmaps the slack on both
// sides. The memory reads as zero.
Mapping map_aligned(std::size_t size_bytes, std::size_t alignment_bytes, std::size_t page_bytes);

// Writes one zero byte per page of [base, base + size_bytes) from `threads` threads (page faults in
// parallel; the memory still reads as zero).
void touch_pages(std::uintptr_t base, std::size_t size_bytes, std::size_t page_bytes, unsigned threads);

}  // namespace gpumem::pinned::detail
