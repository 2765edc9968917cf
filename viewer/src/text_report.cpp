#include "gpumem/view/text_report.h"

#include <algorithm>

#include "gpumem/view/render.h"
#include "gpumem/view/view_state.h"

namespace gpumem::view {

std::string text_report(const ViewerModel& model, int width, std::optional<std::size_t> cursor) {
  width = std::max(width, kMinScreen.width);
  model.wait_for_oom_report();
  std::string out;
  const struct {
    View view;
    int height;
  } screens[] = {{View::summary, 70}, {View::timeline, 22}, {View::live, 24},
                 {View::pins, 24},    {View::segments, 20}, {View::active, 24},
                 {View::diff, 20}};
  for (const auto& sc : screens) {
    if (sc.view == View::diff && !model.compare) continue;
    ViewState s = initial_state(model, Size{width, sc.height});
    if (cursor) s.cursor = std::min(*cursor, model.entry_count());
    s.view = sc.view;
    const CellGrid g = render(s, model, s.screen);
    // Drop the tab row and the help line: they are for interactive use.
    out += g.row_text(0) + "\n";
    for (int y = 2; y < g.height() - 1; ++y) out += g.row_text(y) + "\n";
    out += "\n";
  }
  // Trailing blank lines of each screen make the report long; squeeze runs of blank lines.
  std::string squeezed;
  int blanks = 0;
  std::size_t pos = 0;
  while (pos < out.size()) {
    const std::size_t nl = out.find('\n', pos);
    const std::string_view line(out.data() + pos, nl - pos);
    blanks = line.empty() ? blanks + 1 : 0;
    if (blanks <= 1) {
      squeezed.append(line);
      squeezed += '\n';
    }
    pos = nl + 1;
  }
  return squeezed;
}

}  // namespace gpumem::view
