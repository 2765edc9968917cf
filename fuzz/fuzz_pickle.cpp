// libFuzzer target: bytes -> parse_pickle -> snapshot_from_pickle. Either step may refuse the input
// with a ForensicsError; anything else (a crash, an abort, another exception, a sanitizer report,
// a leak) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/pickle_reader.h"
#include "gpumem/forensics/snapshot_reader.h"
#include "fuzz_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fx = gpumem::forensics;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const fx::PickleValue v = fx::parse_pickle(bytes, "fuzz.pickle", gpumem::fuzz::limits());
    (void)fx::snapshot_from_pickle(v, "fuzz.pickle", gpumem::fuzz::limits());
  } catch (const fx::ForensicsError&) {
  }
  return 0;
}
