// ReadLimits: the bounds every reader of gpumem's forensics keeps to, so that no file (damaged,
// hostile, or just far larger than any real one) makes a command use unbounded memory or time.
// A file over a bound is refused with one ForensicsError that names the file, the bound, and how
// to raise it; nothing is read partially.
//
//   max_file_bytes   bytes of one file as read, after gzip decompression (a small .gz can inflate
//                    1000-fold). Environment: GPUMEM_MAX_FILE_BYTES. Default 2 GiB.
//   max_records      records decoded from one file: trace entries, segments, blocks and stack
//                    frames (a pickle can refer to one entry or one stack many times through its
//                    memo, so a small file may describe many records; each costs about 100 to
//                    200 bytes of memory). Environment: GPUMEM_MAX_RECORDS. Default 32 Mi.
//
// The readers also bound what needs no setting: nesting of containers (kMaxNestingDepth levels;
// a snapshot nests 7), the values one number may take (kMaxPlausibleBytes for a size or an
// address range, kMaxPlausibleTimeUs for a time stamp) and the sum of a trace's sizes
// (kMaxTotalBytes), so that sums and differences of sizes and times computed later cannot
// overflow 64 bits.
//
// Thread-safety: values; default_read_limits() reads the environment once (thread-safe static).
#pragma once

#include <cstdint>
#include <string>

namespace gpumem::forensics {

struct ReadLimits {
  std::uint64_t max_file_bytes = std::uint64_t{2} << 30;
  std::uint64_t max_records = std::uint64_t{32} << 20;

  // The defaults, each replaced by its environment variable when that is set. Throws
  // ForensicsError naming the variable when its value is not a positive integer.
  static ReadLimits from_environment();
};

// ReadLimits::from_environment(), evaluated on first use (the readers' default).
const ReadLimits& default_read_limits();

// Containers nested deeper than this are refused (a PyTorch snapshot nests 7 levels).
inline constexpr int kMaxNestingDepth = 256;
// Sizes and address ranges above this (2^52 bytes, 4 PiB, 30,000 times an H200) are refused
// as implausible.
inline constexpr std::uint64_t kMaxPlausibleBytes = std::uint64_t{1} << 52;
// The sizes of one trace's entries (or one snapshot's segments) may add up to at most this
// (2^62 bytes), so that every sum of them computed later (allocated, reserved, per op) fits in a
// signed 64-bit integer with room to spare.
inline constexpr std::uint64_t kMaxTotalBytes = std::uint64_t{1} << 62;
// Time stamps beyond +-2^61 us (73,000 years) are refused; any difference of two fits in 63 bits.
inline constexpr std::int64_t kMaxPlausibleTimeUs = std::int64_t{1} << 61;

// The message tail every "over the limit" error ends with: which variable raises the limit.
std::string read_limit_hint(const char* variable, std::uint64_t limit);

}  // namespace gpumem::forensics
