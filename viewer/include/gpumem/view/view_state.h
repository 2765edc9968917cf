// ViewState and reduce(): what the viewer is showing (which view, the trace cursor, the selection
// in each view, the search string) and how a key changes it. reduce() is a pure function of the
// state, the key and the (immutable) model: the terminal loop is `state = reduce(state, key,
// model); paint(render(state, model, size))`, and tests drive it the same way without a terminal.
//
// The screen size travels in the state (a resize arrives as a key) because some keys move by a
// screen-dependent amount (one timeline column).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "gpumem/view/cell_grid.h"
#include "gpumem/view/live_groups.h"
#include "gpumem/view/time_window.h"
#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

enum class View : std::uint8_t { summary, segments, timeline, live, pins, diff, active };
inline constexpr int kViewCount = 7;
const char* view_title(View v) noexcept;

enum class KeyCode : std::uint8_t {
  character,
  up,
  down,
  left,
  right,
  page_up,
  page_down,
  home,
  end,
  enter,
  escape,
  backspace,
  tab,
  resize,
};

struct Key {
  KeyCode code = KeyCode::character;
  char32_t ch = 0;  // KeyCode::character
  Size size;        // KeyCode::resize
  static Key chr(char32_t c) { return Key{KeyCode::character, c, {}}; }
  static Key of(KeyCode k) { return Key{k, 0, {}}; }
  static Key resized(Size s) { return Key{KeyCode::resize, 0, s}; }
};

struct ViewState {
  View view = View::summary;
  Size screen{100, 30};
  bool help = false;
  bool quit = false;
  std::size_t cursor = 0;  // entries applied, 0..model.entry_count()
  std::optional<std::size_t> mark;
  std::string message;  // one-shot note shown in the help line

  // segments view
  int zoom_in = 0;              // 0: fit everything on one screen; +1 halves the bytes per cell
  std::size_t extent_index = 0; // selected extent (block or free gap), in address order

  // live view (the grouping is shared with the Active and Diff views)
  GroupBy group_by = GroupBy::call_site;
  SortBy sort_by = SortBy::bytes;
  std::string search;
  bool editing_search = false;
  std::size_t live_row = 0;

  // pins view
  std::size_t pin_row = 0;

  // diff view with a second file (--diff): B's own cursor (nullopt: B's initial cursor, its OOM
  // or its end), and whether the stepping keys move it instead of A's cursor (key b)
  std::optional<std::size_t> compare_cursor;
  bool diff_moves_b = false;

  // active view: the time window (zoom level 0 = the whole trace, each level halves the span;
  // its start in us since the first entry). Moving the cursor from any view scrolls the window
  // to show it; panning (PgUp / PgDn) moves the window and the cursor together.
  int active_zoom = 0;
  std::int64_t active_start_us = 0;
  BucketMoment active_moment = BucketMoment::peak;  // what each column shows (key e)
};

// The state a file opens in: the summary at the OOM (or the end of the trace).
ViewState initial_state(const ViewerModel& model, Size screen);

ViewState reduce(ViewState state, const Key& key, const ViewerModel& model);

// The Active view's time window at this state's zoom, start and screen width (clamped to the trace).
TimeWindow active_window(const ViewState& state, const ViewerModel& model) noexcept;

// Timeline geometry, shared by render and reduce.
inline constexpr int kTimelineLabelWidth = 11;
int timeline_columns(Size screen) noexcept;
// Entries per timeline column (at least 1).
std::size_t timeline_step(const ViewerModel& model, Size screen) noexcept;

}  // namespace gpumem::view
