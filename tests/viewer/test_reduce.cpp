// reduce(): how keys change the view state.
#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "catch.h"
#include "gpumem/view/render.h"
#include "gpumem/view/view_state.h"
#include "viewer_test_support.h"

using namespace gpumem::view;
using namespace gpumem::view::testing;

namespace {

const ViewerModel& model() {
  static const ViewerModel m = ViewerModel::from(handmade_trace());
  return m;
}

ViewState press(ViewState s, std::u32string_view keys) {
  for (char32_t c : keys) s = reduce(s, Key::chr(c), model());
  return s;
}

}  // namespace

TEST_CASE("views, help and quit", "[viewer][reduce]") {
  ViewState s = initial_state(model(), Size{80, 24});
  CHECK(s.view == View::summary);
  s = press(s, U"3");
  CHECK(s.view == View::timeline);
  s = reduce(s, Key::of(KeyCode::tab), model());
  CHECK(s.view == View::live);
  s = press(s, U"?");
  CHECK(s.help);
  s = press(s, U"x");
  CHECK_FALSE(s.help);
  CHECK(s.view == View::live);
  s = press(s, U"q");
  CHECK(s.quit);
}

TEST_CASE("cursor keys: step, peaks, OOM, timeline columns", "[viewer][reduce]") {
  ViewState s = initial_state(model(), Size{80, 24});
  CHECK(s.cursor == 9);
  s = press(s, U",,");
  CHECK(s.cursor == 7);
  s = press(s, U"a");
  CHECK(s.cursor == model().peak_allocated_cursor());
  s = press(s, U"p");
  CHECK(s.cursor == model().peak_reserved_cursor());
  s = press(s, U"o");
  CHECK(s.cursor == 9);
  s = press(s, U"3");
  s = reduce(s, Key::of(KeyCode::home), model());
  CHECK(s.cursor == 0);
  s = reduce(s, Key::of(KeyCode::right), model());
  CHECK(s.cursor == timeline_step(model(), s.screen));
  s = reduce(s, Key::of(KeyCode::end), model());
  CHECK(s.cursor == 9);
  s = press(s, U"..");
  CHECK(s.cursor == 9);  // clamped at the end
  s = press(s, U"m");
  CHECK(s.mark == 9u);
  CHECK_FALSE(s.message.empty());
}

TEST_CASE("segment map: block cursor and zoom", "[viewer][reduce]") {
  ViewState s = press(initial_state(model(), Size{80, 24}), U"2");
  // At the OOM it opens on the largest free extent (the 2 MiB at the end of segment 1).
  CHECK(s.extent_index == 3);
  s = reduce(s, Key::of(KeyCode::home), model());
  s = reduce(s, Key::of(KeyCode::right), model());
  s = reduce(s, Key::of(KeyCode::right), model());
  CHECK(s.extent_index == 2);
  s = reduce(s, Key::of(KeyCode::down), model());  // next segment: its first extent
  CHECK(s.extent_index == 4);
  s = reduce(s, Key::of(KeyCode::right), model());
  CHECK(s.extent_index == 4);  // the last extent
  s = reduce(s, Key::of(KeyCode::up), model());
  CHECK(s.extent_index == 0);
  s = press(s, U"++-");
  CHECK(s.zoom_in == 1);
  s = press(s, U"0");
  CHECK(s.zoom_in == 0);
  // Enter: what pins the selected block's segment. Segment 2 is filled by live blocks: it holds
  // no free bytes, so it is not in the pins list and Enter says why.
  s = reduce(s, Key::of(KeyCode::end), model());
  s = reduce(s, Key::of(KeyCode::enter), model());
  CHECK(s.view == View::segments);
  CHECK(s.message.find("live blocks fill this segment") != std::string::npos);
  s = reduce(s, Key::of(KeyCode::home), model());  // segment 1: 3 MiB free behind live blocks
  s = reduce(s, Key::of(KeyCode::enter), model());
  CHECK(s.view == View::pins);
  CHECK(s.pin_row == 0);
}

TEST_CASE("live view: search, sort, group, selection", "[viewer][reduce]") {
  ViewState s = press(initial_state(model(), Size{80, 24}), U"4");
  s = press(s, U"/");
  CHECK(s.editing_search);
  s = press(s, U"modq");  // q is text while searching
  CHECK_FALSE(s.quit);
  s = reduce(s, Key::of(KeyCode::backspace), model());
  CHECK(s.search == "mod");
  s = reduce(s, Key::of(KeyCode::enter), model());
  CHECK_FALSE(s.editing_search);
  const auto g = render(s, model(), s.screen);
  CHECK(g.to_text().find("model.py:10:forward") != std::string::npos);
  CHECK(g.to_text().find("optim.py") == std::string::npos);
  s = press(s, U"sg");
  CHECK(s.sort_by == SortBy::count);
  CHECK(s.group_by == GroupBy::function);
  s = reduce(s, Key::of(KeyCode::escape), model());
  CHECK(s.search.empty());
  s = reduce(s, Key::of(KeyCode::down), model());
  s = reduce(s, Key::of(KeyCode::down), model());
  s = reduce(s, Key::of(KeyCode::down), model());
  CHECK(s.live_row == 1);  // two groups by function: forward, step
}

TEST_CASE("resize is a key", "[viewer][reduce]") {
  ViewState s = initial_state(model(), Size{80, 24});
  s = reduce(s, Key::resized(Size{132, 43}), model());
  CHECK(s.screen == Size{132, 43});
}

TEST_CASE("diff view of two files: each side at its own cursor, b switches which one moves", "[viewer][reduce]") {
  ViewerModel two = ViewerModel::from(handmade_trace());
  two.compare = std::make_shared<const ViewerModel>(ViewerModel::from(handmade_trace()));
  const std::size_t b_start = two.compare->initial_cursor();
  ViewState s = initial_state(two, Size{80, 24});
  s = reduce(s, Key::chr(U'6'), two);
  const std::size_t a_start = s.cursor;
  s = reduce(s, Key::chr(U','), two);  // A's cursor moves, B's stays
  CHECK(s.cursor == a_start - 1);
  CHECK_FALSE(s.compare_cursor.has_value());
  s = reduce(s, Key::chr(U'b'), two);
  CHECK(s.diff_moves_b);
  s = reduce(s, Key::chr(U','), two);
  s = reduce(s, Key::chr(U','), two);
  CHECK(s.cursor == a_start - 1);  // A's cursor stays
  REQUIRE(s.compare_cursor.has_value());
  CHECK(*s.compare_cursor == b_start - 2);
  s = reduce(s, Key::chr(U'b'), two);
  CHECK_FALSE(s.diff_moves_b);
  // One file: b explains itself and moves nothing.
  ViewState one = press(initial_state(model(), Size{80, 24}), U"6b");
  CHECK_FALSE(one.diff_moves_b);
  CHECK(one.message.find("--diff") != std::string::npos);
}

TEST_CASE("active view: zoom keeps the cursor's moment; columns, pan, grouping, moment", "[viewer][reduce][active]") {
  const ViewerModel& m = model();
  ViewState s = press(initial_state(m, Size{80, 24}), U"7");
  REQUIRE(s.view == View::active);
  const std::size_t oom = s.cursor;
  const auto column = [&](const ViewState& st) { return active_window(st, m).column_of(m.cursor_elapsed_us(st.cursor)); };
  const std::int64_t col0 = column(s);
  CHECK(active_window(s, m).span_us == m.span_us());
  // Zooming in and out never moves the cursor, keeps it in the window, and keeps its place on the
  // screen (within a column: the window's start is a whole microsecond).
  int zooms = 0;
  while (true) {
    const ViewState before = s;
    s = press(s, U"+");
    if (s.active_zoom == before.active_zoom) break;
    ++zooms;
    CHECK(s.cursor == oom);
    CHECK(active_window(s, m).span_us < active_window(before, m).span_us);
    CHECK(active_window(s, m).contains(m.cursor_elapsed_us(s.cursor)));
    CHECK(std::llabs(column(s) - col0) <= 1);
  }
  CHECK(zooms == max_zoom(m.span_us(), timeline_columns(s.screen)));
  CHECK(s.message.find("limit") != std::string::npos);
  s = press(s, U"-");
  CHECK(s.cursor == oom);
  CHECK(s.active_zoom == zooms - 1);
  // Right / left: to the next / previous column's moment; the other views show the same cursor.
  s = reduce(s, Key::of(KeyCode::home), m);
  CHECK(s.cursor == 0);
  CHECK(active_window(s, m).start_us == 0);
  s = reduce(s, Key::of(KeyCode::right), m);
  const std::size_t first = s.cursor;
  CHECK(first == step_bucket(m, active_window(s, m), 0, true, BucketMoment::peak));
  CHECK(first > 0);
  ViewState live = press(s, U"4");
  CHECK(live.cursor == first);
  CHECK(render(live, m, live.screen).row_text(0).find(fmt::format("entry {}/", first)) != std::string::npos);
  s = reduce(s, Key::of(KeyCode::left), m);
  CHECK(s.cursor < first);
  // Pan: the window moves by half its span and the cursor keeps its column.
  const TimeWindow w = active_window(s, m);
  const std::int64_t col = std::clamp<std::int64_t>(w.column_of(m.cursor_elapsed_us(s.cursor)), 0, w.columns - 1);
  s = reduce(s, Key::of(KeyCode::page_down), m);
  CHECK(active_window(s, m).start_us == w.start_us + w.span_us / 2);
  CHECK(s.cursor == bucket_at(m, active_window(s, m), col, BucketMoment::peak).shown);
  // A jump from another view scrolls the window to show the cursor.
  s = press(s, U"4p7");
  CHECK(s.cursor == m.peak_reserved_cursor());
  CHECK(active_window(s, m).contains(m.cursor_elapsed_us(s.cursor)));
  // g: call site -> function (-> op when recorded); e: bucket peak <-> end; 0: the whole trace.
  s = press(s, U"g");
  CHECK(s.group_by == GroupBy::function);
  CHECK(render(s, m, s.screen).row_text(2).find("live by function") != std::string::npos);
  s = press(s, U"e");
  CHECK(s.active_moment == BucketMoment::end);
  CHECK(render(s, m, s.screen).to_text().find("shown at its end") != std::string::npos);
  s = press(s, U"0");
  CHECK(s.active_zoom == 0);
  CHECK(active_window(s, m).span_us == m.span_us());
}
