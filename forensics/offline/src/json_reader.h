// parse_json: JSON text as a PickleValue tree (objects -> dict with str keys, arrays -> list,
// integers -> int, other numbers -> float, true/false -> bool, null -> None), so the snapshot
// reader walks JSON snapshots the way it walks pickles. Internal to gpumem::forensics.
//
// A key repeated in an object keeps its first place and takes the last value (as Python's json).
// Bounds: nesting of kMaxNestingDepth levels, values as ReadLimits::max_records allows.
// Errors: one ForensicsError naming the source, the line and column, and what was expected.
// Thread-safety: a free function.
#pragma once

#include <string>
#include <string_view>

#include "gpumem/forensics/pickle_value.h"
#include "gpumem/forensics/read_limits.h"

namespace gpumem::forensics::detail {

PickleValue parse_json(std::string_view text, const std::string& source, const ReadLimits& limits);

}  // namespace gpumem::forensics::detail
