#include <algorithm>

#include "gpumem/view/pinned_segments.h"
#include "gpumem/view/view_state.h"

namespace gpumem::view {

const char* view_title(View v) noexcept {
  switch (v) {
    case View::summary: return "Summary";
    case View::segments: return "Segments";
    case View::timeline: return "Timeline";
    case View::live: return "Live";
    case View::pins: return "Pins";
    case View::diff: return "Diff";
    case View::active: return "Active";
  }
  return "?";
}

int timeline_columns(Size screen) noexcept { return std::max(1, screen.width - kTimelineLabelWidth - 1); }

std::size_t timeline_step(const ViewerModel& model, Size screen) noexcept {
  const auto cols = static_cast<std::size_t>(timeline_columns(screen));
  return std::max<std::size_t>(1, (model.entry_count() + cols) / cols);
}

TimeWindow active_window(const ViewState& state, const ViewerModel& model) noexcept {
  return make_window(model.span_us(), timeline_columns(state.screen), state.active_zoom, state.active_start_us);
}

ViewState initial_state(const ViewerModel& model, Size screen) {
  ViewState s;
  s.screen = screen;
  s.cursor = model.initial_cursor();
  if (model.oom_cursor()) {
    // At an OOM the segment map opens on the largest free extent: the one the request missed.
    const MemoryState state = model.state_at(s.cursor);
    std::size_t index = 0;
    std::uint64_t best = 0;
    for (const auto& [addr, seg] : state.segments) {
      for (const auto& x : extents_of(state, addr, seg)) {
        if (!x.live && x.size_bytes > best) {
          best = x.size_bytes;
          s.extent_index = index;
        }
        ++index;
      }
    }
  }
  return s;
}

namespace {

std::size_t step_back(std::size_t v, std::size_t by) { return v > by ? v - by : 0; }

// call site -> function -> op (when the file records ops) -> call site.
GroupBy next_grouping(GroupBy by, const ViewerModel& model) {
  switch (by) {
    case GroupBy::call_site: return GroupBy::function;
    case GroupBy::function: return model.has_ops() ? GroupBy::op : GroupBy::call_site;
    case GroupBy::op: return GroupBy::call_site;
  }
  return GroupBy::call_site;
}

std::size_t extent_count(const MemoryState& state) {
  std::size_t n = 0;
  for (const auto& [addr, seg] : state.segments) n += extents_of(state, addr, seg).size();
  return n;
}

// Index of the first extent of the segment before / after the one holding extent `index`.
std::size_t neighbour_segment_extent(const MemoryState& state, std::size_t index, bool forward) {
  std::vector<std::size_t> starts;  // first extent index of every segment
  std::size_t n = 0;
  for (const auto& [addr, seg] : state.segments) {
    starts.push_back(n);
    n += extents_of(state, addr, seg).size();
  }
  if (starts.empty()) return 0;
  auto it = std::upper_bound(starts.begin(), starts.end(), index);  // next segment's start
  const std::size_t cur = static_cast<std::size_t>(it - starts.begin()) - 1;
  if (forward) return cur + 1 < starts.size() ? starts[cur + 1] : starts[cur];
  return cur > 0 ? starts[cur - 1] : starts[0];
}

// Scrolls the Active view's window to show the cursor, centred on it when it was outside.
void follow_cursor(ViewState& s, const ViewerModel& model) {
  const TimeWindow w = active_window(s, model);
  const std::int64_t t = model.cursor_elapsed_us(s.cursor);
  s.active_start_us = w.contains(t) ? w.start_us : t - w.span_us / 2;
  s.active_start_us = active_window(s, model).start_us;
}

// The Active view's own keys: time zoom and pan, the cursor bucket by bucket, the grouping.
bool reduce_active(ViewState& s, const Key& key, const ViewerModel& model) {
  const std::size_t n = model.entry_count();
  const TimeWindow w = active_window(s, model);
  const std::int64_t t = model.cursor_elapsed_us(s.cursor);
  const bool chr = key.code == KeyCode::character;
  if (chr && (key.ch == U'+' || key.ch == U'=' || key.ch == U'-')) {
    const int z = std::clamp(s.active_zoom + (key.ch == U'-' ? -1 : 1), 0, max_zoom(model.span_us(), w.columns));
    if (z == s.active_zoom) {
      s.message = key.ch == U'-' ? "the whole trace is shown" : "zoomed in to the limit: one microsecond per column";
      return true;
    }
    // Zoom about the cursor: its moment keeps its place on the screen (or is centred when it was
    // outside the window); the cursor itself does not move.
    const std::int64_t span = zoomed_span_us(model.span_us(), w.columns, z);
    const auto offset = static_cast<std::int64_t>(static_cast<long double>(t - w.start_us) * static_cast<long double>(span) /
                                                  static_cast<long double>(w.span_us));
    s.active_zoom = z;
    s.active_start_us = w.contains(t) ? t - offset : t - span / 2;
    s.active_start_us = active_window(s, model).start_us;
    return true;
  }
  if (chr && key.ch == U'0') {
    s.active_zoom = 0;
    s.active_start_us = 0;
    return true;
  }
  if (chr && key.ch == U'g') {
    s.group_by = next_grouping(s.group_by, model);
    return true;
  }
  if (chr && key.ch == U'e') {
    s.active_moment = s.active_moment == BucketMoment::peak ? BucketMoment::end : BucketMoment::peak;
    s.message = s.active_moment == BucketMoment::peak ? "each column shows its bucket's peak (e: its end)"
                                                      : "each column shows its bucket's end (e: its peak)";
    return true;
  }
  if (key.code == KeyCode::left || (chr && key.ch == U'[')) {
    s.cursor = step_bucket(model, w, s.cursor, false, s.active_moment);
  } else if (key.code == KeyCode::right || (chr && key.ch == U']')) {
    s.cursor = step_bucket(model, w, s.cursor, true, s.active_moment);
  } else if (key.code == KeyCode::page_up || key.code == KeyCode::page_down) {
    // Pan half a window; the cursor keeps its column (the end of that column's bucket).
    const std::int64_t half = std::max<std::int64_t>(1, w.span_us / 2);
    const TimeWindow moved =
        make_window(model.span_us(), w.columns, s.active_zoom, w.start_us + (key.code == KeyCode::page_up ? -half : half));
    if (moved.start_us == w.start_us) {
      s.message = key.code == KeyCode::page_up ? "the window is at the start of the trace" : "the window is at the end of the trace";
      return true;
    }
    const std::int64_t column = std::clamp<std::int64_t>(w.column_of(t), 0, w.columns - 1);
    s.active_start_us = moved.start_us;
    s.cursor = bucket_at(model, moved, column, s.active_moment).shown;
    return true;
  } else if (key.code == KeyCode::home) {
    s.cursor = 0;
  } else if (key.code == KeyCode::end) {
    s.cursor = n;
  } else {
    return false;
  }
  follow_cursor(s, model);
  return true;
}

bool move_cursor(ViewState& s, const Key& key, const ViewerModel& model) {
  const std::size_t n = model.entry_count();
  if (key.code != KeyCode::character) return false;
  switch (key.ch) {
    case U',': s.cursor = step_back(s.cursor, 1); return true;
    case U'.': s.cursor = std::min(n, s.cursor + 1); return true;
    case U'[': s.cursor = step_back(s.cursor, timeline_step(model, s.screen)); return true;
    case U']': s.cursor = std::min(n, s.cursor + timeline_step(model, s.screen)); return true;
    case U'p': s.cursor = model.peak_reserved_cursor(); return true;
    case U'a': s.cursor = model.peak_allocated_cursor(); return true;
    case U'o':
      if (model.oom_cursor()) {
        s.cursor = *model.oom_cursor();
      } else {
        s.message = "this trace has no OOM";
      }
      return true;
    case U'm':
      s.mark = s.cursor;
      s.message = "marked entry " + std::to_string(s.cursor) + " (the Diff view compares it with the cursor)";
      return true;
    default: return false;
  }
}

void reduce_search(ViewState& s, const Key& key) {
  switch (key.code) {
    case KeyCode::enter: s.editing_search = false; break;
    case KeyCode::escape:
      s.editing_search = false;
      s.search.clear();
      break;
    case KeyCode::backspace:
      if (!s.search.empty()) {
        // Drop one UTF-8 code point.
        std::size_t i = s.search.size() - 1;
        while (i > 0 && (static_cast<unsigned char>(s.search[i]) & 0xC0) == 0x80) --i;
        s.search.resize(i);
      }
      break;
    case KeyCode::character:
      if (key.ch >= 0x20 && key.ch != 0x7f) append_utf8(s.search, key.ch);
      break;
    default: break;
  }
  s.live_row = 0;
}

}  // namespace

ViewState reduce(ViewState s, const Key& key, const ViewerModel& model) {
  s.message.clear();
  if (key.code == KeyCode::resize) {
    s.screen = key.size;
    return s;
  }
  if (s.editing_search) {
    reduce_search(s, key);
    return s;
  }
  if (key.code == KeyCode::character && key.ch == U'q') {
    s.quit = true;
    return s;
  }
  if (s.help) {
    s.help = false;  // any other key closes the help
    return s;
  }
  if (key.code == KeyCode::character) {
    if (key.ch == U'?') {
      s.help = true;
      return s;
    }
    if (key.ch >= U'1' && key.ch < U'1' + kViewCount) {
      s.view = static_cast<View>(key.ch - U'1');
      return s;
    }
  }
  if (key.code == KeyCode::tab) {
    s.view = static_cast<View>((static_cast<int>(s.view) + 1) % kViewCount);
    return s;
  }
  // The Diff view of two files: with b pressed, the stepping keys move B's cursor in B's trace.
  if (s.view == View::diff && model.compare && s.diff_moves_b &&
      !(key.code == KeyCode::character && key.ch == U'm')) {
    ViewState b = s;
    b.cursor = s.compare_cursor.value_or(model.compare->initial_cursor());
    if (move_cursor(b, key, *model.compare)) {
      s.compare_cursor = b.cursor;
      s.message = b.message;
      return s;
    }
  }
  if (s.view == View::active && reduce_active(s, key, model)) return s;
  if (move_cursor(s, key, model)) {
    follow_cursor(s, model);
    return s;
  }

  const std::size_t n = model.entry_count();
  switch (s.view) {
    case View::summary: break;
    case View::timeline: {
      const std::size_t step = timeline_step(model, s.screen);
      if (key.code == KeyCode::left) s.cursor = step_back(s.cursor, step);
      if (key.code == KeyCode::right) s.cursor = std::min(n, s.cursor + step);
      if (key.code == KeyCode::page_up) s.cursor = step_back(s.cursor, step * 10);
      if (key.code == KeyCode::page_down) s.cursor = std::min(n, s.cursor + step * 10);
      if (key.code == KeyCode::home) s.cursor = 0;
      if (key.code == KeyCode::end) s.cursor = n;
      follow_cursor(s, model);
      break;
    }
    case View::segments: {
      if (key.code == KeyCode::character && (key.ch == U'+' || key.ch == U'=')) s.zoom_in = std::min(s.zoom_in + 1, 40);
      if (key.code == KeyCode::character && key.ch == U'-') s.zoom_in = std::max(s.zoom_in - 1, -20);
      if (key.code == KeyCode::character && key.ch == U'0') s.zoom_in = 0;
      if (key.code == KeyCode::enter) {
        // What pins the selected extent's segment.
        const MemoryState state = model.state_at(s.cursor);
        std::size_t index = 0;
        std::uint64_t seg_addr = 0;
        bool found = false;
        for (const auto& [addr, seg] : state.segments) {
          const std::size_t n_ext = extents_of(state, addr, seg).size();
          if (s.extent_index < index + n_ext) {
            seg_addr = addr;
            found = true;
            break;
          }
          index += n_ext;
        }
        if (!found) break;
        const auto pins = pinned_segments(state);
        for (std::size_t i = 0; i < pins.size(); ++i) {
          if (pins[i].addr == seg_addr) {
            s.view = View::pins;
            s.pin_row = i;
            return s;
          }
        }
        s.message = segment_has_live_block(state, seg_addr)
                        ? "live blocks fill this segment: it holds no free memory, nothing is pinned"
                        : "no live block pins this segment: empty_cache would release it";
        break;
      }
      const bool moves = key.code == KeyCode::left || key.code == KeyCode::right || key.code == KeyCode::up ||
                         key.code == KeyCode::down || key.code == KeyCode::home || key.code == KeyCode::end;
      if (!moves) break;
      const MemoryState state = model.state_at(s.cursor);
      const std::size_t count = extent_count(state);
      if (count == 0) {
        s.extent_index = 0;
        break;
      }
      s.extent_index = std::min(s.extent_index, count - 1);
      if (key.code == KeyCode::left) s.extent_index = step_back(s.extent_index, 1);
      if (key.code == KeyCode::right) s.extent_index = std::min(count - 1, s.extent_index + 1);
      if (key.code == KeyCode::up) s.extent_index = neighbour_segment_extent(state, s.extent_index, false);
      if (key.code == KeyCode::down) s.extent_index = neighbour_segment_extent(state, s.extent_index, true);
      if (key.code == KeyCode::home) s.extent_index = 0;
      if (key.code == KeyCode::end) s.extent_index = count - 1;
      break;
    }
    case View::live: {
      if (key.code == KeyCode::character && key.ch == U'/') {
        s.editing_search = true;
        break;
      }
      if (key.code == KeyCode::character && key.ch == U's') {
        s.sort_by = s.sort_by == SortBy::bytes ? SortBy::count : SortBy::bytes;
        break;
      }
      if (key.code == KeyCode::character && key.ch == U'g') {
        s.group_by = next_grouping(s.group_by, model);
        s.live_row = 0;
        break;
      }
      if (key.code == KeyCode::escape) {
        s.search.clear();
        break;
      }
      const std::size_t page = static_cast<std::size_t>(std::max(1, s.screen.height - 6));
      std::size_t row = s.live_row;
      if (key.code == KeyCode::up) row = step_back(row, 1);
      if (key.code == KeyCode::down) ++row;
      if (key.code == KeyCode::page_up) row = step_back(row, page);
      if (key.code == KeyCode::page_down) row += page;
      if (key.code == KeyCode::home) row = 0;
      if (key.code == KeyCode::end) row = SIZE_MAX;
      if (row != s.live_row) {
        const auto groups = live_groups(model, model.state_at(s.cursor), s.group_by, s.sort_by, s.search);
        s.live_row = groups.empty() ? 0 : std::min(row, groups.size() - 1);
      }
      break;
    }
    case View::pins: {
      std::size_t row = s.pin_row;
      if (key.code == KeyCode::up) row = step_back(row, 1);
      if (key.code == KeyCode::down) ++row;
      if (key.code == KeyCode::home) row = 0;
      if (key.code == KeyCode::end) row = SIZE_MAX;
      if (row != s.pin_row) {
        const auto pins = pinned_segments(model.state_at(s.cursor));
        s.pin_row = pins.empty() ? 0 : std::min(row, pins.size() - 1);
      }
      break;
    }
    case View::diff:
      if (key.code == KeyCode::character && key.ch == U'g') s.group_by = next_grouping(s.group_by, model);
      if (key.code == KeyCode::character && key.ch == U'b') {
        if (model.compare) {
          s.diff_moves_b = !s.diff_moves_b;
          s.message = s.diff_moves_b ? "the stepping keys move B's cursor (b: back to A's)"
                                     : "the stepping keys move A's cursor (b: B's)";
        } else {
          s.message = "b moves the second file's cursor: open two files (gpumem view A --diff B)";
        }
      }
      break;
    case View::active: break;  // reduce_active
  }
  return s;
}

}  // namespace gpumem::view
