// render(): golden frames of every view on the handmade trace, at a fixed size.
#include <cstdlib>

#include <fmt/format.h>

#include "catch.h"
#include "gpumem/view/active_memory.h"
#include "gpumem/view/render.h"
#include "viewer_test_support.h"

using namespace gpumem::view;
using namespace gpumem::view::testing;

namespace {

constexpr Size kScreen{80, 24};

std::string U8(const char* s) { return s; }

CellGrid frame(View v, void (*tweak)(ViewState&) = nullptr) {
  static const ViewerModel model = ViewerModel::from(handmade_trace());
  ViewState s = initial_state(model, kScreen);
  s.view = v;
  if (tweak) tweak(s);
  return render(s, model, kScreen);
}

}  // namespace

TEST_CASE("golden: summary opens on the OOM verdict", "[viewer][render]") {
  const auto g = frame(View::summary);
  check_golden("summary", g.to_text());
  CHECK(g.row_text(2) == " OOM verdict");
  CHECK(g.at(1, 2).style == Style::warn);
  CHECK(g.at(0, 0).style == Style::title);
  CHECK(g.at(0, 23).style == Style::help);
}

TEST_CASE("golden: summary of a handmade snapshot (exact block sizes)", "[viewer][render]") {
  const auto model = ViewerModel::from(handmade_trace(), handmade_snapshot());
  REQUIRE(model.is_snapshot());
  ViewState s = initial_state(model, Size{80, 40});
  const auto g = render(s, model, s.screen);
  check_golden("summary_snapshot", g.to_text());
  // The snapshot's 3.5 MiB block for c replaces the rounded request: 7.5 MiB allocated.
  CHECK(g.to_text().find("allocated                 7.50 MiB") != std::string::npos);
  CHECK(g.to_text().find("largest free extent       1.50 MiB") != std::string::npos);
  s.view = View::segments;
  check_golden("segments_snapshot", render(s, model, Size{80, 24}).to_text());
}

TEST_CASE("golden: segment map", "[viewer][render]") {
  check_golden("segments", frame(View::segments).to_text());
  // Zoomed in, cursor on the freed 1 MiB gap (extent 2 of 6): it is an inactive split.
  const auto g = frame(View::segments, [](ViewState& s) {
    s.zoom_in = 2;
    s.extent_index = 1;
  });
  check_golden("segments_zoom", g.to_text());
  int selected = 0;
  for (int y = 0; y < g.height(); ++y) {
    for (int x = 0; x < g.width(); ++x) {
      if (g.at(x, y).style == Style::selected) {
        ++selected;
        CHECK(g.at(x, y).ch == U'▒');
      }
    }
  }
  CHECK(selected > 0);
}

TEST_CASE("golden: timeline with the cursor at the OOM", "[viewer][render]") {
  check_golden("timeline", frame(View::timeline).to_text());
}

TEST_CASE("golden: live allocations, searched", "[viewer][render]") {
  check_golden("live", frame(View::live).to_text());
  const auto g = frame(View::live, [](ViewState& s) {
    s.group_by = GroupBy::function;
    s.search = "STEP";
  });
  check_golden("live_search", g.to_text());
}

TEST_CASE("golden: what pins the segments", "[viewer][render]") {
  check_golden("pins", frame(View::pins).to_text());
}

TEST_CASE("golden: diff of a mark and the cursor", "[viewer][render]") {
  check_golden("diff_empty", frame(View::diff).to_text());
  check_golden("diff", frame(View::diff, [](ViewState& s) { s.mark = 4; }).to_text());
}

TEST_CASE("help screen and a screen too small", "[viewer][render]") {
  const auto help = frame(View::live, [](ViewState& s) { s.help = true; });
  CHECK(help.to_text().find("Trace cursor") != std::string::npos);
  // At 80x24 the whole key list fits: its last line shows, and no line is cut at the edge.
  CHECK(help.to_text().find("this help (any key closes it)") != std::string::npos);
  for (int y = 2; y < help.height() - 1; ++y) CHECK(help.at(help.width() - 1, y).ch == U' ');
  static const ViewerModel model = ViewerModel::from(handmade_trace());
  const auto tiny = render(initial_state(model, Size{20, 5}), model, Size{20, 5});
  CHECK(tiny.row_text(0).rfind("terminal too small", 0) == 0);
}

TEST_CASE("every view renders an empty trace", "[viewer][render]") {
  const auto model = ViewerModel::from(gpumem::forensics::Trace{});
  for (int v = 0; v < kViewCount; ++v) {
    ViewState s = initial_state(model, kScreen);
    s.view = static_cast<View>(v);
    const auto g = render(s, model, kScreen);
    CHECK(g.row_text(0).find("entry 0/0") != std::string::npos);
  }
}

TEST_CASE("the grid clips and decodes UTF-8", "[viewer][render]") {
  CellGrid g(Size{5, 1});
  CHECK(g.put(3, 0, "█▒░xyz") == 5);
  CHECK(g.row_text(0) == "   █▒");
  CHECK(decode_utf8("a\xff") == U"a\uFFFD");
  // Wide characters take two columns; one that would be cut in half is left out.
  CellGrid w(Size{6, 1});
  CHECK(w.put(0, 0, "模型.py") == 6);
  CHECK(w.at(1, 0).ch == kWideTail);
  CHECK(w.row_text(0) == "模型.p");
  CHECK(w.put(0, 0, "a模型", Style::normal, 4) == 3);
}

TEST_CASE("golden: an expandable segment with an unmapped hole and a partly used granule", "[viewer][render]") {
  Trace t;
  t.source = "expandable.csv";
  add(t, TraceAction::segment_map, kSeg1, 8 * kMiB, 1);
  add(t, TraceAction::alloc, kSeg1, 3 * kMiB, 2, "a.py:1:f");        // granule 2 half used
  add(t, TraceAction::alloc, kSeg1 + 6 * kMiB, 2 * kMiB, 3, "a.py:2:g");
  add(t, TraceAction::segment_unmap, kSeg1 + 4 * kMiB, 2 * kMiB, 4);  // the fully free granule 3
  const auto model = ViewerModel::from(t);
  ViewState s = initial_state(model, kScreen);
  s.view = View::segments;
  const auto g = render(s, model, kScreen);
  check_golden("segments_expandable", g.to_text());
  std::string text;  // the map rows, without the legend
  for (int y = 4; y < g.height() - 1; ++y) text += g.row_text(y);
  CHECK(text.find(U8("▓")) != std::string::npos);
  CHECK(text.find(U8("·")) != std::string::npos);
  CHECK(text.find(U8("░")) == std::string::npos);  // nothing free is wholly unused and mapped
}

TEST_CASE("golden: active memory over time at 80 columns", "[viewer][render][active]") {
  const auto g = frame(View::active);
  check_golden("active", g.to_text());
  CHECK(g.row_text(2) == " live by call site │ 3 groups │ whole trace");
  const std::string text = g.to_text();
  for (const char* name : {"model.py:10:forward", "optim.py:5:step", "model.py:20:backward"}) CHECK(text.find(name) != std::string::npos);
  CHECK(text.find("at the cursor (entry 9/9") != std::string::npos);
  // The stack's layers: the biggest group is solid and at the bottom.
  // (the chart's 14 rows are rows 3-16 of the 24: the header, then 4 rows of axis, time, cursor and
  // 3 of legend below)
  CHECK(g.at(kTimelineLabelWidth + timeline_columns(kScreen) - 1, 16).ch == U'█');
  CHECK(g.at(kTimelineLabelWidth + timeline_columns(kScreen) - 1, 17).ch == U'▲');
}

TEST_CASE("the Active view at 80 columns on the repository's ResNet-50 trace keeps header and legend whole", "[viewer][render][active]") {
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  REQUIRE(src != nullptr);
  const auto model = ViewerModel::open(std::string(src) + "/traces/resnet50.native.trace.csv.gz");
  for (const auto& tweak : {+[](ViewState&) {}, +[](ViewState& s) {
                              s.active_zoom = 3;
                              s.active_moment = BucketMoment::end;
                              s.group_by = GroupBy::function;
                            }}) {
    ViewState s = initial_state(model, kScreen);
    s.view = View::active;
    tweak(s);
    const auto g = render(s, model, kScreen);
    const std::string text = g.to_text();
    INFO(text);
    const ActiveMemory& am = model.active_memory(s.group_by);
    REQUIRE(am.slots().size() >= 5);
    const std::string groups = am.slots().back().other ? fmt::format("top 6 of {} groups + other", am.group_count())
                                                       : fmt::format("{} groups", am.group_count());
    CHECK(g.row_text(2).find(fmt::format("live by {} │ {} │ ", group_by_name(s.group_by), groups)) == 1);
    for (const auto& slot : am.slots()) CHECK(text.find(slot.other ? "other (" : "  " + slot.name) != std::string::npos);
    CHECK(text.find("1 column = ") != std::string::npos);
    CHECK(text.find("at the cursor (entry ") != std::string::npos);
    // The legend's last row sits above the help line.
    const std::string last = am.slots().back().other ? "other (" : am.slots().back().name;
    CHECK(g.row_text(kScreen.height - 2).find(last) != std::string::npos);
  }
}

TEST_CASE("the Active view on the smallest screen stays inside its area", "[viewer][render][active]") {
  static const ViewerModel model = ViewerModel::from(handmade_trace());
  ViewState s = initial_state(model, kMinScreen);
  s.view = View::active;
  const auto g = render(s, model, kMinScreen);
  INFO(g.to_text());
  // The help line (the last row) is the frame's, whole.
  for (int x = 0; x < g.width(); ++x) CHECK(g.at(x, g.height() - 1).style == Style::help);
  CHECK(g.to_text().find("at the cursor") != std::string::npos);
}
