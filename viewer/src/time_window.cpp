#include "gpumem/view/time_window.h"

#include <algorithm>

namespace gpumem::view {
namespace {

// floor(a / b) for b > 0.
std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

}  // namespace

std::int64_t TimeWindow::edge_us(std::int64_t k) const noexcept {
  return start_us - floor_div(-k * span_us, columns);  // start + ceil(k * span / columns)
}

std::int64_t TimeWindow::column_of(std::int64_t t_us) const noexcept {
  return floor_div((t_us - start_us) * columns, span_us);
}

int max_zoom(std::int64_t trace_span_us, int columns) noexcept {
  const std::int64_t floor_span = std::max<std::int64_t>(1, std::min<std::int64_t>(trace_span_us, columns));
  const auto span_at = [&](int z) { return (trace_span_us + (std::int64_t{1} << z) - 1) >> z; };
  int z = 0;
  // Each level must shrink the span and keep it at least floor_span.
  while (z < 62 && span_at(z + 1) < span_at(z) && span_at(z + 1) >= floor_span) ++z;
  return z;
}

std::int64_t zoomed_span_us(std::int64_t trace_span_us, int columns, int zoom) noexcept {
  trace_span_us = std::max<std::int64_t>(1, trace_span_us);
  const int z = std::clamp(zoom, 0, max_zoom(trace_span_us, columns));
  return (trace_span_us + (std::int64_t{1} << z) - 1) >> z;
}

TimeWindow make_window(std::int64_t trace_span_us, int columns, int zoom, std::int64_t start_us) noexcept {
  TimeWindow w;
  w.columns = std::max(1, columns);
  w.span_us = zoomed_span_us(trace_span_us, w.columns, zoom);
  w.start_us = std::clamp<std::int64_t>(start_us, 0, std::max<std::int64_t>(0, trace_span_us - w.span_us));
  return w;
}

const char* bucket_moment_name(BucketMoment m) noexcept { return m == BucketMoment::peak ? "peak" : "end"; }

Bucket bucket_at(const ViewerModel& model, const TimeWindow& window, std::int64_t k, BucketMoment moment) {
  Bucket b;
  b.column = k;
  const std::size_t begin = model.applied_before_us(window.edge_us(k));
  const std::size_t end = model.applied_before_us(window.edge_us(k + 1));
  // Cursor c >= 1 is in the bucket of entry c - 1: begin < c <= end. Cursor 0 is in time 0's.
  b.first = window.column_of(0) == k ? 0 : begin + 1;
  b.last = end;
  b.empty = b.first > b.last;
  if (b.empty) {
    b.shown = end;
    b.peak_bytes = model.allocated_at(end);
    return b;
  }
  const std::size_t peak = model.peak_allocated_cursor_in(b.first, b.last);
  b.peak_bytes = model.allocated_at(peak);
  b.shown = moment == BucketMoment::peak ? peak : b.last;
  return b;
}

std::vector<Bucket> window_buckets(const ViewerModel& model, const TimeWindow& window, BucketMoment moment) {
  std::vector<Bucket> out;
  out.reserve(static_cast<std::size_t>(window.columns));
  for (int k = 0; k < window.columns; ++k) out.push_back(bucket_at(model, window, k, moment));
  return out;
}

std::size_t step_bucket(const ViewerModel& model, const TimeWindow& window, std::size_t cursor, bool forward,
                        BucketMoment moment) {
  const std::size_t n = model.entry_count();
  const Bucket own = bucket_at(model, window, window.column_of(model.cursor_elapsed_us(cursor)), moment);
  if (forward) {
    if (own.shown > cursor) return own.shown;
    if (own.last >= n) return cursor;
    // Entry own.last is the first one after this bucket: its bucket is the next non-empty one.
    return bucket_at(model, window, window.column_of(model.elapsed_us_of(own.last)), moment).shown;
  }
  if (own.shown < cursor) return own.shown;
  if (own.first == 0) return cursor;
  return bucket_at(model, window, window.column_of(model.cursor_elapsed_us(own.first - 1)), moment).shown;
}

}  // namespace gpumem::view
