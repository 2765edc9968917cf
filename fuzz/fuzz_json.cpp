// libFuzzer target: JSON text -> parse_snapshot (its JSON reader, then the snapshot decoder: what
// load_snapshot does with a JSON snapshot; seeds are JSON, so the pickle path is rarely taken).
// Refusal is a ForensicsError; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/snapshot_io.h"
#include "fuzz_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fx = gpumem::forensics;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)fx::parse_snapshot(text, "fuzz.json", gpumem::fuzz::limits());
  } catch (const fx::ForensicsError&) {
  }
  return 0;
}
