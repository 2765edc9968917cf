// The interactive viewer on a terminal (ncurses): reads keys, runs reduce(), paints render()'s
// grid. Colors follow the terminal: 256 colors, 8 colors, or monochrome attributes (reverse, bold,
// dim); ColorMode forces one. This is the only code that talks to the terminal.
//
// Thread-safety: run once, from the main thread.
#pragma once

#include <cstdint>

#include "gpumem/view/view_state.h"
#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

enum class ColorMode : std::uint8_t { automatic, c256, c8, mono };

// Runs until q; returns the process exit status (1 if stdin/stdout is not a terminal).
int run_terminal(const ViewerModel& model, ViewState state, ColorMode colors);

}  // namespace gpumem::view
