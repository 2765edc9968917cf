#include "gpumem/view/render.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include <fmt/format.h>

#include "gpumem/view/active_memory.h"
#include "gpumem/view/live_groups.h"
#include "gpumem/view/pinned_segments.h"
#include "gpumem/view/summary.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/vocabulary.h"

namespace gpumem::view {
namespace {

constexpr std::string_view kHelpKeys =
    "Views: 1 Summary 2 Segments 3 Timeline 4 Live 5 Pins 6 Diff 7 Active (Tab)\n"
    "Trace cursor (every view shows the memory after the cursor's entry):\n"
    "  , .     one entry back / forward\n"
    "  [ ]     one timeline column back / forward (Timeline: Left / Right,\n"
    "          PgUp / PgDn; Active: one of its columns)\n"
    "  p a o   jump to the peak of reserved / the peak of allocated / the OOM\n"
    "  m       mark the cursor (Diff compares the mark with the cursor)\n"
    "\n"
    "Segments: Left / Right block  Up / Down segment  + - zoom  0 fit\n"
    "          Enter: what pins the selected block's segment (the Pins view)\n"
    "  █ allocated  ▓ free in a partly used 2 MiB granule  ▒ inactive split\n"
    "  ░ cached free  · reserved address space of an expandable segment, unmapped\n"
    "Live:     Up / Down select  s sort by bytes / count  / search (Enter keeps,\n"
    "          Esc clears)  g group by call site / function / op\n"
    "Pins:     Up / Down select a segment; its live blocks keep it reserved\n"
    "Diff:     g group  b: with two files (--diff), the stepping keys move B's\n"
    "          cursor instead of A's (each file is compared at its own cursor)\n"
    "Active:   live bytes over time by group (g)  + - zoom in time  0 whole trace\n"
    "          PgUp / PgDn pan  Left / Right one column  e: columns at peak / end\n"
    "?  this help (any key closes it)     q  quit";

const char* help_line(const ViewState& s) {
  switch (s.view) {
    case View::summary: return "1-6 views  , . step  p a peaks  o OOM  m mark";
    case View::segments: return "←→ block  ↑↓ segment  Enter what pins it  + - zoom  0 fit  , . step  p a o jump";
    case View::timeline: return "←→ move  PgUp PgDn  Home End  p peak reserved  a peak allocated  o OOM  m mark";
    case View::live: return "↑↓ select  s sort  g group  / search  , . step  p a o jump";
    case View::pins: return "↑↓ segment  , . step  p a o jump";
    case View::diff: return "m mark  g group  b A/B cursor  , . step  p a o jump";
    case View::active: return "←→ column  + - zoom  0 all  PgUp PgDn pan  g group  e peak/end  p a o";
  }
  return "? help  q quit";
}

std::string hex(std::uint64_t v) { return fmt::format("0x{:x}", v); }
// The marker of a private pool's memory in segment lists and the selection line.
std::string pool_marker(std::pair<std::int64_t, std::int64_t> pool_id) { return forensics::pool_label(pool_id); }

// The body's area: rows [top, top + rows).
struct Area {
  int top = 2;
  int rows = 0;
  int width = 0;
};

void draw_frame(CellGrid& g, const ViewState& s, const ViewerModel& model) {
  const int w = g.width();
  g.fill_row(0, U' ', Style::title);
  const std::string& src = model.source();
  const auto slash = src.find_last_of('/');
  const std::string file = slash == std::string::npos ? src : src.substr(slash + 1);
  const std::string oom = model.oom_cursor() && *model.oom_cursor() == s.cursor ? " │ OOM" : "";
  const std::string at = fmt::format("{}/{} │ +{}", s.cursor, model.entry_count(),
                                     format_us(model.time_us_at(s.cursor) - model.time_us_at(0)));
  const std::string totals = fmt::format("alloc {} │ reserved {}", format_bytes(model.allocated_at(s.cursor)),
                                         format_bytes(model.reserved_at(s.cursor)));
  // The longest that fits: the program's name goes first, then the word "entry"; at last the
  // numbers lead and the file name is what the width cuts (80 columns keep every number).
  const std::string candidates[] = {
      fmt::format(" gpumem │ {} │ entry {} │ {}{}", file, at, totals, oom),
      fmt::format(" {} │ entry {} │ {}{}", file, at, totals, oom),
      fmt::format(" {} │ {}{} │ {}", at, totals, oom, file),
  };
  std::string title = candidates[2];
  for (const auto& c : candidates) {
    if (static_cast<int>(decode_utf8(c).size()) <= w) {
      title = c;
      break;
    }
  }
  g.put(0, 0, title, Style::title);
  int x = 0;
  for (int v = 0; v < kViewCount; ++v) {
    const bool on = static_cast<int>(s.view) == v;
    x = g.put(x, 1, fmt::format(" {} {} ", v + 1, view_title(static_cast<View>(v))), on ? Style::tab_active : Style::tab);
    x = g.put(x, 1, " ", Style::normal);
  }
  const int last = g.height() - 1;
  g.fill_row(last, U' ', Style::help);
  if (s.editing_search) {
    g.put(0, last, fmt::format(" /{}▏   Enter keep  Esc clear", s.search), Style::help);
  } else if (!s.message.empty()) {
    g.put(0, last, " " + s.message, Style::warn);
  } else {
    // The view's keys, clipped so that "? help  q quit" always shows at the right.
    constexpr std::string_view kTail = "? help  q quit ";
    const int tail_x = std::max(0, w - static_cast<int>(decode_utf8(kTail).size()));
    g.put(0, last, std::string(" ") + help_line(s), Style::help, std::max(0, tail_x - 1));
    g.put(tail_x, last, kTail, Style::help);
  }
}

// Writes text word-wrapped to the area's width; returns the rows used (stops at max_y).
int put_wrapped(CellGrid& g, int x, int y, int max_y, std::string_view text, Style style) {
  const int width = std::max(10, g.width() - x - 1);
  int rows = 0;
  while (!text.empty() && y + rows < max_y) {
    std::size_t take = text.size();
    if (decode_utf8(text).size() > static_cast<std::size_t>(width)) {
      take = static_cast<std::size_t>(width);
      const auto space = text.substr(0, take).find_last_of(' ');
      if (space != std::string_view::npos && space > 0) take = space;
    }
    g.put(x, y + rows, text.substr(0, take), style);
    text.remove_prefix(take);
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    ++rows;
  }
  return rows;
}

// A label padded to a column, then a value.
void kv(CellGrid& g, int y, std::string_view key, const std::string& value, Style vs = Style::emphasis) {
  const int x = g.put(2, y, key, Style::normal);
  g.put(std::max(x + 1, 28), y, value, vs);
}

void draw_summary(CellGrid& g, const Area& a, const ViewState& s, const ViewerModel& model, const MemoryState& state) {
  const Summary sum = summarize(model, state, s.cursor);
  int y = a.top;
  const int end = a.top + a.rows;
  auto line = [&](auto&& fn) {
    if (y < end) fn(y);
    ++y;
  };
  if (sum.oom) {
    line([&](int r) { g.put(1, r, "OOM verdict", Style::warn); });
    y += put_wrapped(g, 2, y, end, sum.verdict, Style::warn);
    y += put_wrapped(g, 2, y, end, sum.verdict_detail, Style::normal);
    line([&](int r) { g.put(2, r, sum.verdict_source, Style::dim); });
    line([](int) {});
  } else {
    line([&](int r) { g.put(1, r, "No OOM in this trace", Style::dim); });
    line([](int) {});
  }
  line([&](int r) {
    g.put(1, r, fmt::format("At the cursor: entry {} of {}, t +{}", s.cursor, model.entry_count(), format_us(sum.t_us)),
          Style::title);
  });
  line([&](int r) { kv(g, r, "allocated", format_bytes(sum.allocated_bytes)); });
  line([&](int r) { kv(g, r, "reserved", format_bytes(sum.reserved_bytes)); });
  line([&](int r) { kv(g, r, "reserved-unallocated", format_bytes(sum.reserved_unallocated_bytes)); });
  line([&](int r) { kv(g, r, "largest free extent", format_bytes(sum.largest_free_extent_bytes)); });
  if (sum.oom) {
    line([&](int r) {
      kv(g, r, "OOM request", format_bytes(sum.oom->requested_bytes) +
                                  (sum.oom->device_free_bytes
                                       ? fmt::format("   (device free {})", format_bytes(*sum.oom->device_free_bytes))
                                       : std::string()),
         Style::warn);
    });
  }
  line([&](int r) { kv(g, r, "segments / live blocks", fmt::format("{} / {}", sum.segment_count, sum.live_block_count)); });
  if (sum.outside_segment_block_count > 0) {
    y += put_wrapped(g, 2, y, end,
                     fmt::format("{} of the live blocks ({}) lie in no segment the file records (its trace began "
                                 "after they were reserved, or it has no segment entries): allocated counts them, "
                                 "reserved cannot",
                                 sum.outside_segment_block_count, format_bytes(sum.outside_segment_bytes)),
                     Style::warn);
  }
  line([](int) {});
  line([&](int r) { g.put(1, r, "Over the trace", Style::title); });
  line([&](int r) {
    kv(g, r, "peak allocated", fmt::format("{}  at entry {}  (a)", format_bytes(sum.peak_allocated_bytes), model.peak_allocated_cursor()));
  });
  line([&](int r) {
    kv(g, r, "peak reserved", fmt::format("{}  at entry {}  (p)", format_bytes(sum.peak_reserved_bytes), model.peak_reserved_cursor()));
  });
  line([&](int r) {
    const double ratio = sum.peak_allocated_bytes ? static_cast<double>(sum.peak_reserved_bytes) / static_cast<double>(sum.peak_allocated_bytes) : 0.0;
    kv(g, r, "peak reserved / allocated", fmt::format("{:.3f}", ratio));
  });
  line([&](int r) {
    kv(g, r, "entries / duration", fmt::format("{} / {}", model.entry_count(), format_us(model.trace().duration_us())));
  });
  if (!sum.advice.empty()) {
    line([](int) {});
    line([&](int r) { g.put(1, r, "Advice (forensics OOM report)", Style::title); });
    for (const auto& a : sum.advice) y += put_wrapped(g, 2, y, end, "• " + a, Style::normal);
  }
  if (!sum.evidence.empty()) {
    line([](int) {});
    line([&](int r) { g.put(1, r, "Evidence (forensics OOM report)", Style::title); });
    for (const auto& e : sum.evidence) y += put_wrapped(g, 2, y, end, "• " + e, Style::normal);
  }
  if (const auto& t = model.snapshot_totals()) {
    line([](int) {});
    line([&](int r) { g.put(1, r, "Snapshot segments (exact, at the end)", Style::title); });
    line([&](int r) { kv(g, r, "reserved", format_bytes(t->reserved_bytes)); });
    line([&](int r) { kv(g, r, "allocated", format_bytes(t->allocated_bytes)); });
    line([&](int r) { kv(g, r, "reserved-unallocated", format_bytes(t->reserved_bytes - std::min(t->reserved_bytes, t->allocated_bytes))); });
    line([&](int r) { kv(g, r, "largest inactive block", format_bytes(t->largest_inactive_bytes)); });
    line([&](int r) { kv(g, r, "segments / blocks", fmt::format("{} / {}", t->segment_count, t->block_count)); });
  }
}

// ---- segment map ----

// One run of the map: a segment, or (unmapped) reserved address space of an expandable segment
// with nothing mapped. `joined` pieces continue the previous one without a separating blank cell.
struct Piece {
  std::uint64_t addr = 0;
  std::uint64_t size_bytes = 0;
  const SegmentInfo* seg = nullptr;  // null: unmapped
  bool joined = false;
};

std::vector<Piece> map_pieces(const MemoryState& state) {
  std::vector<Piece> out;
  out.reserve(state.segments.size() + state.expandable_va.size() * 2);
  for (const auto& [addr, seg] : state.segments) {
    if (!seg.expandable) out.push_back(Piece{addr, seg.size_bytes, &seg, false});
  }
  for (const auto& [lo, hi] : state.expandable_va) {
    std::uint64_t at = lo;
    bool first = true;
    for (auto it = state.segments.lower_bound(lo); it != state.segments.end() && it->first < hi; ++it) {
      if (it->first > at) {
        out.push_back(Piece{at, it->first - at, nullptr, !first});
        first = false;
      }
      out.push_back(Piece{it->first, it->second.size_bytes, &it->second, !first});
      first = false;
      at = it->first + it->second.size_bytes;
    }
    if (at < hi) out.push_back(Piece{at, hi - at, nullptr, !first});
  }
  std::stable_sort(out.begin(), out.end(), [](const Piece& a, const Piece& b) { return a.addr < b.addr; });
  return out;
}

struct Placed {
  Piece piece;
  std::size_t first_cell;  // flow position of the piece's first cell
  std::size_t cells;
  std::size_t first_extent;
  std::size_t extents_at;  // index into the extents vector
};

std::size_t cells_for(std::uint64_t bytes, std::uint64_t bpc) {
  return static_cast<std::size_t>(std::max<std::uint64_t>(1, (bytes + bpc - 1) / bpc));
}

std::uint64_t fit_bytes_per_cell(const std::vector<Piece>& pieces, std::size_t capacity) {
  for (int k = 9; k < 62; ++k) {
    const std::uint64_t bpc = std::uint64_t{1} << k;
    std::size_t need = 0;
    for (const auto& p : pieces) need += cells_for(p.size_bytes, bpc) + (p.joined ? 0 : 1);
    if (need <= capacity) return bpc;
  }
  return std::uint64_t{1} << 62;
}

constexpr std::uint64_t kGranuleBytes = 2u << 20;

enum Cat { c_alloc, c_partly, c_split, c_cached, c_unmapped, c_count };

void draw_segments(CellGrid& g, const Area& a, const ViewState& s, const ViewerModel& model, const MemoryState& state) {
  const int w = a.width;
  // The scale and the legend share the first row when they fit in it (about 120 columns), else
  // the legend takes a row of its own so that it stays whole (80 columns).
  const std::string scale_prefix_probe = fmt::format("1 cell = {} │ {} segments │ ", "512.00 KiB", state.segments.size());
  constexpr int kLegendColumns = 81;  // the five glyphs and names below, with their gaps
  const int header_rows =
      1 + static_cast<int>(decode_utf8(scale_prefix_probe).size()) + kLegendColumns + 1 > w ? 1 : 0;
  const int map_rows = std::max(1, a.rows - 2 - header_rows);
  const std::vector<Piece> pieces = map_pieces(state);
  const std::uint64_t fit = fit_bytes_per_cell(pieces, static_cast<std::size_t>(w) * static_cast<std::size_t>(map_rows));
  std::uint64_t bpc = fit;
  if (s.zoom_in > 0) bpc = std::max<std::uint64_t>(512, fit >> std::min(s.zoom_in, 50));
  if (s.zoom_in < 0) bpc = fit << std::min(-s.zoom_in, 20);

  int x = g.put(1, a.top, fmt::format("1 cell = {} │ {} segments", format_bytes(bpc), state.segments.size()), Style::dim);
  if (header_rows == 0) {
    x = g.put(x, a.top, " │ ", Style::dim);
  } else {
    x = 1;
  }
  const int legend_y = a.top + header_rows;
  const struct {
    const char* glyph;
    Style style;
    const char* name;
  } legend[] = {{"█", Style::allocated, "allocated"},     {"▓", Style::partly_used, "partly used granule"},
                {"▒", Style::inactive_split, "inactive split"}, {"░", Style::cached_free, "cached free"},
                {"·", Style::unmapped, "unmapped"}};
  for (const auto& l : legend) {
    x = g.put(x, legend_y, l.glyph, l.style);
    x = g.put(x + 1, legend_y, l.name) + 2;
  }

  // Place the pieces in a flow; find the selected extent.
  std::vector<Placed> placed;
  std::vector<std::vector<Extent>> extents;
  placed.reserve(pieces.size());
  extents.reserve(state.segments.size());
  std::size_t pos = 0, ext = 0;
  for (const auto& p : pieces) {
    if (!p.joined && pos > 0) ++pos;  // a blank cell between segments
    const std::size_t cells = cells_for(p.size_bytes, bpc);
    std::size_t at = SIZE_MAX;
    std::size_t count = 0;
    if (p.seg) {
      extents.push_back(extents_of(state, p.addr, *p.seg));
      at = extents.size() - 1;
      count = extents.back().size();
    }
    placed.push_back(Placed{p, pos, cells, ext, at});
    ext += count;
    pos += cells;
  }
  const std::size_t total_extents = ext;
  const int info_y = a.top + 1 + header_rows;
  if (total_extents == 0) {
    g.put(2, info_y, "no segments are mapped at this point of the trace", Style::dim);
    return;
  }
  const std::size_t sel = std::min(s.extent_index, total_extents - 1);
  // Which piece holds the selection, and where it is.
  std::size_t sel_piece = 0;
  while (!(placed[sel_piece].piece.seg && placed[sel_piece].first_extent <= sel &&
           sel < placed[sel_piece].first_extent + extents[placed[sel_piece].extents_at].size())) {
    ++sel_piece;
  }
  const Placed& ps = placed[sel_piece];
  const auto& sel_extents = extents[ps.extents_at];
  const Extent& sx = sel_extents[sel - ps.first_extent];
  const std::size_t sel_cell = ps.first_cell + static_cast<std::size_t>((sx.addr - ps.piece.addr) / bpc);

  // Info line about the selected extent.
  std::string info;
  const bool seg_has_live = std::any_of(sel_extents.begin(), sel_extents.end(), [](const Extent& e) { return e.live; });
  if (sx.live) {
    const BlockInfo& b = *sx.block;
    const std::string site = model.site(b.site).empty() ? std::string(forensics::kNotRecorded) : model.site(b.site);
    const std::string age = b.entry == 0 && b.t_us == 0 ? "from before the trace"
                                                        : fmt::format("age {} (entry {})", format_us(model.time_us_at(s.cursor) - b.t_us), b.entry);
    info = fmt::format("block {} {} (requested {}) │ {}{} │ {}", hex(sx.addr), format_bytes(sx.size_bytes),
                       format_bytes(b.requested_bytes), b.op ? "op " + model.op_name(b.op) + " │ " : std::string(), site, age);
  } else {
    info = fmt::format("free {} {} │ {} │ segment {} of {}{}", hex(sx.addr), format_bytes(sx.size_bytes),
                       seg_has_live ? "inactive split" : "cached free", hex(ps.piece.addr), format_bytes(ps.piece.size_bytes),
                       ps.piece.seg->expandable ? " (expandable)" : "");
  }
  if (const auto pool = model.pool_of(sx.addr)) info += " │ " + pool_marker(*pool);
  g.put(1, info_y, fmt::format("[{}/{}] {}", sel + 1, total_extents, info), sx.live ? Style::emphasis : Style::normal);

  // Scroll so the selection is visible.
  const std::size_t uw = static_cast<std::size_t>(w);
  const std::size_t sel_row = sel_cell / uw;
  const std::size_t first_row = (sel_row / static_cast<std::size_t>(map_rows)) * static_cast<std::size_t>(map_rows);
  const std::size_t first_pos = first_row * uw;
  const std::size_t last_pos = first_pos + uw * static_cast<std::size_t>(map_rows);
  const int map_top = a.top + 2 + header_rows;

  static constexpr char32_t kGlyph[c_count] = {U'█', U'▓', U'▒', U'░', U'·'};
  static constexpr Style kStyle[c_count] = {Style::allocated, Style::partly_used, Style::inactive_split, Style::cached_free,
                                            Style::unmapped};
  for (const Placed& p : placed) {
    if (p.first_cell + p.cells <= first_pos) continue;
    if (p.first_cell >= last_pos) break;
    static const std::vector<Extent> kNone;
    const auto& xs = p.piece.seg ? extents[p.extents_at] : kNone;
    const bool has_live = std::any_of(xs.begin(), xs.end(), [](const Extent& e) { return e.live; });
    const bool expandable = p.piece.seg && p.piece.seg->expandable;
    std::size_t xi = 0;
    for (std::size_t c = 0; c < p.cells; ++c) {
      const std::size_t fpos = p.first_cell + c;
      if (fpos < first_pos) continue;
      if (fpos >= last_pos) break;
      const int cx = static_cast<int>(fpos % uw);
      const int cy = map_top + static_cast<int>((fpos - first_pos) / uw);
      if (!p.piece.seg) {
        g.set(cx, cy, Cell{kGlyph[c_unmapped], kStyle[c_unmapped]});
        continue;
      }
      const std::uint64_t lo = p.piece.addr + c * bpc;
      const std::uint64_t hi = std::min(p.piece.addr + p.piece.size_bytes, lo + bpc);
      std::uint64_t bytes[c_count] = {0, 0, 0, 0, 0};
      while (xi < xs.size() && xs[xi].addr + xs[xi].size_bytes <= lo) ++xi;
      for (std::size_t k = xi; k < xs.size() && xs[k].addr < hi; ++k) {
        const Extent& e = xs[k];
        const std::uint64_t olo = std::max(lo, e.addr), ohi = std::min(hi, e.addr + e.size_bytes);
        if (ohi <= olo) continue;
        if (e.live) {
          bytes[c_alloc] += ohi - olo;
        } else if (expandable) {
          // Free bytes in a granule that also holds live bytes cannot be unmapped.
          const bool prev_live = k > 0 && xs[k - 1].live;
          const bool next_live = k + 1 < xs.size() && xs[k + 1].live;
          const std::uint64_t head_end = prev_live ? std::min(e.addr + e.size_bytes, (e.addr / kGranuleBytes + 1) * kGranuleBytes) : e.addr;
          const std::uint64_t tail_start = next_live ? std::max(e.addr, (e.addr + e.size_bytes) / kGranuleBytes * kGranuleBytes) : e.addr + e.size_bytes;
          for (std::uint64_t b0 = olo; b0 < ohi;) {
            const bool partly = b0 < head_end || b0 >= tail_start;
            const std::uint64_t b1 = std::min(ohi, b0 < head_end ? head_end : (b0 < tail_start ? tail_start : ohi));
            bytes[partly ? c_partly : c_cached] += b1 - b0;
            b0 = b1;
          }
        } else {
          bytes[has_live ? c_split : c_cached] += ohi - olo;
        }
      }
      int best = c_cached;
      for (int k = 0; k < c_count; ++k) {
        if (bytes[k] > bytes[best]) best = k;
      }
      g.set(cx, cy, Cell{kGlyph[best], kStyle[best]});
    }
  }
  // The selection: every cell the selected extent covers.
  const std::size_t sel_last = ps.first_cell + static_cast<std::size_t>((sx.addr + sx.size_bytes - 1 - ps.piece.addr) / bpc);
  for (std::size_t fpos = sel_cell; fpos <= sel_last; ++fpos) {
    if (fpos < first_pos || fpos >= last_pos) continue;
    g.restyle(static_cast<int>(fpos % uw), map_top + static_cast<int>((fpos - first_pos) / uw), 1, Style::selected);
  }
}

// ---- timeline ----

void draw_timeline(CellGrid& g, const Area& a, const ViewState& s, const ViewerModel& model) {
  const int cols = timeline_columns(Size{a.width, 0});
  const int chart_rows = std::max(1, (a.rows - 6) / 2);
  const std::size_t values = model.entry_count() + 1;
  // One scale for both charts: the reserved peak, or the allocated one where blocks outside every
  // recorded segment make allocated the larger (the bars must never pass the label at the top).
  const std::uint64_t top = std::max<std::uint64_t>({std::uint64_t{1}, model.reserved_at(model.peak_reserved_cursor()),
                                                     model.allocated_at(model.peak_allocated_cursor())});
  const std::size_t step = timeline_step(model, Size{a.width, 0});
  const int cursor_col = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(cols - 1), s.cursor / step));

  g.put(1, a.top, fmt::format("reserved  (peak {} at entry {}, p)", format_bytes(model.reserved_at(model.peak_reserved_cursor())),
                              model.peak_reserved_cursor()), Style::chart_reserved);
  const int alloc_label_y = a.top + 1 + chart_rows;
  g.put(1, alloc_label_y, fmt::format("allocated (peak {} at entry {}, a)", format_bytes(model.allocated_at(model.peak_allocated_cursor())),
                                      model.peak_allocated_cursor()), Style::chart_allocated);
  static constexpr char32_t kEighths[9] = {U' ', U'▁', U'▂', U'▃', U'▄', U'▅', U'▆', U'▇', U'█'};
  auto chart = [&](int y0, bool reserved, Style style) {
    g.put(0, y0, fmt::format("{:>10}", format_bytes(top)), Style::dim);
    g.put(0, y0 + chart_rows - 1, fmt::format("{:>10}", "0"), Style::dim);
    for (int c = 0; c < cols; ++c) {
      const std::size_t lo = static_cast<std::size_t>(c) * step;
      if (lo >= values) break;
      const std::size_t hi = std::min(values, lo + step);
      std::uint64_t v = 0;
      for (std::size_t i = lo; i < hi; ++i) v = std::max(v, reserved ? model.reserved_at(i) : model.allocated_at(i));
      const auto eighths = static_cast<long>(std::llround(static_cast<double>(v) / static_cast<double>(top) * chart_rows * 8));
      for (int r = 0; r < chart_rows; ++r) {
        const long level = std::clamp<long>(eighths - static_cast<long>(chart_rows - 1 - r) * 8, 0, 8);
        const bool at_cursor = c == cursor_col;
        char32_t ch = kEighths[level];
        if (at_cursor && level == 0) ch = U'│';
        g.set(kTimelineLabelWidth + c, y0 + r, Cell{ch, at_cursor ? Style::cursor : style});
      }
    }
  };
  chart(a.top + 1, true, Style::chart_reserved);
  chart(alloc_label_y + 1, false, Style::chart_allocated);
  const int axis_y = alloc_label_y + 1 + chart_rows;
  g.put(kTimelineLabelWidth, axis_y + 1, fmt::format("+{}", format_us(0)), Style::dim);
  const std::string end_label = fmt::format("+{}", format_us(model.trace().duration_us()));
  g.put(std::max(kTimelineLabelWidth, a.width - static_cast<int>(end_label.size())), axis_y + 1, end_label, Style::dim);
  g.set(kTimelineLabelWidth + cursor_col, axis_y, Cell{U'▲', Style::cursor});
  if (model.oom_cursor()) {
    const int oc = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(cols - 1), *model.oom_cursor() / step));
    if (oc != cursor_col) g.set(kTimelineLabelWidth + oc, axis_y, Cell{U'✗', Style::warn});
  }
  if (s.mark) {
    const int mc = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(cols - 1), *s.mark / step));
    if (mc != cursor_col) g.set(kTimelineLabelWidth + mc, axis_y, Cell{U'M', Style::emphasis});
  }
  std::string at = fmt::format("cursor: entry {}/{}  t +{}  allocated {}  reserved {}", s.cursor, model.entry_count(),
                               format_us(model.time_us_at(s.cursor) - model.time_us_at(0)),
                               format_bytes(model.allocated_at(s.cursor)), format_bytes(model.reserved_at(s.cursor)));
  if (s.mark) at += fmt::format("  │ M = mark at entry {}", *s.mark);
  g.put(1, axis_y + 2, at, Style::emphasis);
  if (s.cursor > 0) {
    const auto& e = model.trace().entries[s.cursor - 1];
    const std::string& site = model.site(e.site);
    g.put(1, axis_y + 3, fmt::format("last entry: {} {} at {}{}", forensics::to_string(e.action), format_bytes(e.size_bytes),
                                     hex(e.addr), site.empty() ? std::string() : "  " + site));
  }
}

// ---- live allocations ----

void draw_live(CellGrid& g, const Area& a, const ViewState& s, const ViewerModel& model, const MemoryState& state) {
  const auto groups = live_groups(model, state, s.group_by, s.sort_by, s.search);
  std::uint64_t shown_bytes = 0;
  std::size_t shown_count = 0;
  for (const auto& gr : groups) {
    shown_bytes += gr.bytes;
    shown_count += gr.count;
  }
  g.put(1, a.top, fmt::format("{} live blocks, {} │ by {} │ sorted by {}{}", shown_count, format_bytes(shown_bytes),
                              group_by_name(s.group_by),
                              s.sort_by == SortBy::bytes ? "bytes" : "count",
                              s.search.empty() ? std::string() : fmt::format(" │ /{}", s.search)));
  g.put(1, a.top + 1, fmt::format("{:>12}  {:>7}  {:>6}  {}", "bytes", "count", "share", group_by_name(s.group_by)),
        Style::dim);
  if (groups.empty()) {
    g.put(2, a.top + 2, s.search.empty() ? "no live allocations at this point" : "no group matches the search", Style::dim);
    return;
  }
  // The group list on top, the selected group's largest blocks below (a third of the rows).
  const int detail_rows = a.rows >= 12 ? (a.rows - 2) / 3 : 0;
  const int rows = std::max(1, a.rows - 2 - detail_rows);
  const std::size_t sel = std::min(s.live_row, groups.size() - 1);
  const std::size_t first = sel / static_cast<std::size_t>(rows) * static_cast<std::size_t>(rows);
  for (int r = 0; r < rows && first + static_cast<std::size_t>(r) < groups.size(); ++r) {
    const auto& gr = groups[first + static_cast<std::size_t>(r)];
    const double share = 100.0 * static_cast<double>(gr.bytes) / static_cast<double>(state.allocated_bytes ? state.allocated_bytes : 1);
    const int y = a.top + 2 + r;
    g.put(1, y, fmt::format("{:>12}  {:>7}  {:>5.1f}%  {}", format_bytes(gr.bytes), gr.count, share, gr.name));
    if (first + static_cast<std::size_t>(r) == sel) g.restyle(0, y, a.width, Style::selected);
  }
  if (detail_rows < 2) return;
  const auto& chosen = groups[sel];
  std::vector<std::pair<std::uint64_t, const BlockInfo*>> blocks;
  for (const auto& [addr, b] : state.blocks) {
    if (group_name(model, b, s.group_by) == chosen.name) blocks.emplace_back(addr, &b);
  }
  const auto shown = std::min(blocks.size(), static_cast<std::size_t>(detail_rows - 1));
  std::partial_sort(blocks.begin(), blocks.begin() + static_cast<long>(shown), blocks.end(),
                    [](const auto& x, const auto& y) { return x.second->size_bytes > y.second->size_bytes; });
  int y = a.top + 2 + rows;
  g.put(1, y++, fmt::format("Largest blocks of {} ({} of {})", chosen.name, shown, blocks.size()), Style::title);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& [addr, b] = blocks[i];
    const std::string age = b->entry == 0 && b->t_us == 0 ? "before the trace" : "age " + format_us(model.time_us_at(s.cursor) - b->t_us);
    g.put(2, y++, fmt::format("{:>11}  {:<16} {:<18} {}{}", format_bytes(b->size_bytes), hex(addr), age,
                              s.group_by == GroupBy::call_site ? std::string() : model.site(b->site),
                              b->op && s.group_by != GroupBy::op ? "  op " + model.op_name(b->op) : std::string()));
  }
}

// ---- pins ----

void draw_pins(CellGrid& g, const Area& a, const ViewState& s, const ViewerModel& model, const MemoryState& state) {
  const auto pins = pinned_segments(state);
  const PinCounts counts = pin_counts(state);
  std::uint64_t held = 0;
  for (const auto& p : pins) held += p.held_free_bytes;
  g.put(1, a.top, fmt::format("{} pinned segments hold {} free; {} filled, {} releasable", pins.size(),
                              format_bytes(held), counts.full, counts.releasable));
  if (pins.empty()) {
    g.put(2, a.top + 2, "no live block pins free memory at this point", Style::dim);
    return;
  }
  const int list_rows = std::max(1, (a.rows - 3) / 2);
  const std::size_t sel = std::min(s.pin_row, pins.size() - 1);
  // The scroll position: the selected row of the list, and arrows where rows are above or below.
  const std::size_t shown_first = sel / static_cast<std::size_t>(list_rows) * static_cast<std::size_t>(list_rows);
  const bool more_above = shown_first > 0;
  const bool more_below = shown_first + static_cast<std::size_t>(list_rows) < pins.size();
  g.put(1, a.top + 1,
        fmt::format("{:<16} {:>11} {:>11} {:>11} {:>7}  [{}/{}{}{}{}]", "segment", "size", "held free", "live",
                    "blocks", sel + 1, pins.size(), more_above || more_below ? " " : "", more_above ? "↑" : "",
                    more_below ? "↓" : ""),
        Style::dim);
  const std::size_t first = sel / static_cast<std::size_t>(list_rows) * static_cast<std::size_t>(list_rows);
  for (int r = 0; r < list_rows && first + static_cast<std::size_t>(r) < pins.size(); ++r) {
    const auto& p = pins[first + static_cast<std::size_t>(r)];
    const int y = a.top + 2 + r;
    const auto pool = model.pool_of(p.addr);
    g.put(1, y, fmt::format("{:<16} {:>11} {:>11} {:>11} {:>7}{}{}", hex(p.addr), format_bytes(p.segment.size_bytes), format_bytes(p.held_free_bytes),
                            format_bytes(p.live_bytes), p.blocks.size(), p.segment.expandable ? "  expandable" : "",
                            pool ? "  " + pool_marker(*pool) : std::string()));
    if (first + static_cast<std::size_t>(r) == sel) g.restyle(0, y, a.width, Style::selected);
  }
  const auto& p = pins[sel];
  int y = a.top + 2 + list_rows;
  g.put(1, y++, fmt::format("What pins {}: {} live block(s)", hex(p.addr), p.blocks.size()), Style::title);
  for (const auto& [addr, b] : p.blocks) {
    if (y >= a.top + a.rows) break;
    const std::string site = model.site(b->site).empty() ? std::string(forensics::kNotRecorded) : model.site(b->site);
    const std::string age = b->entry == 0 && b->t_us == 0 ? "before the trace" : "age " + format_us(model.time_us_at(s.cursor) - b->t_us);
    g.put(2, y++, fmt::format("+{:<12x} {:>11}  {:<18} {}", addr - p.addr, format_bytes(b->size_bytes), age, site));
  }
}

// ---- diff ----

void draw_diff(CellGrid& g, const Area& a, const ViewState& s, const ViewerModel& model, const MemoryState& state) {
  const ViewerModel* mb = &model;
  MemoryState other;
  std::string a_name, b_name;
  const MemoryState* sa = nullptr;
  const MemoryState* sb = nullptr;
  const ViewerModel* ma = &model;
  if (model.compare) {
    // Each side at its own cursor; ▸ marks the one the stepping keys move (b switches).
    const std::size_t b_cursor = s.compare_cursor.value_or(model.compare->initial_cursor());
    other = model.compare->state_at(b_cursor);
    a_name = fmt::format("{}A = {} at entry {}", s.diff_moves_b ? "" : "▸", model.source(), s.cursor);
    b_name = fmt::format("{}B = {} at entry {}", s.diff_moves_b ? "▸" : "", model.compare->source(), b_cursor);
    sa = &state;
    sb = &other;
    mb = model.compare.get();
  } else if (s.mark) {
    other = model.state_at(*s.mark);
    a_name = fmt::format("A = mark, entry {}", *s.mark);
    b_name = fmt::format("B = cursor, entry {}", s.cursor);
    sa = &other;
    sb = &state;
  } else {
    g.put(2, a.top, "Nothing to compare yet.", Style::dim);
    g.put(2, a.top + 1, "Press m to mark the cursor, then move it (, . [ ] p a o):", Style::dim);
    g.put(2, a.top + 2, "this view shows what changed between the mark and the cursor.", Style::dim);
    g.put(2, a.top + 3, "Or compare two files: gpumem view A --diff B", Style::dim);
    return;
  }
  g.put(1, a.top, a_name + "   vs   " + b_name, Style::title);
  auto total = [&](int y, std::string_view what, std::uint64_t va, std::uint64_t vb, bool bytes) {
    const auto d = static_cast<std::int64_t>(vb) - static_cast<std::int64_t>(va);
    g.put(2, y, fmt::format("{:<14} {:>12} → {:>12}   {}", what, bytes ? format_bytes(va) : std::to_string(va),
                            bytes ? format_bytes(vb) : std::to_string(vb), bytes ? format_delta_bytes(d) : fmt::format("{:+}", d)),
          d == 0 ? Style::normal : Style::emphasis);
  };
  total(a.top + 1, "allocated", sa->allocated_bytes, sb->allocated_bytes, true);
  total(a.top + 2, "reserved", sa->reserved_bytes, sb->reserved_bytes, true);
  total(a.top + 3, "segments", sa->segments.size(), sb->segments.size(), false);
  total(a.top + 4, "live blocks", sa->blocks.size(), sb->blocks.size(), false);
  const auto rows = diff_groups(*ma, *sa, *mb, *sb, s.group_by);
  g.put(1, a.top + 6, fmt::format("{:>12}  {:>12}  {:>12}  {:>13}  {}", "delta", "A bytes", "B bytes", "count A→B",
                                  group_by_name(s.group_by)),
        Style::dim);
  int y = a.top + 7;
  for (const auto& r : rows) {
    if (y >= a.top + a.rows) break;
    g.put(1, y++, fmt::format("{:>12}  {:>12}  {:>12}  {:>13}  {}", format_delta_bytes(r.delta_bytes()), format_bytes(r.bytes_a),
                              format_bytes(r.bytes_b), fmt::format("{}→{}", r.count_a, r.count_b), r.name),
          r.delta_bytes() > 0 ? Style::warn : Style::normal);
  }
  if (rows.empty()) g.put(2, y, "no differences in live allocations", Style::dim);
}

// ---- active memory over time ----

// The layers' glyphs and styles, biggest group first; "other" is dotted. Each glyph differs, so a
// monochrome screen tells the groups apart too.
constexpr char32_t kStackGlyph[kActiveTopGroups] = {U'█', U'▓', U'▒', U'░', U'▚', U'▞'};
constexpr Style kStackStyle[kActiveTopGroups] = {Style::stack_1, Style::stack_2, Style::stack_3,
                                                 Style::stack_4, Style::stack_5, Style::stack_6};
constexpr char32_t kOtherGlyph = U'·';

Cell slot_cell(const std::vector<ActiveSlot>& slots, std::size_t i) {
  if (slots[i].other || i >= kActiveTopGroups) return Cell{kOtherGlyph, Style::stack_other};
  return Cell{kStackGlyph[i], kStackStyle[i]};
}

// A duration at the precision a window of span_us needs: "+12.345 ms" below 10 ms, else as the
// title bar prints times ("+40.7 ms", "+2.345 s").
std::string format_window_us(std::int64_t us, std::int64_t span_us) {
  if (span_us < 10'000) return fmt::format("+{:.3f} ms", static_cast<double>(us) / 1e3);
  return "+" + format_us(us);
}

std::string format_column_width(double us) {
  if (us >= 1e6) return fmt::format("{:.3f} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.1f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

// The name cut from the left to `width` columns ("…" + its end: the line and function stay).
std::string fit_left(const std::string& name, int width) {
  const std::u32string u = decode_utf8(name);
  if (static_cast<int>(u.size()) <= width || width < 2) return name;
  std::string out = "…";
  for (std::size_t i = u.size() - static_cast<std::size_t>(width - 1); i < u.size(); ++i) append_utf8(out, u[i]);
  return out;
}

// Writes the first of `candidates` that fits in the row's width (else the last, clipped).
void put_longest_fitting(CellGrid& g, int x, int y, std::initializer_list<std::string> candidates, Style style) {
  const std::string* chosen = nullptr;
  for (const auto& c : candidates) {
    chosen = &c;
    if (x + static_cast<int>(decode_utf8(c).size()) <= g.width()) break;
  }
  if (chosen) g.put(x, y, *chosen, style);
}

void draw_active(CellGrid& g, const Area& a, const ViewState& s, const ViewerModel& model) {
  if (model.entry_count() == 0) {
    g.put(2, a.top, "no entries in this trace: nothing to draw over time", Style::dim);
    return;
  }
  const ActiveMemory& am = model.active_memory(s.group_by);
  const auto& slots = am.slots();
  const TimeWindow w = active_window(s, model);
  const char* by = group_by_name(s.group_by);

  // Header: the grouping, how many groups, the time per column, the zoom.
  const std::string groups =
      slots.empty()              ? std::string("no allocations")
      : am.nothing_recorded()    ? fmt::format("one group: the file records no {}", s.group_by == GroupBy::op ? "ops" : "call sites")
      : slots.back().other       ? fmt::format("top {} of {} groups + other", slots.size() - 1, am.group_count())
                                 : fmt::format("{} group{}", slots.size(), slots.size() == 1 ? "" : "s");
  const std::string column = format_column_width(static_cast<double>(w.span_us) / w.columns);
  const std::string zoom = s.active_zoom == 0 ? std::string("whole trace") : fmt::format("zoom {}x", std::uint64_t{1} << std::min(s.active_zoom, 62));
  put_longest_fitting(g, 1, a.top,
                      {fmt::format("live by {} │ {} │ {}", by, groups, zoom), fmt::format("by {} │ {} │ {}", by, groups, zoom),
                       fmt::format("by {} │ {}", by, groups)},
                      Style::title);

  const int legend_rows = std::max<int>(1, static_cast<int>(slots.size()));
  // The heading, axis, time and cursor rows always fit (the smallest screen leaves 5 rows); the
  // chart takes what the legend leaves, at least one row; legend rows that do not fit are cut.
  const int chart_rows = std::max(1, a.rows - 4 - legend_rows);
  const int chart_top = a.top + 1;
  const int x0 = kTimelineLabelWidth;

  // The columns: each bucket's moment (its peak or its end) and its peak bytes.
  const std::vector<Bucket> buckets = window_buckets(model, w, s.active_moment);
  std::vector<std::size_t> moments;
  moments.reserve(buckets.size());
  std::uint64_t top = 1;
  for (const auto& b : buckets) {
    moments.push_back(b.shown);
    top = std::max(top, b.peak_bytes);
  }
  const std::vector<ActiveSample> samples = am.sample(moments);
  g.put(0, chart_top, fmt::format("{:>10}", format_bytes(top)), Style::dim);
  if (chart_rows > 1) g.put(0, chart_top + chart_rows - 1, fmt::format("{:>10}", "0"), Style::dim);

  const std::int64_t t_cursor = model.cursor_elapsed_us(s.cursor);
  const std::int64_t cursor_col = w.column_of(t_cursor);
  const auto rows_u = static_cast<std::uint64_t>(chart_rows);
  for (int c = 0; c < w.columns && static_cast<std::size_t>(c) < samples.size(); ++c) {
    const ActiveSample& smp = samples[static_cast<std::size_t>(c)];
    const std::uint64_t bucket_peak = buckets[static_cast<std::size_t>(c)].peak_bytes;
    // Row r (0 at the bottom) shows the slot whose stacked range holds the row's middle:
    // cumulative * rows > (r + 1/2) * top.
    int filled = 0;
    std::size_t k = 0;
    std::uint64_t cumulative = 0;
    for (int r = 0; r < chart_rows; ++r) {
      const std::uint64_t middle2 = (2 * static_cast<std::uint64_t>(r) + 1) * top;  // twice the row's middle * rows
      while (k < slots.size() && 2 * (cumulative + smp.slot_bytes[k]) * rows_u <= middle2) cumulative += smp.slot_bytes[k++];
      if (k >= slots.size()) break;
      g.set(x0 + c, chart_top + chart_rows - 1 - r, slot_cell(slots, k));
      ++filled;
    }
    if (filled == 0 && smp.total_bytes > 0) {
      // Less than half a row: a sliver of the biggest slot, so that the column is not empty.
      const auto big = static_cast<std::size_t>(std::max_element(smp.slot_bytes.begin(), smp.slot_bytes.end()) - smp.slot_bytes.begin());
      g.set(x0 + c, chart_top + chart_rows - 1, Cell{U'▁', slot_cell(slots, big).style});
      filled = 1;
    }
    // The bucket's peak, where it rose above the moment shown (bucket ends only).
    const auto peak_row = static_cast<int>((bucket_peak * rows_u + top - 1) / top) - 1;
    if (bucket_peak > smp.total_bytes && peak_row >= filled && peak_row < chart_rows) g.set(x0 + c, chart_top + chart_rows - 1 - peak_row, Cell{U'▔', Style::dim});
    if (c == cursor_col) {
      for (int r = filled; r < chart_rows; ++r) {
        const int y = chart_top + chart_rows - 1 - r;
        if (g.at(x0 + c, y).ch == U' ') g.set(x0 + c, y, Cell{U'│', Style::cursor});
      }
    }
  }

  // Axis: the cursor (or where it lies when outside the window), the OOM, the mark.
  const int axis_y = chart_top + chart_rows;
  const auto col_of_cursor = [&](std::size_t applied) { return w.column_of(model.cursor_elapsed_us(applied)); };
  if (model.oom_cursor()) {
    const std::int64_t oc = col_of_cursor(*model.oom_cursor());
    if (oc >= 0 && oc < w.columns && oc != cursor_col) g.set(x0 + static_cast<int>(oc), axis_y, Cell{U'✗', Style::warn});
  }
  if (s.mark) {
    const std::int64_t mc = col_of_cursor(*s.mark);
    if (mc >= 0 && mc < w.columns && mc != cursor_col) g.set(x0 + static_cast<int>(mc), axis_y, Cell{U'M', Style::emphasis});
  }
  if (cursor_col < 0) {
    g.put(x0, axis_y, "◀ cursor", Style::cursor);
  } else if (cursor_col >= w.columns) {
    g.put(x0 + w.columns - 8, axis_y, "cursor ▶", Style::cursor);
  } else {
    g.set(x0 + static_cast<int>(cursor_col), axis_y, Cell{U'▲', Style::cursor});
  }
  // Time: the window's ends, and between them what one column is and which moment it shows.
  const std::string from = format_window_us(w.start_us, w.span_us);
  const std::string to = format_window_us(w.end_us(), w.span_us);
  const int from_end = g.put(x0, axis_y + 1, from, Style::dim);
  const int to_x = std::max(from_end + 1, a.width - static_cast<int>(to.size()));
  g.put(to_x, axis_y + 1, to, Style::dim);
  const char* other_moment = bucket_moment_name(s.active_moment == BucketMoment::peak ? BucketMoment::end : BucketMoment::peak);
  for (const std::string& mid : {fmt::format("1 column = {}, shown at its {} (e: {})", column, bucket_moment_name(s.active_moment), other_moment),
                                 fmt::format("column {}, its {}", column, bucket_moment_name(s.active_moment))}) {
    const int len = static_cast<int>(decode_utf8(mid).size());
    if (len + 2 <= to_x - from_end) {
      g.put(from_end + (to_x - from_end - len) / 2, axis_y + 1, mid, Style::dim);
      break;
    }
  }

  // The cursor's moment, then the legend: each slot at the cursor, its share and its own peak.
  const std::vector<std::uint64_t> at_cursor = am.live_at(s.cursor);
  std::uint64_t total = 0;
  for (auto b : at_cursor) total += b;
  const std::string when = fmt::format("entry {}/{}, t +{}", s.cursor, model.entry_count(), format_us(t_cursor));
  put_longest_fitting(g, 1, axis_y + 2,
                      {fmt::format("at the cursor ({}): allocated {}{}", when, format_bytes(total),
                                   s.mark ? fmt::format("  │ M = mark at entry {}", *s.mark) : std::string()),
                       fmt::format("at the cursor ({}): allocated {}", when, format_bytes(total))},
                      Style::emphasis);
  if (slots.empty()) {
    g.put(2, axis_y + 3, "no allocation in this trace", Style::dim);
    return;
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int y = axis_y + 3 + static_cast<int>(i);
    if (y >= a.top + a.rows) break;
    const Cell glyph = slot_cell(slots, i);
    g.set(1, y, glyph);
    g.set(2, y, glyph);
    const std::string numbers = fmt::format(" {:>10} {:>4}  peak {:>10}  ", format_bytes(at_cursor[i]),
                                            forensics::format_share(at_cursor[i], total), format_bytes(slots[i].peak_bytes));
    const int x = g.put(3, y, numbers);
    const std::string name = slots[i].other ? fmt::format("other ({} groups)", slots[i].group_count) : slots[i].name;
    g.put(x, y, fit_left(name, a.width - x), slots[i].other ? Style::dim : Style::normal);
  }
}

void draw_help(CellGrid& g, const Area& a) {
  int y = a.top;
  std::string_view text = kHelpKeys;
  while (!text.empty() && y < a.top + a.rows) {
    const auto nl = text.find('\n');
    g.put(2, y++, text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

}  // namespace

const char* key_help_text() noexcept { return kHelpKeys.data(); }

CellGrid render(const ViewState& s, const ViewerModel& model, Size size) {
  CellGrid g(size);
  if (size.width < kMinScreen.width || size.height < kMinScreen.height) {
    g.put(0, 0, fmt::format("terminal too small: {}x{}, need {}x{}", size.width, size.height, kMinScreen.width, kMinScreen.height));
    g.put(0, 1, "enlarge it, or q to quit");
    return g;
  }
  draw_frame(g, s, model);
  const Area a{2, size.height - 3, size.width};
  if (s.help) {
    draw_help(g, a);
    return g;
  }
  const std::size_t cursor = std::min(s.cursor, model.entry_count());
  if (s.view == View::timeline) {
    draw_timeline(g, a, s, model);
    return g;
  }
  if (s.view == View::active) {
    draw_active(g, a, s, model);
    return g;
  }
  const MemoryState state = model.state_at(cursor);
  switch (s.view) {
    case View::summary: draw_summary(g, a, s, model, state); break;
    case View::segments: draw_segments(g, a, s, model, state); break;
    case View::live: draw_live(g, a, s, model, state); break;
    case View::pins: draw_pins(g, a, s, model, state); break;
    case View::diff: draw_diff(g, a, s, model, state); break;
    case View::timeline:
    case View::active: break;
  }
  return g;
}

}  // namespace gpumem::view
