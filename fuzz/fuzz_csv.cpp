// libFuzzer target: text -> parse_csv_trace, then the trace's derived numbers (duration, counts).
// Refusal is a ForensicsError; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/forensics/error.h"
#include "fuzz_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fx = gpumem::forensics;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const fx::Trace t = fx::parse_csv_trace(text, "fuzz.csv", gpumem::fuzz::limits());
    if (t.duration_us() < 0) __builtin_trap();
    (void)t.count(fx::TraceAction::alloc);
  } catch (const fx::ForensicsError&) {
  }
  return 0;
}
