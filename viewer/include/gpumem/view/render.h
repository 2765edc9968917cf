// render(): one frame of the viewer as a CellGrid, a pure function of the view state, the model
// and the screen size. Every frame has the title bar (row 0), the view tabs (row 1), the view's
// body, and the help line (last row). The terminal painter copies the grid; tests compare it.
//
// Thread-safety: pure functions.
#pragma once

#include "gpumem/view/cell_grid.h"
#include "gpumem/view/view_state.h"
#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

inline constexpr Size kMinScreen{40, 8};

CellGrid render(const ViewState& state, const ViewerModel& model, Size size);

// The text the help screen shows (also `gpumem view --help`'s key list).
const char* key_help_text() noexcept;

}  // namespace gpumem::view
