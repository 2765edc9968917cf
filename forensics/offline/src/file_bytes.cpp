#include "file_bytes.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "gpumem/forensics/error.h"

namespace gpumem::forensics::detail {
namespace {

std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ForensicsError(fmt::format("{}: cannot open the file ({}); check the path", path,
                                     std::strerror(errno)));
  }
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    throw ForensicsError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
  }
  return raw;
}

// Inflates every gzip member of raw (a .gz file may hold several, one after another).
std::string gunzip(const std::string& path, const std::string& raw) {
  std::string out;
  out.reserve(raw.size() * 6);
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    throw ForensicsError(fmt::format("{}: zlib could not start decompression", path));
  }
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  char chunk[1 << 16];
  for (;;) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk);
    zs.avail_out = sizeof(chunk);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.append(chunk, sizeof(chunk) - zs.avail_out);
    const std::size_t offset = raw.size() - zs.avail_in;
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      // Another member follows (concatenated gzip files), unless the rest is padding.
      if (static_cast<unsigned char>(raw[offset]) != 0x1f) break;
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_BUF_ERROR || (rc == Z_OK && zs.avail_in == 0 && zs.avail_out != 0)) {
      inflateEnd(&zs);
      throw ForensicsError(fmt::format(
          "{}: the gzip data ends at byte offset {} before its end marker: the file is truncated "
          "(copy it again, or re-export the trace)",
          path, offset));
    }
    if (rc != Z_OK) {
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

FileBytes read_file_bytes(const std::string& path) {
  std::string raw = read_raw(path);
  FileBytes result;
  if (raw.size() >= 2 && static_cast<unsigned char>(raw[0]) == 0x1f &&
      static_cast<unsigned char>(raw[1]) == 0x8b) {
    result.bytes = gunzip(path, raw);
    result.was_gzip = true;
  } else {
    result.bytes = std::move(raw);
  }
  return result;
}

}  // namespace gpumem::forensics::detail
