// The read limits the fuzz targets run under: small enough that one input cannot take seconds or
// gigabytes (libFuzzer's -rss_limit_mb and -timeout would report that as a finding), large enough
// for the seed traces' prefixes. The real defaults are in read_limits.h.
#pragma once

#include "gpumem/forensics/read_limits.h"

namespace gpumem::fuzz {

inline const forensics::ReadLimits& limits() {
  static const forensics::ReadLimits l = [] {
    forensics::ReadLimits r;
    r.max_file_bytes = std::uint64_t{64} << 20;
    r.max_records = std::uint64_t{1} << 20;
    return r;
  }();
  return l;
}

}  // namespace gpumem::fuzz
