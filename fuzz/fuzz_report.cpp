// libFuzzer target: a file's bytes -> what `gpumem report` does with them: gunzip when gzip, detect
// the format (pickle, JSON, CSV), read the snapshot, build the report, render text and JSON.
// Refusal is a ForensicsError; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/snapshot_io.h"
#include "fuzz_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fx = gpumem::forensics;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const fx::Snapshot snap = fx::parse_snapshot_file_bytes(bytes, "fuzz.file", gpumem::fuzz::limits());
    const fx::MemoryReport r = fx::build_report(snap, {});
    (void)fx::render_report_text(r);
    (void)fx::render_report_json(r);
  } catch (const fx::ForensicsError&) {
  }
  return 0;
}
