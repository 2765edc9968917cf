// read_file_bytes: the whole content of a file, gunzipped when it is gzip-compressed (plain files
// are returned as they are). Internal to gpumem::forensics.
//
// Errors (missing file, unreadable, corrupt or truncated gzip, more than limits.max_file_bytes
// before or after decompression) are one ForensicsError naming the file and, for gzip damage, the
// compressed byte offset where decoding stopped.
#pragma once

#include <string>

#include "gpumem/forensics/read_limits.h"

namespace gpumem::forensics::detail {

struct FileBytes {
  std::string bytes;       // decompressed content
  bool was_gzip = false;
};

FileBytes read_file_bytes(const std::string& path, const ReadLimits& limits);

}  // namespace gpumem::forensics::detail
