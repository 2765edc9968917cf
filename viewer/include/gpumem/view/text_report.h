// text_report(): the viewer's screens rendered as plain text, for logs and CI (`gpumem view
// --report FILE`): the summary with the OOM verdict, the timeline, the live allocations by call
// site, what pins the segments, the segment map, live memory over time (the Active view), and the
// diff when there is a second file. Each screen is render() at the given width at the cursor
// (default: where the viewer opens), so the report shows exactly what the terminal would.
// It waits for the model's OOM report.
//
// Thread-safety: a pure function.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

std::string text_report(const ViewerModel& model, int width, std::optional<std::size_t> cursor = std::nullopt);

}  // namespace gpumem::view
