// parse_json: JSON text as a PickleValue tree (objects -> dict with str keys, arrays -> list,
// integers -> int, other numbers -> float, true/false -> bool, null -> None), so the snapshot
// reader walks JSON snapshots the way it walks pickles. Internal to gpumem::forensics.
//
// Errors: one ForensicsError naming the source, the line and column, and what was expected.
// Thread-safety: a free function.
#pragma once

#include <string>
#include <string_view>

#include "gpumem/forensics/pickle_value.h"

namespace gpumem::forensics::detail {

PickleValue parse_json(std::string_view text, const std::string& source);

}  // namespace gpumem::forensics::detail
