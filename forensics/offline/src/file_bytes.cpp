#include "file_bytes.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <algorithm>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"

namespace gpumem::forensics::detail {
namespace {

[[noreturn]] void too_large(const std::string& path, const char* what, const ReadLimits& limits) {
  throw ForensicsError(fmt::format("{}: {} more than {} bytes, more than gpumem reads from one file; {}", path, what,
                                   limits.max_file_bytes,
                                   read_limit_hint("GPUMEM_MAX_FILE_BYTES", limits.max_file_bytes)));
}

std::string read_raw(const std::string& path, const ReadLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ForensicsError(fmt::format("{}: cannot open the file ({}); check the path", path,
                                     std::strerror(errno)));
  }
  std::string raw;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    raw.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (raw.size() > limits.max_file_bytes) too_large(path, "the file holds", limits);
  }
  if (in.bad()) {
    throw ForensicsError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
  }
  return raw;
}

// Inflates every gzip member of raw (a .gz file may hold several, one after another), at most
// limits.max_file_bytes of output.
std::string gunzip(const std::string& path, const std::string& raw, const ReadLimits& limits) {
  std::string out;
  // The last member's trailer holds its size mod 2^32: a hint (bounded by the limit and by
  // deflate's largest ratio, about 1032:1) that spares most reallocation.
  if (raw.size() >= 18) {
    std::uint64_t hint = 0;
    for (int i = 0; i < 4; ++i) hint |= std::uint64_t{static_cast<unsigned char>(raw[raw.size() - 4 + i])} << (8 * i);
    out.reserve(static_cast<std::size_t>(std::min({hint, limits.max_file_bytes, std::uint64_t{raw.size()} * 1032})));
  }
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    throw ForensicsError(fmt::format("{}: zlib could not start decompression", path));
  }
  // zlib counts input in 32-bit pieces: hand it the file a piece at a time.
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  std::size_t fed = 0;  // bytes of raw handed to zlib so far
  auto feed = [&] {
    const std::size_t n = std::min(kPiece, raw.size() - fed);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data() + fed));
    zs.avail_in = static_cast<uInt>(n);
    fed += n;
  };
  feed();
  char chunk[1 << 16];
  for (;;) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk);
    zs.avail_out = sizeof(chunk);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.append(chunk, sizeof(chunk) - zs.avail_out);
    if (out.size() > limits.max_file_bytes) {
      inflateEnd(&zs);
      too_large(path, "the gzip data inflates to", limits);
    }
    if (zs.avail_in == 0 && fed < raw.size()) feed();
    const std::size_t offset = fed - zs.avail_in;
    if (rc == Z_STREAM_END) {
      if (offset == raw.size()) break;
      // Another member follows (concatenated gzip files), unless the rest is padding.
      if (static_cast<unsigned char>(raw[offset]) != 0x1f) break;
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK || rc == Z_BUF_ERROR) {
      // No progress (or output room left over) with no input left: the end marker is missing.
      if (offset < raw.size() || (rc == Z_OK && zs.avail_out == 0)) continue;
      inflateEnd(&zs);
      throw ForensicsError(fmt::format(
          "{}: the gzip data ends at byte offset {} before its end marker: the file is truncated "
          "(copy it again, or re-export the trace)",
          path, offset));
    }
    {
      const char* why = zs.msg ? zs.msg : zError(rc);
      inflateEnd(&zs);
      throw ForensicsError(fmt::format(
          "{}: corrupt gzip data at compressed byte offset {} ({}); the file is damaged", path,
          offset, why));
    }
  }
  inflateEnd(&zs);
  return out;
}

}  // namespace

FileBytes read_file_bytes(const std::string& path, const ReadLimits& limits) {
  std::string raw = read_raw(path, limits);
  FileBytes result;
  if (raw.size() >= 2 && static_cast<unsigned char>(raw[0]) == 0x1f &&
      static_cast<unsigned char>(raw[1]) == 0x8b) {
    result.bytes = gunzip(path, raw, limits);
    result.was_gzip = true;
  } else {
    result.bytes = std::move(raw);
  }
  return result;
}

}  // namespace gpumem::forensics::detail
