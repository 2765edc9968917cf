// TimeWindow: the part of a trace's time the Active view shows, cut into `columns` time buckets of
// (nearly) equal width. Times are microseconds since the trace's first entry
// (ViewerModel::elapsed_us_of, made non-decreasing). Bucket k covers [edge_us(k), edge_us(k + 1))
// with edge_us(k) = start_us + ceil(k * span_us / columns). k may lie outside [0, columns): the
// grid continues past the window's edges, which is how the cursor moves bucket by bucket beyond
// them. When a window spans fewer microseconds than it has columns, some buckets are empty and
// repeat their neighbour's moment.
//
// A bucket holds the cursors whose last applied entry is stamped inside it (cursor 0, before any
// entry, belongs to the bucket of time 0). The moment a column shows is one of them: by default
// the bucket's peak (its cursor with the most allocated bytes, so a training step shorter than a
// column still shows its peak and what held it), or its end (the cursor after every entry stamped
// before edge_us(k + 1)). An empty bucket shows the moment carried into it. The zoom level halves
// the span per step, from the whole trace (level 0) down to one microsecond per column.
//
// Invariants: span_us >= 1; columns >= 1; start_us + span_us <= the trace's span when the window
// is narrower than the trace (make_window clamps it).
// Thread-safety: a plain value and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpumem/view/viewer_model.h"

namespace gpumem::view {

struct TimeWindow {
  std::int64_t start_us = 0;
  std::int64_t span_us = 1;
  int columns = 1;

  // Where bucket k begins (bucket k + 1's begin is where it ends).
  std::int64_t edge_us(std::int64_t k) const noexcept;
  // The bucket holding time t (may be < 0 or >= columns).
  std::int64_t column_of(std::int64_t t_us) const noexcept;
  bool contains(std::int64_t t_us) const noexcept { return t_us >= start_us && t_us - start_us < span_us; }
  std::int64_t end_us() const noexcept { return start_us + span_us; }
};

// The deepest zoom level: the span it gives is still at least min(trace span, columns) us.
int max_zoom(std::int64_t trace_span_us, int columns) noexcept;
// The span of zoom level `zoom` (clamped to 0..max_zoom): ceil(trace span / 2^zoom).
std::int64_t zoomed_span_us(std::int64_t trace_span_us, int columns, int zoom) noexcept;
// The window of that zoom level starting at start_us, moved to lie inside the trace.
TimeWindow make_window(std::int64_t trace_span_us, int columns, int zoom, std::int64_t start_us) noexcept;

enum class BucketMoment : std::uint8_t { peak, end };
const char* bucket_moment_name(BucketMoment m) noexcept;  // "peak", "end"

// One column: its cursors [first, last] (none when empty), the moment it shows, and the most
// allocated bytes at any of its cursors (the carried-in moment's bytes when empty).
struct Bucket {
  std::int64_t column = 0;
  bool empty = true;
  std::size_t first = 0, last = 0;
  std::size_t shown = 0;
  std::uint64_t peak_bytes = 0;
};

// Bucket k of the window's grid (k may lie outside the window). O(log entries + kPeakBlock +
// bucket entries / kPeakBlock).
Bucket bucket_at(const ViewerModel& model, const TimeWindow& window, std::int64_t k, BucketMoment moment);
// The window's columns in order; their `shown` moments are non-decreasing.
std::vector<Bucket> window_buckets(const ViewerModel& model, const TimeWindow& window, BucketMoment moment);
// The cursor moved to the moment the next (forward) or previous column shows; a column whose
// moment the cursor already passed is stepped over. Stays put at the trace's ends.
std::size_t step_bucket(const ViewerModel& model, const TimeWindow& window, std::size_t cursor, bool forward,
                        BucketMoment moment);

}  // namespace gpumem::view
